"""GPU check: where this card's driver puts the caching allocator's
segments (issue 39), on recordings made afresh here by record.py.

    python3 scripts/gpu_placement_check.py --recordings DIR --rec DIR --sim-test BIN --replay-test BIN
        [--python P] [--work DIR] [--limit S]

Records record.py frag (the fragmenting stream: its bisection of the memory
it needs, and a recording that runs out of memory 2 MiB under it) and
record.py train --steps 6 (train_default) into --rec, unless there already,
then runs the tests that hold the simulated driver to the H200's recordings
on them as well (VRAMSCOPE_FRESH_RECORDINGS): TestPlacementAsRecorded (every
cudaMalloc after start-up where the driver put it) and TestFragStreamNeeded
(each probe of the bisection runs or fails as simulated; the memory needed
equal). The fragmenting stream decides the verdict; train_default's
placements rest on allocations of the driver's own that were read off the
H200's run, so it is shown, not counted.
"""

import argparse
import os
import re
import sys

import gpucheck as g


def placement_line(logs):
    """What TestPlacementAsRecorded said of a recording: how many
    cudaMallocs landed where recorded, or its first complaint."""
    for l in logs:
        m = re.search(r"(\d+) cudaMallocs after the first after start-up where the driver put them, (\d+) explained misses, (\d+) unseen", l)
        if m:
            return "%s placed, %s misses, %s unseen" % m.groups()
    said = [l.split(": ", 1)[-1] for l in logs if ".go:" in l]
    if not said:
        return "-"
    return said[0][:90] + (" (+%d more)" % (len(said) - 1) if len(said) > 1 else "")


def probes_line(logs, probes):
    """What TestFragStreamNeeded's fresh subtest said: the probes that ran
    as simulated, or what differed."""
    differ = [l.split(": ", 1)[-1] for l in logs if "default settings under" in l]
    said = [l.split(": ", 1)[-1] for l in logs if ".go:" in l and "probes as the real" not in l]
    if differ:
        return "%d of %d differ: %s" % (len(differ), probes, differ[0][:80])
    if said:
        return said[0][:90]
    return "%d of %d as simulated" % (probes, probes) if any("probes as the real" in l for l in logs) else "-"


def own_errors(logs):
    """Whether a test complained itself, not through its subtests."""
    return any(".go:" in l for l in logs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--recordings", required=True, help="shared/testdata/pytorch-2.11")
    p.add_argument("--rec", required=True, help="where record.py's new recordings go (or are)")
    p.add_argument("--sim-test", required=True, help="go test -c ./gpu/sim")
    p.add_argument("--replay-test", required=True, help="go test -c ./replay")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--work", default=None)
    p.add_argument("--limit", type=float, default=0)
    a = p.parse_args()
    dl = g.Deadline(a.limit)
    log = g.Log(os.path.join(a.work or a.rec, "placement-commands.log"))

    whys = [g.record(log, a.python, a.recordings, a.rec, "frag", "frag_default", timeout=dl.left(keep=30)),
            g.record(log, a.python, a.recordings, a.rec, "train", "train_default", "--steps", "6", timeout=dl.left(keep=20))]
    fresh = os.path.join(a.rec, "fresh")
    have = [f for f in ("frag_default_oom.pickle", "frag_default.json", "train_default.pickle")
            if os.path.exists(os.path.join(a.rec, f))]
    if not have:
        return g.verdict(g.FAIL, "; ".join(w for w in whys if w) or "no recordings")
    g.copy_into(fresh, *(os.path.join(a.rec, f) for f in have))
    env = dict(os.environ, VRAMSCOPE_FRESH_RECORDINGS=os.path.abspath(fresh))
    _, out = log.run([os.path.abspath(a.sim_test), "-test.run", "^TestPlacementAsRecorded$", "-test.v", "-test.count=1"],
                     cwd=os.path.join(g.ROOT, "gpu", "sim"), env=env, timeout=dl.left(keep=5))
    sim = g.go_tests(out)
    _, out = log.run([os.path.abspath(a.replay_test), "-test.run", "^TestFragStreamNeeded$", "-test.v", "-test.count=1"],
                     cwd=os.path.join(g.ROOT, "replay"), env=env, timeout=dl.left(keep=2))
    stream = g.go_tests(out)

    h200 = g.load_json(os.path.join(a.recordings, "frag_default.json"))
    here = g.load_json(os.path.join(a.rec, "frag_default.json")) if "frag_default.json" in have else {}

    def fact(d, *path):
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        return d

    def result(tests, name):
        return tests.get(name, ("not run", [], 0))[:2]

    rows = []
    for label, path in (("frag: peak allocated, no limit", ("peak_allocated",)),
                        ("frag: peak reserved, no limit", ("peak_reserved_unlimited",)),
                        ("frag: memory needed (bisection)", ("bisect", "needed")),
                        ("frag: its OOM 2 MiB under that, request", ("oom", "oom_op"))):
        x, y = fact(h200, *path), fact(here, *path)
        rows.append((label, g.num(x) if x is not None else "-", g.num(y) if y is not None else "-",
                     "same" if x == y else "differs"))
    st, logs = result(stream, "TestFragStreamNeeded/fresh")
    hst, hlogs = result(stream, "TestFragStreamNeeded")
    if hst == "FAIL" and not own_errors(hlogs):
        hst = "PASS"  # it failed through its fresh subtest only
    rows.append(("frag: bisection's probes", "%d of %d as simulated" % (len(h200["probes"]), len(h200["probes"])),
                 probes_line(logs, len(here.get("probes", []))), "%s, %s" % (hst, st)))
    placed = {}
    for name, note in (("frag_default_oom.pickle", ""), ("train_default.pickle", " (shown only)")):
        hs, hl = result(sim, "TestPlacementAsRecorded/" + name)
        fs, fl = result(sim, "TestPlacementAsRecorded/fresh/" + name)
        placed[name] = fs
        rows.append((name.split(".")[0] + ": cudaMallocs" + note, placement_line(hl), placement_line(fl), "%s, %s" % (hs, fs)))
    print("the fragmenting stream (record.py frag_ops(), 11,889 requests) and GPT training (batch 8, 6 steps),")
    print("recorded on the H200 (../shared) and afresh on this card, and the simulated driver's tests on each")
    g.table(("", "H200 (SHARED)", "THIS CARD (FRESH)", "TESTS"), rows)

    failed = [w for w in whys if w]
    if placed["frag_default_oom.pickle"] != "PASS":
        failed.append("frag's cudaMallocs not where the driver put them (%s)" % placed["frag_default_oom.pickle"])
    if st != "PASS":
        failed.append("the fragmenting stream's probes or memory needed not as simulated (%s)" % st)
    if hst != "PASS":
        failed.append("TestFragStreamNeeded %s on ../shared's figures" % hst)
    for t in ("TestPlacementAsRecorded", "TestFragStreamNeeded"):
        for n, (w, _, _) in (sim | stream).items():
            if n.startswith(t + "/") and "/fresh" not in n and w != "PASS":
                failed.append("%s %s on ../shared's recording" % (n, w))
    if failed:
        return g.verdict(g.FAIL, "; ".join(failed))
    note = "" if placed["train_default.pickle"] == "PASS" else "; train_default placed otherwise (%s, shown only)" % placed["train_default.pickle"]
    return g.verdict(g.OK, "the fragmenting stream placed and bisected on this card as simulated (memory needed %s B)%s"
                     % (g.num(fact(here, "bisect", "needed") or 0), note))


if __name__ == "__main__":
    sys.exit(main())
