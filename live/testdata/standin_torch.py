"""A stand-in for the parts of torch that vramscope_watch calls, for tests
and benchmarks on machines without a GPU or torch: install() puts `torch`,
`torch.cuda`, `torch.cuda.memory`, `torch._C` and `torch.distributed` in
sys.modules.

Its allocator hands out small-pool blocks of one 2 MiB segment in address
order and records PyTorch's trace entries (alloc; free_requested and
free_completed; oom) in a ring, as _record_memory_history's does, with
Python frames shared between entries as PyTorch's symbolizer shares them;
annotate() records a record_function region's START or END (a training
step's ProfilerStep#N) in a ring of its own, which _snapshot() returns as
external_annotations and clear_history empties with the entries.
_snapshot() returns the segments and the ring as PyTorch does, and holds
the GIL for `us_per_entry` microseconds per entry of the ring (2.9: what
PyTorch 2.11 took on an H200, C++ frames included), as PyTorch's
conversion of the ring into Python objects does: the cost a watcher makes
its job pay.
"""

import collections
import sys
import time
import types

SEGMENT = 0x7F0000000000
SEGMENT_SIZE = 2 << 20
FRAMES = [{"name": "forward", "filename": "train.py", "line": 41},
          {"name": "step", "filename": "train.py", "line": 88},
          {"name": "<module>", "filename": "train.py", "line": 120}]


class OutOfMemoryError(RuntimeError):
    pass


def _calibrate():
    """Items of sum(range(n)) per microsecond: a loop in C that never lets
    the GIL go."""
    n = 200000
    best = None
    for _ in range(5):
        t = time.perf_counter()
        sum(range(n))
        d = time.perf_counter() - t
        best = d if best is None else min(best, d)
    return n / (best * 1e6)


class Allocator:
    def __init__(self, us_per_entry=2.9):
        self.us_per_entry = us_per_entry
        self.per_us = _calibrate()
        self.reset()

    def reset(self):
        self.ring = collections.deque(maxlen=1)
        self.anns = collections.deque(maxlen=1)
        self.recording = False
        self.blocks = {}  # addr -> (size, requested, state)
        self.next = SEGMENT
        self.allocated = self.freed = self.ooms = 0
        self.observers = []
        self.held_s = 0.0  # time _snapshot held the GIL

    def _record(self, action, addr, size):
        if self.recording:
            self.ring.append({"action": action, "addr": addr, "size": size, "stream": 0,
                              "time_us": int(time.time() * 1e6), "frames": FRAMES})

    def annotate(self, stage, name):
        """A record_function region's START or END, as PyTorch records it
        while history is recorded."""
        if self.recording:
            self.anns.append({"device": 0, "stage": stage, "name": name, "time_us": int(time.time() * 1e6)})

    def alloc(self, size=3072):
        """Hands out the next block of the segment (size: a multiple of
        512, small enough to leave the rest of the segment split off)."""
        if self.next + size > SEGMENT + SEGMENT_SIZE:
            self.oom(size)
        addr = self.next
        self.next += size
        self.blocks[addr] = (size, size, "active_allocated")
        self.allocated += 1
        self._record("alloc", addr, size)
        return addr

    def free(self, addr):
        size = self.blocks.pop(addr)[0]
        self.freed += 1
        self._record("free_requested", addr, size)
        self._record("free_completed", addr, size)
        if not self.blocks:
            self.next = SEGMENT

    def oom(self, size):
        self.ooms += 1
        if self.recording:
            self.ring.append({"action": "oom", "device_free": 1 << 30, "size": size, "stream": 0,
                              "time_us": int(time.time() * 1e6), "frames": FRAMES})
        for fn in self.observers:
            fn(0, size, SEGMENT_SIZE, 1 << 30)
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate %d bytes" % size)

    def segments(self, live=None):
        live = dict(self.blocks) if live is None else live
        blocks, at = [], SEGMENT
        for addr in sorted(live):
            if addr > at:
                blocks.append({"address": at, "size": addr - at, "requested_size": 0, "state": "inactive", "frames": []})
            size, requested, state = live[addr]
            blocks.append({"address": addr, "size": size, "requested_size": requested, "state": state, "frames": FRAMES})
            at = addr + size
        if at < SEGMENT + SEGMENT_SIZE:
            blocks.append({"address": at, "size": SEGMENT + SEGMENT_SIZE - at, "requested_size": 0, "state": "inactive", "frames": []})
        used = sum(b["size"] for b in blocks if b["state"] != "inactive")
        return [{"device": 0, "address": SEGMENT, "total_size": SEGMENT_SIZE, "allocated_size": used,
                 "active_size": used, "requested_size": used, "stream": 0, "segment_type": "small",
                 "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}]

    # torch.cuda.memory

    def _record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                               device=None, clear_history=False, compile_context=False,
                               global_record_annotations=False, skip_actions=None):
        self.recording = enabled is not None
        keep = [] if clear_history else list(self.ring)
        self.ring = collections.deque(keep, maxlen=max(1, max_entries))
        self.anns = collections.deque([] if clear_history else list(self.anns), maxlen=max(1, max_entries))

    def _snapshot(self, device=None):
        # The blocks, the ring and the annotations copied one after the
        # other (a copy is one step the job's thread cannot cut into), as
        # PyTorch reads them under its allocator's lock.
        live, entries, anns = dict(self.blocks), list(self.ring), list(self.anns)
        t = time.perf_counter()
        sum(range(int(self.us_per_entry * len(entries) * self.per_us)))  # the GIL, held
        self.held_s += time.perf_counter() - t
        return {"segments": self.segments(live), "device_traces": [entries], "external_annotations": anns,
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}

    def memory_stats(self, device=None):
        return {"allocation.all.allocated": self.allocated, "allocation.all.freed": self.freed,
                "segment.all.allocated": 1, "segment.all.freed": 0, "num_ooms": self.ooms}


def install(us_per_entry=2.9):
    """Puts the stand-in in sys.modules as torch; returns its Allocator."""
    a = Allocator(us_per_entry)
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    c = types.ModuleType("torch._C")
    dist = types.ModuleType("torch.distributed")
    memory._record_memory_history = a._record_memory_history
    memory._snapshot = a._snapshot
    memory.memory_stats = a.memory_stats
    cuda.memory = memory
    cuda.current_device = lambda: 0
    cuda.OutOfMemoryError = OutOfMemoryError
    c._cuda_attach_out_of_memory_observer = lambda fn: a.observers.append(fn)
    dist.is_available = lambda: False
    dist.is_initialized = lambda: False
    torch.cuda, torch._C, torch.distributed = cuda, c, dist
    torch.standin = a
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory,
                        "torch._C": c, "torch.distributed": dist})
    return a
