"""GPU check: the estimate of record.py's training (batch 8, 6 steps, bf16
autocast, AdamW) made with FakeTensorMode on CUDA, against its real
recording on an H200 (train_default.pickle and .json).

    python3 scripts/gpu_estimate_check.py --vramscope BIN --recordings DIR [--python P] [--work DIR] [--estimate FILE] [--limit S]

Prints a table: the alloc requests (how many, how many in the same order),
peak allocated (the real allocator's figure against the estimate's replay:
within 2 %), peak reserved, and memory needed (the what-if's search on the
real recording and on the estimate: within 5 %); then the sizes only one of
them asked for, with where; last, its verdict (scripts/gpucheck.py).
Exit status 1 when a bound is not met. Standard library only; run by
scripts/gpu-check.sh.
"""

import argparse
import collections
import difflib
import json
import os
import pickle
import subprocess
import sys
import tempfile

import gpucheck as g

HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = os.path.join(os.path.dirname(HERE), "live", "python")
H200 = 150109880320  # the recording's device (PROVENANCE.md)


def gib(n):
    return "%.2f GiB" % (n / (1 << 30))


def allocs(path):
    """The alloc entries of device 0: (size, innermost frame)."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    out = []
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            fr = e.get("frames") or []
            where = "%s:%s %s" % (os.path.basename(fr[0]["filename"]), fr[0]["line"], fr[0]["name"]) if fr else "(no frames: autograd's thread)"
            out.append((e["size"], where))
    return out, snap


def vramscope_json(binary, *args):
    out = subprocess.run([binary, *args, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vramscope", required=True)
    p.add_argument("--recordings", required=True, help="shared/testdata/pytorch-2.11")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--work", default=None)
    p.add_argument("--estimate", help="compare this estimate rather than make one")
    p.add_argument("--limit", type=float, default=0, help="seconds the estimate may take")
    a = p.parse_args()
    work = a.work or tempfile.mkdtemp()
    os.makedirs(work, exist_ok=True)
    real_pickle = os.path.join(a.recordings, "train_default.pickle")
    with open(os.path.join(a.recordings, "train_default.json")) as f:
        facts = json.load(f)

    # record.py's train() as s_train runs it, without its recording.
    driver = os.path.join(work, "train_default.py")
    with open(driver, "w") as f:
        f.write("import sys\nsys.path.insert(0, %r)\nimport record\nrecord.train(steps=6, batch=8)\n" % os.path.abspath(a.recordings))
    est_pickle = a.estimate or os.path.join(work, "estimate.pickle")
    env = dict(os.environ, PYTHONPATH=HELPER + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the recording's settings: the defaults
    cmd = [a.python, "-m", "vramscope_watch", "--estimate", "--stand-in", "fake", "--steps", "6", "--device-memory", str(H200),
           "--capability", "9.0", "--out", est_pickle, driver]
    if not a.estimate:
        status, out = g.Log(os.path.join(work, "estimate-commands.log")).run(
            cmd, env=env, timeout=g.Deadline(a.limit).left(keep=15) if a.limit else None)
        if status != 0:
            print(out[-3000:])
            return g.verdict(g.FAIL, "the estimate did not finish (status %d%s)" % (status, ", out of time" if status == 124 else ""))

    real, _ = allocs(real_pickle)
    est, snap = allocs(est_pickle)
    mark = snap.get("vramscope_estimate", {"stand_in": "(not an estimate)", "torch": "?", "seconds": 0})
    same = sum(b.size for b in difflib.SequenceMatcher(None, [s for s, _ in real], [s for s, _ in est], autojunk=False).get_matching_blocks())

    real_peak = facts["memory_stats"]["allocated_bytes.all.peak"]
    real_reserved = facts["memory_stats"]["reserved_bytes.all.peak"]
    est_replay = vramscope_json(a.vramscope, "replay", est_pickle, "--capacity", str(H200))
    est_peak = est_replay["stats"]["allocated_bytes.all.peak"]
    est_reserved = est_replay["stats"]["reserved_bytes.all.peak"]
    real_needed = vramscope_json(a.vramscope, "whatif", real_pickle, "--capacity", str(H200))[0]["capacity_needed"]
    est_needed = vramscope_json(a.vramscope, "whatif", est_pickle, "--capacity", str(H200))[0]["capacity_needed"]

    def diff(x, y):
        return (y - x) / x * 100 if x else float("inf")

    rows = [
        ("alloc requests", str(len(real)), str(len(est)), "%+.1f %%" % diff(len(real), len(est)), "", ""),
        ("  in the same order", "", "%d (%.1f %%)" % (same, 100 * same / max(len(real), 1)), "", "", ""),
        ("peak allocated", gib(real_peak), gib(est_peak), "%+.2f %%" % diff(real_peak, est_peak), "2 %",
         "ok" if abs(diff(real_peak, est_peak)) <= 2 else "FAIL"),
        ("peak reserved", gib(real_reserved), gib(est_reserved), "%+.2f %%" % diff(real_reserved, est_reserved), "", ""),
        ("memory needed", gib(real_needed), gib(est_needed), "%+.2f %%" % diff(real_needed, est_needed), "5 %",
         "ok" if abs(diff(real_needed, est_needed)) <= 5 else "FAIL"),
    ]
    print("estimated with %s, PyTorch %s, in %.1f s; real: record.py train --steps 6 on an H200, PyTorch 2.11"
          % (mark["stand_in"], mark["torch"], mark["seconds"]))
    head = ("", "REAL", "ESTIMATE", "DIFFERENCE", "BOUND", "")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(6)]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())

    # What differs, and where: sizes one of them asked for more often.
    rc, ec = collections.Counter(s for s, _ in real), collections.Counter(s for s, _ in est)
    where = {}
    for s, w in real + est:
        where.setdefault(s, w)
    for title, d in (("asked for by the real run only", rc - ec), ("asked for by the estimate only", ec - rc)):
        if d:
            print("\nsizes %s (count × size, first at):" % title)
            for s, n in sorted(d.items(), key=lambda kv: -kv[0] * kv[1])[:12]:
                print("  %4d × %12d B  %s" % (n, s, where[s]))
    failed = [r[0] for r in rows if r[5] == "FAIL"]
    if failed:
        return g.verdict(g.FAIL, "%s beyond the bound (%s)" % (" and ".join(failed), ", ".join(r[3] for r in rows if r[5] == "FAIL")))
    return g.verdict(g.OK, "peak allocated %s, memory needed %s against train_default.pickle; %d of %d requests in the same order"
                     % (rows[2][3], rows[4][3], same, len(real)))


if __name__ == "__main__":
    sys.exit(main())
