"""Streams the entries of a real snapshot as one rank of a run, in place of
torch: argv = helper dir, server URL, the snapshot, then run= and rank= as
watch() takes them ("-" leaves one to the environment)."""
import pickle
import sys
import threading

sys.path.insert(0, sys.argv[1])
import vramscope_watch as vw  # noqa: E402

url, path, run, rank = sys.argv[2:6]
with open(path, "rb") as f:
    full = pickle.load(f)
entries = full["device_traces"][0]
entries = entries[:next(i for i, e in enumerate(entries) if e["action"] == "oom")]
state = {"n": 0}
finished = threading.Event()


def snapshot():
    n = state["n"]
    if n >= len(entries):
        finished.set()
    state["n"] = min(len(entries), n + 500)
    return {"segments": [], "device_traces": [entries[:n]]}


kw = {}
if run != "-":
    kw["run"] = run
if rank != "-":
    kw["rank"] = int(rank)
w = vw.watch(url, device=0, interval=0.01, snapshot=snapshot, start_recording=lambda n: None, out=sys.stdout, **kw)
finished.wait(60)
w.close()
print("traces", " ".join(w.traces))
if w.error:
    print("error", w.error)
    sys.exit(1)
