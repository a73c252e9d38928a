"""Drives vramscope_watch against a real server with entries from a real
snapshot, in place of torch: argv = helper dir, server URL, the snapshot, a
folder of the job's states (state-N.pickle: its segments after N entries),
ring size, entries per poll, [token, [ring size of the annotations
(default: the ring size)]]. It cannot clear its ring: the helper finds
where the entries it sent end."""
import pickle
import sys
import threading

sys.path.insert(0, sys.argv[1])
import vramscope_watch as vw  # noqa: E402

url, full_path, states = sys.argv[2:5]
ring, step = int(sys.argv[5]), int(sys.argv[6])
ann_ring = int(sys.argv[8]) if len(sys.argv) > 8 else ring
with open(full_path, "rb") as f:
    full = pickle.load(f)


def segments_at(n):
    with open("%s/state-%d.pickle" % (states, n), "rb") as f:
        return pickle.load(f)["segments"]

entries = full["device_traces"][0]
oom = next((i for i, e in enumerate(entries) if e["action"] == "oom"), len(entries))
annotations = [a for a in full.get("external_annotations", []) if a.get("device", 0) == 0]
state = {"n": 0}
finished = threading.Event()


def snapshot():
    """Like torch.cuda.memory._snapshot(): the whole ring each time, and
    the annotations so far, in a ring as long. Each call moves the job on
    by `step` entries; the poll that reaches the OOM sees the whole file,
    as the job would when it dies there."""
    n = state["n"]
    if n >= len(entries):
        finished.set()
        return full
    state["n"] = len(entries) if n + step > oom else n + step
    segs = segments_at(n)
    now = entries[n - 1]["time_us"] if n > 0 else -1
    anns = [a for a in annotations if a["time_us"] <= now][-ann_ring:]
    return {"segments": segs, "device_traces": [entries[max(0, n - ring):n]],
            "allocator_settings": full.get("allocator_settings", {}), "external_annotations": anns}


# The fifth read's message is cut off halfway and its connection killed,
# as a network would: the helper must resume without gaps or duplicates.
frame, sent = vw._WebSocket._frame, {"events": 0, "cut": 0}


def cutting_frame(self, opcode, payload):
    if opcode == 2:
        sent["events"] += 1
        if sent["events"] == 5:
            sock = self.sock

            def half(data):
                sock.send(data[:len(data) // 2])
                sock.close()
                sent["cut"] += 1
                raise OSError("connection cut")

            self.sock = type("Cut", (), {"sendall": staticmethod(half), "close": sock.close})()
    return frame(self, opcode, payload)


vw._WebSocket._frame = cutting_frame
recording = []
w = vw.watch(url, token=sys.argv[7] if len(sys.argv) > 7 else None, device=0, interval=0.01, name="driver",
             snapshot=snapshot, start_recording=recording.append, out=sys.stdout)
finished.wait(60)
w.close()
print("recording", recording)
print("cut", sent["cut"])
print("traces", " ".join(w.traces))
print("incidents", " ".join(w.incidents))
if w.error:
    print("error", w.error)
    sys.exit(1)
