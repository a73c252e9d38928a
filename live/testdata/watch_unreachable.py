"""Starts vramscope_watch against a server that is not there, in place of
torch: argv = helper dir, server URL. watch() must raise at once, having
tried once: the job decides what to do, it is not held up retrying."""
import sys

sys.path.insert(0, sys.argv[1])
import vramscope_watch as vw  # noqa: E402

tries = {"n": 0}
connect = vw._WebSocket.__init__


def counted(self, *a, **kw):
    tries["n"] += 1
    return connect(self, *a, **kw)


vw._WebSocket.__init__ = counted
try:
    vw.watch(sys.argv[2], device=0, snapshot=lambda: {"segments": [], "device_traces": [[]]},
             start_recording=lambda n: None, out=sys.stdout)
    print("started")
except ConnectionError as e:
    print("raised", e)
print("tries", tries["n"])
