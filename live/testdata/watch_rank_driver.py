"""Streams the entries of a real snapshot as one rank of a run, in place of
torch: argv = helper dir, server URL, the snapshot, a folder of the job's
states (state-N.pickle: its segments after N entries), then run= and rank= as
watch() takes them ("-" leaves one to the environment), and optionally
where to cut the connection once while the trace ends: "after-end" (the
end message is sent whole and the connection dies before done is read; the
server may have stored the end) or "in-end" (the end message is cut off
halfway; the server never read it)."""
import pickle
import sys
import threading

sys.path.insert(0, sys.argv[1])
import vramscope_watch as vw  # noqa: E402

url, path, states, run, rank = sys.argv[2:7]
cut = sys.argv[7] if len(sys.argv) > 7 else None
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
    with open("%s/state-%d.pickle" % (states, n), "rb") as f:
        segs = pickle.load(f)["segments"]
    return {"segments": segs, "device_traces": [entries[:n]]}


send, cuts = vw._WebSocket.send, {"n": 0}


def cutting_send(self, obj):
    if obj.get("type") != "end" or cuts["n"] > 0:
        return send(self, obj)
    cuts["n"] += 1
    if cut == "after-end":
        send(self, obj)
        self.sock.close()  # dead before done can be read
        return
    sock = self.sock

    def half(data):
        sock.send(data[:len(data) // 2])
        sock.close()
        raise OSError("connection cut")

    self.sock = type("Cut", (), {"sendall": staticmethod(half), "close": sock.close})()
    return send(self, obj)


if cut:
    vw._WebSocket.send = cutting_send
kw = {}
if run != "-":
    kw["run"] = run
if rank != "-":
    kw["rank"] = int(rank)
w = vw.watch(url, device=0, interval=0.01, snapshot=snapshot, start_recording=lambda n: None, out=sys.stdout, **kw)
finished.wait(60)
w.close()
print("cut", cuts["n"])
print("traces", " ".join(w.traces))
if w.error:
    print("error", w.error)
    sys.exit(1)
