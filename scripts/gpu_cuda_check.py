"""GPU check: the CUDA backend on the real driver (#29).

    python3 scripts/gpu_cuda_check.py --vramscope BIN --cuda-test BIN [--work DIR] [--limit S]

Runs gpu/cuda's GPU tests (go test -c ./gpu/cuda; -test.run GPU), where a
skip means the driver was not found and fails; then `vramscope trace
--device cuda` of the frag workload (85 % of the card filled, really taken
and touched) with the default settings and with expandable segments: how
long it ran, and each driver function's calls and time; beside each, the
same workload on the simulated device of the card's size. Without
expandable segments it must run out of memory from fragmentation, with them
it must fit, on the card as on the simulated device.
"""

import argparse
import json
import os
import re
import sys

import gpucheck as g

SETTINGS = (("default", ""), ("expandable", "expandable_segments:True"))


def trace(log, vramscope, device, conf, db, capacity=None, timeout=None):
    """`vramscope trace --workload frag`: what it printed, read."""
    cmd = [vramscope, "trace", "--workload", "frag", "--device", device, "--db", db, "--quiet"]
    if conf:
        cmd += ["--alloc-conf", conf]
    if capacity:
        cmd += ["--capacity", str(capacity)]
    status, out = log.run(cmd, timeout=timeout)
    r = {"status": status, "calls": {}, "outcome": "error (status %d)" % status}
    m = re.search(r"^trace (\S+): (\d+) events, peak reserved (.+?), peak allocated (.+)$", out, re.M)
    if m:
        r.update(events=int(m[2]), reserved=m[3], allocated=m[4])
    m = re.search(r"^ran for (\S+)(?:, (\S+) of it in (\d+) driver calls:)?$", out, re.M)
    if m:
        r.update(ran=m[1], driver=m[2] or "-", driver_calls=m[3] or "-")
    for name, count, took in re.findall(r"^  (\w+) +(\d+)× +(\S+)$", out, re.M):
        r["calls"][name] = (int(count), took)
    if status == 0:
        r["outcome"] = "OOM" if re.search(r"^OOM: ", out, re.M) else "fit"
    elif not out.strip():
        r["outcome"] = "error (status %d, no output)" % status
    else:
        r["outcome"] = "error: " + out.strip().splitlines()[-1][:80]
    return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vramscope", required=True)
    p.add_argument("--cuda-test", required=True, help="go test -c ./gpu/cuda")
    p.add_argument("--work", default=".")
    p.add_argument("--limit", type=float, default=0)
    a = p.parse_args()
    dl = g.Deadline(a.limit)
    os.makedirs(a.work, exist_ok=True)
    log = g.Log(os.path.join(a.work, "cuda-commands.log"))
    failed = []

    _, out = log.run([os.path.abspath(a.cuda_test), "-test.run", "GPU", "-test.v", "-test.count=1"],
                     cwd=os.path.join(g.ROOT, "gpu", "cuda"), timeout=dl.left(keep=30))
    tests = {n: r for n, r in g.go_tests(out).items() if n.startswith("TestGPU") and "/" not in n}
    rows = []
    for name, (word, logs, took) in sorted(tests.items()):
        why = next((l.split(": ", 1)[-1] for l in logs if ".go:" in l), "") if word != "PASS" else ""
        rows.append((name, word, "%.2f s" % took, why[:100]))
        if word != "PASS":
            failed.append("%s %s%s" % (name, word, " (no driver found on a GPU machine)" if word == "SKIP" else ""))
    if not tests:
        failed.append("no GPU test ran: " + (out.strip().splitlines() or ["no output"])[-1][:100])
    print("gpu/cuda's tests on this card's driver (-test.run GPU)")
    g.table(("TEST", "", "TIME", ""), rows)

    status, out = log.run([a.vramscope, "devices", "--json"], timeout=dl.left(keep=25), stdout_only=True)
    try:
        card = json.loads(out)[0]
    except (ValueError, IndexError, KeyError):
        card = None
        failed.append("vramscope devices: status %d: %s" % (status, log.last_err.strip()[:100]))
    runs = {}
    for label, conf in SETTINGS:
        runs[label, "cuda"] = trace(log, a.vramscope, "cuda", conf, os.path.join(a.work, "cuda.db"), timeout=dl.left(keep=5))
        if card:
            runs[label, "sim"] = trace(log, a.vramscope, "sim", conf, os.path.join(a.work, "sim.db"),
                                       capacity=card["total_bytes"], timeout=dl.left(keep=2))
    rows = []
    for (label, device), r in runs.items():
        rows.append((label, device, r["outcome"], g.num(r["events"]) if "events" in r else "-", r.get("reserved", "-"),
                     r.get("allocated", "-"), r.get("ran", "-"),
                     "%s in %s calls" % (r["driver"], r["driver_calls"]) if device == "cuda" and "driver" in r else ""))
    print()
    print("vramscope trace --workload frag%s: on the card and on the simulated device of its size"
          % (" (%s, %s B)" % (card["name"], g.num(card["total_bytes"])) if card else ""))
    g.table(("SETTINGS", "DEVICE", "OUTCOME", "EVENTS", "PEAK RESERVED", "PEAK ALLOCATED", "RAN FOR", "DRIVER"), rows)
    names = sorted({n for (l, d), r in runs.items() if d == "cuda" for n in r["calls"]})
    if names:
        print()
        g.table(("DRIVER FUNCTION",) + tuple(l.upper() for l, _ in SETTINGS),
                [(n,) + tuple("%d× %s" % runs[l, "cuda"]["calls"][n] if n in runs[l, "cuda"]["calls"] else "-"
                              for l, _ in SETTINGS) for n in names])
    for (label, device), r in runs.items():
        want = "OOM" if label == "default" else "fit"
        if r["outcome"] != want:
            failed.append("frag on %s with %s settings: %s, want %s" % (device, label, r["outcome"], want))
    if failed:
        return g.verdict(g.FAIL, "; ".join(failed))
    d, e = runs["default", "cuda"], runs["expandable", "cuda"]
    return g.verdict(g.OK, "%d GPU tests passed; frag fragments by default (ran %s, %s in the driver) and fits with "
                           "expandable segments (ran %s, %s in the driver)" % (len(tests), d.get("ran"), d.get("driver"),
                                                                               e.get("ran"), e.get("driver")))


if __name__ == "__main__":
    sys.exit(main())
