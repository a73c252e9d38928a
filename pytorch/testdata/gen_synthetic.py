"""Writes a synthetic PyTorch memory snapshot shaped like real ones.

Frame dicts are shared objects and stacks come from a few hundred distinct
tracebacks, some frames lists shared between entries, as PyTorch writes
them. Usage: gen_synthetic.py OUT EVENTS
"""
import pickle, random, sys

out, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
frames = [{"name": "fn_%d(at::Tensor const&, long)" % i, "filename": "/src/mod_%d.py" % (i % 97), "line": i}
          for i in range(600)]
stacks = [[rng.choice(frames) for _ in range(rng.randint(20, 60))] for _ in range(300)]
segments, live, addr = [], [], 1 << 40
for s in range(2000):
    blocks, a = [], addr
    for b in range(32):
        size = 512 * rng.randint(1, 64)
        st = "active_allocated" if b % 3 else "inactive"
        blocks.append({"address": a, "size": size, "requested_size": size - 7 if st != "inactive" else 0,
                       "state": st, "frames": list(rng.choice(stacks)) if st != "inactive" else []})
        a += size
    segments.append({"device": 0, "address": addr, "total_size": a - addr, "allocated_size": 0, "active_size": 0,
                     "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                     "is_expandable": False, "frames": [], "blocks": blocks})
    addr = a + (1 << 21)
# The trace allocates and frees at the front of one free 64 MiB segment, so
# the events undo cleanly from the final state.
base = addr
segments.append({"device": 0, "address": base, "total_size": 64 << 20, "allocated_size": 0, "active_size": 0,
                 "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                 "is_expandable": False, "frames": [],
                 "blocks": [{"address": base, "size": 64 << 20, "requested_size": 0, "state": "inactive", "frames": []}]})
trace, t = [], 1_700_000_000_000_000
for i in range(n):
    action = ("alloc", "free_requested", "free_completed")[i % 3]
    st = rng.choice(stacks)
    trace.append({"action": action, "addr": base, "size": 4096, "stream": 0,
                  "time_us": t + i, "compile_context": "N/A", "user_metadata": "",
                  "frames": st if rng.random() < 0.4 else list(st)})
snap = {"segments": segments, "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
        "external_annotations": []}
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
