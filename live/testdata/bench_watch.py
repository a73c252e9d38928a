"""What watching costs a job, on any machine: a job loop that makes
PyTorch's trace entries at the rate of a small GPT training step on an
H200 (about 1,700 entries per 16 ms step: 567 allocations, each freed)
while doing GIL-bound Python work, against a stand-in for torch whose
_snapshot() holds the GIL for --us-per-entry microseconds per ring entry
(2.9: PyTorch 2.11 on an H200, C++ frames included).

    python3 bench_watch.py --url http://127.0.0.1:8080 [--steps 1000] [--us-per-entry 2.9]

runs the job with recording alone, watched live, recording alone again
(the two baselines bracket the watched run, so the machine's drift shows),
and on out-of-memory only; then, as a busy machine's drift can swamp a few
per cent between whole runs, the job once more watched, in chunks of
--chunk steps with the watcher paused every other chunk (recording alone),
the two kinds alternating; and last, in such chunks again, asking in the
middle for the next --whole steps whole. It prints one JSON
object: each run's whole time and median step, the ratios to recording
alone (whole runs, and the paired chunks: their sums and the median of the
pairs' ratios), the worst stall (the longest watched step less the
median), how many entries the watcher read and lost; for the run with
steps read whole, the watched steps' mean time outside and inside the
window (from the read that opens it to the one that ends it) to the
paused steps' of the same run, the steps the server marks complete, the
entries the read whole held, and what a complete step cost: the window's
steps' time beyond the paused steps' mean, a complete step, and the
read's own time.

Every step is annotated ProfilerStep#N (START and END), as PyTorch's
profiler does.
"""
import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "python"))
import standin_torch  # noqa: E402


def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x


def calibrate(target_s, allocs):
    """The spin per allocation that makes a step last target_s."""
    n = 1000
    while True:
        t = time.perf_counter()
        for _ in range(allocs):
            spin(n)
        d = time.perf_counter() - t
        if d > 0.05:
            return max(1, int(n * target_s / d))
        n *= 2


def job(a, steps, allocs, work, first=0, each=None):
    """steps training steps (numbered from first): each allocates `allocs`
    blocks between bits of GIL-bound work, then frees them (3 entries an
    allocation). each(i), when given, runs as step i begins."""
    times = []
    for i in range(first, first + steps):
        if each:
            each(i)
        t = time.perf_counter()
        a.annotate("START", "ProfilerStep#%d" % i)
        addrs = []
        for _ in range(allocs):
            spin(work)
            addrs.append(a.alloc())
        for p in addrs:
            a.free(p)
        a.annotate("END", "ProfilerStep#%d" % i)
        times.append(time.perf_counter() - t)
    return times


def summary(times, wall):
    med = statistics.median(times)
    return {"wall_s": round(wall, 3), "median_step_ms": round(med * 1e3, 3),
            "worst_stall_ms": round((max(times) - med) * 1e3, 3)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--us-per-entry", type=float, default=2.9)
    p.add_argument("--step-ms", type=float, default=16.0)
    p.add_argument("--allocs", type=int, default=567)
    p.add_argument("--duty", type=float, default=0.03)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--chunk", type=int, default=50)
    p.add_argument("--whole", type=int, default=20, help="steps asked for whole in the last run")
    args = p.parse_args()
    a = standin_torch.install(args.us_per_entry)
    import vramscope_watch as vw

    work = calibrate(args.step_ms / 1e3, args.allocs)
    out = {"steps": args.steps, "entries_per_step": 3 * args.allocs, "us_per_entry": args.us_per_entry,
           "duty": args.duty, "interval_s": args.interval}

    def recording_alone():
        a.reset()
        a._record_memory_history(enabled="all", max_entries=100000)  # as record.py's baseline
        job(a, 5, args.allocs, work)
        t = time.perf_counter()
        times = job(a, args.steps, args.allocs, work)
        return summary(times, time.perf_counter() - t)

    out["recording_alone"] = recording_alone()

    a.reset()
    log = io.StringIO()
    w = vw.watch(args.url, name="bench: %d entries/step, %.1f us/entry" % (3 * args.allocs, args.us_per_entry),
                 interval=args.interval, duty=args.duty, out=log)
    job(a, 5, args.allocs, work)
    t = time.perf_counter()
    times = job(a, args.steps, args.allocs, work)
    watched = summary(times, time.perf_counter() - t)
    w.close()
    watched.update({"trace": w.traces[0], "gaps": w.gaps, "entries_lost_known": w.lost, "entries_sent": w.seq,
                    "entries_made": 3 * args.allocs * (args.steps + 5), "snapshot_gil_s": round(a.held_s, 3),
                    "watcher_read_s": round(w.held, 3), "ring_last": w.ring})
    out["watched"] = watched
    out["recording_alone_again"] = recording_alone()

    a.reset()
    with tempfile.TemporaryDirectory() as d:
        vw.on_oom(dir=d, out=log)
        job(a, 5, args.allocs, work)
        t = time.perf_counter()
        times = job(a, args.steps, args.allocs, work)
        out["on_oom"] = summary(times, time.perf_counter() - t)

    # Paired chunks: the watcher paused (its lock held: it reads nothing)
    # every other chunk, which of the pair comes first alternating.
    a.reset()
    w = vw.watch(args.url, name="bench (paired chunks)", interval=args.interval, duty=args.duty, out=log)
    job(a, 5, args.allocs, work)
    sums, pairs, watched_steps = {True: 0.0, False: 0.0}, [], []
    for k in range(max(1, args.steps // args.chunk)):
        took = {}
        for on in ((True, False) if k % 2 == 0 else (False, True)):
            if not on:
                w.lock.acquire()
            t = time.perf_counter()
            times = job(a, args.chunk, args.allocs, work)
            took[on] = time.perf_counter() - t
            if not on:
                w.lock.release()
            else:
                watched_steps += times
            sums[on] += took[on]
        pairs.append(took[True] / took[False])
    w.close()
    med = statistics.median(watched_steps)
    out["paired"] = {"chunks": len(pairs), "chunk_steps": args.chunk, "watched_s": round(sums[True], 3),
                     "recording_alone_s": round(sums[False], 3), "ratio": round(sums[True] / sums[False], 4),
                     "median_pair_ratio": round(statistics.median(pairs), 4),
                     "worst_stall_ms": round((max(watched_steps) - med) * 1e3, 3), "gaps": w.gaps}

    out["steps_whole"] = steps_whole(a, vw, args, work, log, out)

    base = (out["recording_alone"]["wall_s"] + out["recording_alone_again"]["wall_s"]) / 2
    out["ratio_watched"] = round(watched["wall_s"] / base, 4)
    out["ratio_on_oom"] = round(out["on_oom"]["wall_s"] / base, 4)
    print(json.dumps(out, indent=1))


def steps_whole(a, vw, args, work, log, out):
    """The job watched in chunks of --chunk steps, the watcher paused
    (recording alone) every other chunk as in the paired run; as the watched
    chunk at the middle begins it asks for the next `whole` steps whole,
    and that chunk goes on until they are read. The window's steps (from
    the read that opens it to the one that ends it, which it holds) and the
    other watched steps, against the paused steps of the same run."""
    a.reset()
    w = vw.watch(args.url, name="bench: %d steps whole" % args.whole, interval=args.interval, duty=args.duty, out=log)
    job(a, 5, args.allocs, work)
    chunks = max(2, args.steps // args.chunk)
    ask_chunk = chunks // 2 if (chunks // 2) % 2 == 0 else chunks // 2 + 1  # a watched chunk (the even ones)
    first, alone, watched, inside = 5, [], [], []
    chunk_s = {}  # chunk -> its steps' time, for pairs
    state = {"asked": False}

    def each(i):
        if state["asked"] and w.window is not None:  # from the read that opens the window to the one that ends it
            state["in"].add(i)

    for k in range(chunks + 1):
        on = k % 2 == 0
        if not on:
            w.lock.acquire()
        if k == ask_chunk:
            w.complete(args.whole)
            state.update(asked=True, at=first, **{"in": set()})
            times = []
            while (w.asked or w.window is not None) and w.error is None or len(times) < args.chunk:
                times += job(a, 1, args.allocs, work, first=first + len(times), each=each)
            inside = [times[i - first] for i in sorted(state["in"])]
            watched += [x for i, x in enumerate(times) if i + first not in state["in"]]
        else:
            times = job(a, args.chunk, args.allocs, work, first=first)
            (watched if on else alone).extend(times)
            chunk_s[k] = sum(times)
        first += len(times)
        if not on:
            w.lock.release()
    w.close()
    # What the server says of the steps: complete or sampled.
    req = urllib.request.Request("%s/api/traces/%s/steps?limit=%d" % (args.url.rstrip("/"), w.traces[0], first + 10))
    with urllib.request.urlopen(req) as resp:
        st = json.load(resp)
    complete = [s["step"] for s in st["steps"] if s["complete"]]
    read = w.windows[0] if w.windows else {}
    base = statistics.mean(alone)
    extra = sum(inside) - len(inside) * base
    return {"asked": args.whole, "asked_at_step": state.get("at"), "trace": w.traces[0], "steps": first - 5,
            "recording_alone_mean_ms": round(base * 1e3, 3),
            "outside_ratio": round(statistics.mean(watched) / base, 4),
            # each watched chunk but the window's against the paused chunks
            # on either side (a drift of the machine cancels out)
            "outside_median_pair_ratio": round(statistics.median(
                chunk_s[k] / statistics.mean(chunk_s[j] for j in (k - 1, k + 1) if j in chunk_s)
                for k in chunk_s if k % 2 == 0 and (k - 1 in chunk_s or k + 1 in chunk_s)), 4),
            "chunk_s": [round(chunk_s.get(k, 0), 4) for k in range(chunks + 1)],
            "inside_ratio": round(statistics.mean(inside) / base, 4) if inside else None,
            "window_steps": len(inside), "window_step_ms": [round(x * 1e3, 1) for x in inside],
            "complete_steps": len(complete), "complete_from_to": [min(complete), max(complete)] if complete else None,
            "read_whole_entries": read.get("entries"), "read_whole_ring": read.get("ring"), "read_whole_s": read.get("read_s"),
            "extra_per_complete_step_ms": round(extra / max(1, len(complete)) * 1e3, 3),
            "read_per_complete_step_ms": round(read.get("read_s", 0) / max(1, len(complete)) * 1e3, 3),
            "entries_sent": w.seq, "entries_made": 3 * args.allocs * first, "gaps": w.gaps}


if __name__ == "__main__":
    main()
