"""The estimate's tests: runs a script under the estimate's hooks and
prints JSON (the script's own prints go to stderr). python estimate_harness.py HELPER_DIR MODE SCRIPT ARGS...

MODE estimate: the requests estimated with meta standing in for cuda (no
cuBLAS workspaces: a CPU run has none), as [action, size] pairs.
MODE cpu: the same script run for real on the CPU (give it --device cpu),
its CPU storages recorded by the same hooks, identified by their data
pointers. What stays on the CPU under the estimate too is left out:
torch.tensor() of Python data (the optimizer's step counts) and what
record_function makes (its handles).
"""

import contextlib
import json
import os
import runpy
import sys

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402

import vramscope_estimate as ve  # noqa: E402

mode, script, args = sys.argv[2], os.path.abspath(sys.argv[3]), sys.argv[4:]


def pairs(entries):
    return [[e["action"], e["size"]] for e in entries if e["action"] != "free_completed"]


if mode == "estimate":
    with contextlib.redirect_stdout(sys.stderr):  # the script's prints
        snap = ve.estimate(script, args, steps=3, workspaces=False)
    print(json.dumps(pairs(snap["device_traces"][0])))
    sys.exit(0)


def in_profiler():
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename.endswith(os.path.join("autograd", "profiler.py")):
            return True
        f = f.f_back
    return False


class CPURecorder(ve.Recorder):
    def __init__(self):
        super().__init__(torch, self.counts, 3, 0, 0, key=lambda st: st.data_ptr())
        self.cpu_only = set()  # storages of torch.tensor(): they stay on the CPU under the estimate too

    def counts(self, t):
        return t.device.type == "cpu" and self.storage_of(t)._cdata not in self.cpu_only

    def outputs(self, func, a, kw, out):
        if "lift_fresh" in str(func):
            self.cpu_only.update(self.storage_of(t)._cdata for t in ve._tensors(out))
        elif not str(func).startswith("profiler.") and not in_profiler():
            super().outputs(func, a, kw, out)


rec = CPURecorder()
rec.script_files.add(script)
saved = []
ve._regions(torch, rec, saved)
sys.argv = [script] + args
with ve._watch_mode(torch, rec)(), contextlib.redirect_stdout(sys.stderr):
    try:
        runpy.run_path(script, run_name="__main__")
    except ve._Stop:
        pass
ve._restore(saved)
print(json.dumps(pairs(rec.entries)))
