"""A training job on the stand-in torch: argv = steps, [blocks left live
at the end]. Each step, annotated ProfilerStep#N as PyTorch's profiler
names it, allocates 200 blocks and frees them, then waits a millisecond
as for the GPU; an argument "oom" ends it by running out of memory. It
prints the blocks live at its end as JSON (address, size) on its last
line. $STANDIN_ASK_WHOLE=S:N makes it ask, as step S begins, for its next
N steps whole, as a user would from its side: writing N into the
watcher's request file. $STANDIN_STOP_FILE ends it early, at the first
step after that file appears (a test's job that runs until told)."""
import json
import os
import sys
import tempfile
import time

import torch

a = torch.standin
steps = int(sys.argv[1])
ask_at, _, ask = os.environ.get("STANDIN_ASK_WHOLE", "").partition(":")
stop = os.environ.get("STANDIN_STOP_FILE")
for step in range(steps):
    if stop and step % 100 == 0 and os.path.exists(stop):
        break
    if ask_at and step == int(ask_at):
        with open(os.path.join(tempfile.gettempdir(), "vramscope-%d.steps" % os.getpid()), "w") as f:
            f.write(ask)
    a.annotate("START", "ProfilerStep#%d" % step)
    addrs = [a.alloc() for _ in range(200)]
    for p in addrs:
        a.free(p)
    a.annotate("END", "ProfilerStep#%d" % step)
    time.sleep(0.001)  # the GPU's part of the step: the GIL is free
live = []
if len(sys.argv) > 2 and sys.argv[2] == "oom":
    while True:
        live.append(a.alloc())  # the segment runs out: OutOfMemoryError
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0):
    live.append(a.alloc())
print(json.dumps([[p, a.blocks[p][0]] for p in sorted(a.blocks)]))
