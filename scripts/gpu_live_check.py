"""GPU check: what watching a training job live costs it (#28), and the
steps it asks for read whole (issue 38).

    python3 scripts/gpu_live_check.py --vramscope BIN --recordings DIR [--work DIR] [--steps N] [--limit S]
    python3 scripts/gpu_live_check.py --report live.json

Starts `vramscope serve` on a free port, then runs record.py's GPT training
(batch 8, as record.py live does) for --steps steps in each of four
phases, in one process: alone; recording the allocator's history as the
watcher records it (Python frames, its ring); watched live by
vramscope_watch (live/python); alone again. While watched, if the helper
can (Watcher.complete), it asks for the next 10 steps whole a third of the
way in. What it measured goes into WORK/live.json, which --report turns
into the table: each phase's median step against alone (watched outside
the steps read whole: within 5 %), the entries the server holds of those
the job made, the gaps, PyTorch's _snapshot() per entry, and which steps the
server says are complete.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import gpucheck as g

WARMUP = 2  # steps of a phase left out: the first builds the model and its optimizer state
ASK = 10  # steps asked for whole
BOUND = 1.05  # watched outside those steps, against alone


def serve(vramscope, work):
    """Starts vramscope serve on a free loopback port; (process, URL)."""
    out = open(os.path.join(work, "serve.log"), "w")
    p = subprocess.Popen([vramscope, "serve", "--addr", "127.0.0.1:0", "--db", os.path.join(work, "live.db")],
                         stdout=subprocess.PIPE, stderr=out, text=True)
    line = p.stdout.readline()  # vramscope: serving DB on http://ADDR/
    if "http://" not in line:
        p.kill()
        raise RuntimeError("vramscope serve did not start: %r (see serve.log)" % line)
    return p, line.strip().split(" on ")[-1].rstrip("/")


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def measure(a):
    """Runs the four phases; returns what was measured."""
    sys.path.insert(0, a.recordings)
    sys.path.insert(0, os.path.join(g.ROOT, "live", "python"))
    import record  # first: it imports torch (a test's stand-in record.py puts a stand-in torch in its place)
    import torch
    import vramscope_watch

    dl = g.Deadline(a.limit)
    server, url = serve(a.vramscope, a.work)
    m = {"steps": a.steps, "batch": 8, "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "url": url}
    try:
        def phase(name, **kw):
            t = []
            t0 = time.time()
            record.train(steps=m["steps"], batch=8, step_times=t, **kw)
            m[name] = t
            print("  %s: %d steps in %.1f s" % (name, m["steps"], time.time() - t0), flush=True)
            record.clean()
            return time.time() - t0

        took = phase("alone")
        if dl.end is not None and 3.3 * took + 10 > dl.left():
            # The other three phases would not end in time: fewer steps each.
            m["steps"] = max(30, int(m["steps"] * (dl.left() - 10) / (3.3 * took)))
            print("  %d steps a phase from here, to end within the check's time" % m["steps"], flush=True)
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
        phase("recording")
        t0 = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        m["snapshot_s"] = time.perf_counter() - t0
        m["snapshot_entries"] = sum(len(d) for d in snap["device_traces"])
        del snap
        # Stopped and emptied: the watcher starts on a ring of its own, as in a job that never recorded.
        torch.cuda.memory._record_memory_history(enabled=None, clear_history=True)

        w = vramscope_watch.watch(url, name="gpu-check live", out=sys.stdout)
        m["can_complete"] = hasattr(w, "complete")
        m["asked_after"] = m["steps"] // 3 if m["can_complete"] else None

        def on_step(i):
            if m["asked_after"] is not None and i + 1 == m["asked_after"]:
                w.complete(ASK)

        trace = None
        try:
            phase("watched", on_step=on_step)
        finally:
            trace = w.trace or (w.traces[-1] if w.traces else None)
            w.close()
        m.update(trace=trace, held_s=w.held, gaps=w.gaps, lost=w.lost, watch_error=repr(w.error) if w.error else None)
        phase("alone_after")
        if trace:
            m["server_trace"] = get("%s/api/traces/%s" % (url, trace))
            m["server_steps"] = get("%s/api/traces/%s/steps?limit=2000" % (url, trace))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return m


def median(xs):
    return statistics.median(xs) if xs else None


def report(m):
    """Prints the table; returns the exit status of the verdict."""
    tr = m.get("server_trace") or {}
    tr = tr.get("trace", tr)
    steps = (m.get("server_steps") or {}).get("steps") or []
    complete = sorted(s["step"] for s in steps if s.get("complete"))
    has_flags = any("complete" in s for s in steps)
    whole = set(complete) if m.get("can_complete") and has_flags and (m.get("server_steps") or {}).get("sampled") else set()
    skip = lambda xs: xs[WARMUP:]
    alone = skip(m["alone"]) + skip(m.get("alone_after") or [])
    base = median(alone)
    watched = list(enumerate(m.get("watched") or []))[WARMUP:]
    outside = [t for i, t in watched if i not in whole]
    inside = [t for i, t in watched if i in whole]

    def row(label, xs, bound=None):
        med = median(xs)
        r = med / base if med and base else None
        ok = "" if bound is None else ("ok" if r is not None and r <= bound else "FAIL")
        return (label, str(len(xs)), "%.2f ms" % (med * 1e3) if med else "-", "%.3f" % r if r else "-",
                "%.0f ms" % ((max(xs) - med) * 1e3) if xs else "-", "%.2f" % bound if bound else "", ok), r

    rows, ratios = [], {}
    for label, xs, bound in (("alone (before and after)", alone, None),
                             ("recording history (Python frames)", skip(m.get("recording") or []), None),
                             ("watched, sampled", outside, BOUND),
                             ("watched, steps read whole", inside, None)):
        r, ratios[label] = row(label, xs, bound)
        rows.append(r)
    print("record.py's GPT training (batch %d) in one process, phase after phase, the first %d steps of each left out; %s, PyTorch %s"
          % (m.get("batch", 8), WARMUP, m.get("device", "?"), m.get("torch", "?")))
    g.table(("PHASE", "STEPS", "MEDIAN STEP", "vs ALONE", "WORST BEYOND MEDIAN", "BOUND", ""), rows)

    events = tr.get("events", 0)
    dropped = tr.get("dropped") or {}
    read = events - dropped.get("filled", 0)
    lost = dropped.get("lost", 0)
    total_watched = sum(m.get("watched") or [])
    facts = [("entries the server holds of those the job made", "%s of %s (%.1f %%), %d gaps" % (
                 g.num(read), g.num(read + lost), 100 * read / max(read + lost, 1), dropped.get("gap_count", 0))),
             ("the watcher's reads", "%.2f s, %.1f %% of the watched phase" % (m.get("held_s", 0), 100 * m.get("held_s", 0) / max(total_watched, 1e-9))),
             ("_snapshot() of the ring, Python frames", "%.3f s for %s entries: %.2f µs an entry" % (
                 m.get("snapshot_s", 0), g.num(m.get("snapshot_entries", 0)),
                 1e6 * m.get("snapshot_s", 0) / max(m.get("snapshot_entries", 0), 1)))]
    answer = m.get("server_steps") or {}
    facts.append(("steps in the trace", "%s (ProfilerStep annotations)" % g.num(answer.get("steps_total", len(steps)))))
    if not m.get("can_complete"):
        facts.append(("steps read whole on request", "n/a: this vramscope_watch has no complete(N)"))
    elif not steps:
        facts.append(("steps read whole on request", "asked %d after step %d; n/a: the trace has no steps to be complete"
                      % (ASK, m["asked_after"])))
    elif not has_flags:
        facts.append(("steps read whole on request", "asked %d after step %d; n/a: the server's steps say nothing of complete"
                      % (ASK, m["asked_after"])))
    else:
        asked = [s for s in complete if s >= m["asked_after"]]
        facts.append(("steps read whole on request", "asked %d after step %d: %d complete (%s)" % (
            ASK, m["asked_after"], len(asked), ", ".join(map(str, asked)) or "none")))
        if inside and base:
            cost = median(inside) - base
            facts.append(("a step read whole costs", "%+.2f ms against alone" % (cost * 1e3)))
    print()
    g.table(("WATCHED", ""), facts)

    failed = []
    if not m.get("trace") or m.get("watch_error"):
        failed.append("the watcher made no trace or stopped: %s" % m.get("watch_error"))
    r = ratios["watched, sampled"]
    if r is None or r > BOUND:
        failed.append("watched steps %s of alone's, over %.2f" % ("%.3f" % r if r else "unmeasured", BOUND))
    if m.get("can_complete") and has_flags and len([s for s in complete if s >= m["asked_after"]]) < ASK - 2:
        failed.append("fewer than %d of the %d steps asked for read whole" % (ASK - 2, ASK))
    if failed:
        return g.verdict(g.FAIL, "; ".join(failed))
    part = "steps read whole: n/a (the helper cannot yet)" if not m.get("can_complete") or not has_flags else \
        "%d steps read whole" % len([s for s in complete if s >= m["asked_after"]])
    return g.verdict(g.OK, "watched steps %.3f of alone's; %s" % (r, part))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vramscope")
    p.add_argument("--recordings", help="shared/testdata/pytorch-2.11 (record.py)")
    p.add_argument("--work", default=".")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--limit", type=float, default=0)
    p.add_argument("--report", help="print the table of a live.json measured before")
    a = p.parse_args()
    if a.report:
        return report(g.load_json(a.report))
    if not a.vramscope or not a.recordings:
        p.error("--vramscope and --recordings are needed to measure")
    os.makedirs(a.work, exist_ok=True)
    m = measure(a)
    with open(os.path.join(a.work, "live.json"), "w") as f:
        json.dump(m, f, indent=1)
    return report(m)


if __name__ == "__main__":
    sys.exit(main())
