"""A training job on the stand-in torch: argv = steps, [blocks left live
at the end]. Each step allocates 200 blocks and frees them, then waits a
millisecond as for the GPU; an argument
"oom" ends it by running out of memory. It prints the blocks live at its
end as JSON (address, size) on its last line."""
import json
import sys
import time

import torch

a = torch.standin
steps = int(sys.argv[1])
for _ in range(steps):
    addrs = [a.alloc() for _ in range(200)]
    for p in addrs:
        a.free(p)
    time.sleep(0.001)  # the GPU's part of the step: the GIL is free
live = []
if len(sys.argv) > 2 and sys.argv[2] == "oom":
    while True:
        live.append(a.alloc())  # the segment runs out: OutOfMemoryError
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0):
    live.append(a.alloc())
print(json.dumps([[p, a.blocks[p][0]] for p in sorted(a.blocks)]))
