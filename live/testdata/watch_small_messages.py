"""Watches a job on the stand-in torch with duty=1 (the whole ring read,
nothing cleared) and a cap on a message far below what a read makes:
argv = helper dir, server URL. The helper sends the newest entries that
fit and says the others are lost. Prints the trace, the gaps and entries
the helper knew lost, and the blocks live at the job's end."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, sys.argv[1])
import standin_torch  # noqa: E402

a = standin_torch.install(0.1)
import vramscope_watch as vw  # noqa: E402

vw.Watcher.MAX_MESSAGE = 40000
w = vw.watch(sys.argv[2], duty=1, interval=0.05, out=sys.stdout)
for _ in range(40):
    addrs = [a.alloc() for _ in range(200)]
    for p in addrs[::2]:
        a.free(p)
    for p in addrs[1::2]:
        a.free(p)
    time.sleep(0.005)
live = [a.alloc() for _ in range(10)]
w.close()
print(json.dumps({"trace": w.traces[0], "gaps": w.gaps, "lost": w.lost, "live": [[p, a.blocks[p][0]] for p in sorted(a.blocks)]}))
