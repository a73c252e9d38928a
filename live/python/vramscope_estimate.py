"""Estimate a PyTorch script's CUDA memory on a machine without a GPU.

    python -m vramscope_watch --estimate [--steps 3] [--device-memory 80GiB]
        [--checkpoint CLASS] [--out FILE | --url URL] train.py ARGS...

runs the script with CUDA stood in for and writes what the CUDA caching
allocator would have been asked for as a PyTorch memory snapshot (requests
only: no segments) that says it is an estimate. vramscope replays it
through its copy of the allocator under PYTORCH_CUDA_ALLOC_CONF, so the
peaks, the segments, the memory needed and the OOM on the device given
come from the allocator, not from a sum of tensor sizes.

No arithmetic is done on the stand-in device. Where the installed PyTorch
can fake a CUDA device (FakeTensorMode, with CUDA present) it does; else
the `meta` device stands in for `cuda`: device arguments, .cuda() and
.to("cuda") make meta tensors that say they are on cuda:0, torch.cuda
answers as a device of --device-memory would, and torch.autocast("cuda")
is applied as PyTorch's CUDA autocast lists say. Every storage made on the
stand-in device is one allocation request, freed when PyTorch frees the
storage (views and in-place ops make none), with the Python frames of the
call and the record_function regions around it. A value the script reads
(loss.item(), printing) is a stand-in (0), and the estimate counts them.

What the stream cannot see is said, with figures where PyTorch's source
fixes them: the cuBLAS and cuBLASLt workspaces, which PyTorch allocates
through the caching allocator at the first matrix product of each thread
(the script's, and autograd's), are added as it would; the CUDA context
and NCCL's buffers live outside the allocator, and are named.

Standard library and PyTorch only.
"""

import argparse
import os
import pickle
import re
import signal
import sys
import threading
import time

__all__ = ["estimate", "main", "EstimateError", "parse_bytes"]

MiB = 1 << 20
GiB = 1 << 30

# The key of the snapshot's top level that marks it an estimate.
MARK = "vramscope_estimate"

# The CUDA context is outside the allocator: what it takes depends on the
# driver, the CUDA version and the kernels loaded; this is a usual figure
# on a recent card with lazy loading, not a measurement.
CONTEXT_BYTES = 512 * MiB


class EstimateError(Exception):
    """Something the user can act on; the message says what and where."""


class _Stop(BaseException):
    """Ends the script early: enough optimizer steps, or the time limit.
    A BaseException, so that the script's own except clauses let it by."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_bytes(text):
    """80GiB, 81920MiB, 80GB (decimal), 1.5TiB: bytes, as vramscope reads them."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError("%r is not a size (give a unit: 80GiB, 24GB)" % (text,))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n):
    if n < 1024:
        return "%d B" % n
    v, unit = float(n), -1
    while v >= 1024 and unit < 5:
        v /= 1024
        unit += 1
    return "%.2f %siB" % (v, "KMGTPE"[unit])


# ---------------------------------------------------------------- what PyTorch's source fixes


def cublas_workspace_bytes(capability, env=None):
    """The workspace PyTorch gives each cuBLAS handle and stream, through
    the caching allocator (CublasHandlePool.cpp, parseChosenWorkspaceSize):
    CUBLAS_WORKSPACE_CONFIG's :SIZE:COUNT pairs (KiB), else 32 MiB on
    compute capability 9.0 (Hopper), else :4096:2:16:8."""
    env = os.environ if env is None else env
    default = 4096 * 8 * 1024 if tuple(capability) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    pairs = re.findall(r":([0-9]+):([0-9]+)", env.get("CUBLAS_WORKSPACE_CONFIG", ""))
    if not pairs:
        return default
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


def cublaslt_workspace_bytes(cublas, env=None):
    """The cuBLASLt workspace of a handle and stream (getCUDABlasLtWorkspace):
    CUBLASLT_WORKSPACE_SIZE KiB (1024), no more than the cuBLAS workspace;
    none of its own under TORCH_CUBLASLT_UNIFIED_WORKSPACE=1, which shares
    the cuBLAS one."""
    env = os.environ if env is None else env
    if env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").strip().lower() in ("1", "true", "yes", "on"):
        return 0
    try:
        kib = int(env.get("CUBLASLT_WORKSPACE_SIZE", "1024"))
    except ValueError:
        kib = 1024
    return min(kib * 1024, cublas)


# The CUDA autocast lists (aten/src/ATen/autocast_mode.h), by the name of
# the Python call that reaches them: applied where meta stands in for
# cuda, whose tensors PyTorch's own autocast does not see.
_AUTOCAST_LOWER = frozenset("""
    linear matmul __matmul__ __rmatmul__ mm bmm addmm baddbmm addbmm addmv mv addr einsum chain_matmul multi_dot
    linalg_multi_dot linalg_vecdot conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc
    convolution _convolution prelu lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell scaled_dot_product_attention
""".split())
_AUTOCAST_FP32 = frozenset("""
    acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow __pow__ softplus layer_norm
    group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d
    hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
    soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm
    logsumexp upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d upsample_bilinear2d
    upsample_trilinear3d upsample_bicubic2d interpolate
""".split())
_AUTOCAST_FP32_DTYPE = frozenset("softmax log_softmax sum prod cumsum cumprod linalg_vector_norm".split())
_AUTOCAST_PROMOTE = frozenset("addcdiv addcmul atan2 bilinear cross dot vdot tensordot cat stack index_put scatter_add".split())

# Aten ops that take a cuBLAS handle, and so its workspace.
_CUBLAS_OPS = frozenset("mm addmm bmm baddbmm addbmm addmv mv dot vdot _addmm_activation _scaled_mm _int_mm".split())

# Aten ops whose output size depends on tensor values.
_VALUE_SIZED = frozenset("""
    nonzero nonzero_static masked_select unique _unique _unique2 unique_dim unique_consecutive unique_dim_consecutive
    argwhere bincount repeat_interleave _local_scalar_dense item index histc
""".split())


# ---------------------------------------------------------------- the requests


class Recorder:
    """The requests the script makes of the CUDA caching allocator, as
    _record_memory_history records them: alloc, then free_requested and
    free_completed, each once per storage, with frames and annotations.

    Times are a logical clock, the requests made so far (an estimate has
    no real times): a request's entries share its time, and a region that
    starts before request n has time n."""

    BASE = 0x7F0000000000  # where the stand-in addresses start: one per storage, never reused

    def __init__(self, torch, stand_in, steps, cublas, cublaslt, deadline=None, key=None):
        self.torch = torch
        self.is_stand_in = stand_in  # tensor -> bool: on the stand-in device
        # a storage's identity while it lives: the StorageImpl (a meta
        # storage has no data pointer); a real run may give the pointer
        self.key = key or (lambda st: st._cdata)
        self.steps_wanted = steps
        self.cublas, self.cublaslt = cublas, cublaslt
        self.deadline = deadline
        self.entries = []
        self.annotations = []
        self.clock = 0  # requests so far: the entries' and annotations' time_us
        self.live = {}  # storage id -> [addr, size, weak ref]
        self.next_addr = self.BASE
        self.stacks = {}  # interned frames: the same list for the same stack (pickled once)
        self.allocated = 0  # rounded as the allocator rounds, for memory_allocated()
        self.peak = 0
        self.steps = 0
        self.recording = True
        self.values = 0  # stand-in values the script read
        self.value_sites = []
        self.failure = None  # the first op that could not run: (op, where, message)
        self.workspaces = {}  # (kind, thread) -> bytes
        self.backward_codes = set()
        self.main_thread = threading.get_ident()
        self.script_files = set()
        import torch.multiprocessing.reductions as red

        self._weak = red.StorageWeakRef
        storage_cls = getattr(torch, "UntypedStorage", None) or torch.Storage
        self._expired = storage_cls._expired
        for fn in (getattr(torch.autograd, "backward", None), getattr(torch.autograd, "grad", None),
                   getattr(getattr(torch.autograd, "graph", None), "_engine_run_backward", None)):
            if fn is not None and hasattr(fn, "__code__"):
                self.backward_codes.add(fn.__code__)

    # -- frames -----------------------------------------------------------

    def frames(self):
        """The Python frames of the call being served, innermost first, up
        to the script's module, without this module's, the modes', or the
        duplicate entry of a function a mode intercepted. Inside autograd's
        backward there are none but those of Python code the engine calls
        (custom Functions, hooks, checkpoints' recomputation): on a GPU the
        engine runs on a thread of its own. Returns (frames, in_backward)."""
        out = []
        f = sys._getframe(2)
        skip_caller = False
        backward = False
        while f is not None:
            code = f.f_code
            if code in self.backward_codes:
                backward = True
                break
            name = code.co_filename
            if _machinery(name):
                # the Python function that handed itself to a mode runs
                # again inside it: its first frame is not the real run's
                skip_caller = skip_caller or code.co_name == "handle_torch_function"
                f = f.f_back
                continue
            if skip_caller:
                skip_caller = False
            else:
                out.append((name, f.f_lineno, code.co_name))
                if code.co_name == "<module>" and name in self.script_files:
                    break  # what runs the script (runpy, this module) is not the job's
            f = f.f_back
        key = tuple(out)
        frames = self.stacks.get(key)
        if frames is None:
            frames = [{"name": n, "filename": fn, "line": ln} for fn, ln, n in key]
            self.stacks[key] = frames
        return frames, backward

    def where(self):
        """The script's line of the call being served ("train.py:42"): the
        innermost frame in the script's own files, else outside PyTorch."""
        frames, _ = self.frames()
        for fr in frames:
            if os.path.abspath(fr["filename"]) in self.script_files:
                return "%s:%d" % (fr["filename"], fr["line"])
        for fr in frames:
            if "/torch/" not in fr["filename"].replace("\\", "/"):
                return "%s:%d" % (fr["filename"], fr["line"])
        return "%s:%d" % (frames[0]["filename"], frames[0]["line"]) if frames else "(no Python frame)"

    # -- requests -----------------------------------------------------------

    def _entry(self, action, addr, size, frames):
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": self.clock, "frames": frames})

    def alloc(self, size, frames, key=None, weak=None):
        addr = self.next_addr
        self.next_addr += (size + 511) // 512 * 512 or 512
        self.clock += 1
        self._entry("alloc", addr, size, frames)
        self.allocated += _rounded(size)
        self.peak = max(self.peak, self.allocated)
        if key is not None:
            self.live[key] = [addr, size, weak]
        return addr

    def free(self, key, frames):
        addr, size, _ = self.live.pop(key)
        self.clock += 1
        self._entry("free_requested", addr, size, frames)
        self._entry("free_completed", addr, size, frames)
        self.allocated -= _rounded(size)

    def poll(self):
        """Frees the storages PyTorch freed since the last call: before the
        op about to run, as the allocator saw them."""
        expired = self._expired
        dead = [k for k, v in self.live.items() if expired(v[2].cdata)]
        if dead:
            frames, _ = self.frames()
            for k in dead:
                self.free(k, frames)

    def storage_of(self, t):
        return t.untyped_storage() if hasattr(t, "untyped_storage") else t._storage()

    def outputs(self, func, args, kwargs, out):
        """Records the storages op func made: its outputs' storages the
        recorder has not seen; then the cuBLAS workspaces of its thread if
        it is the thread's first matrix product."""
        frames = None
        backward = False
        for t in _tensors(out):
            if not self.is_stand_in(t):
                continue
            st = self.storage_of(t)
            key = self.key(st)
            size = st.nbytes()
            have = self.live.get(key)
            if have is not None and have[1] >= size:
                continue
            if frames is None:
                frames, backward = self.frames()
            if have is not None:  # resized: a new buffer, the old one freed
                self.free(key, frames)
            if size > 0:
                self.alloc(size, frames, key, self._weak(st))
        name = _op_name(func)
        if name in _CUBLAS_OPS and any(self.is_stand_in(t) for t in _tensors(args)):
            if frames is None:
                frames, backward = self.frames()
            # autograd's engine has a thread of its own on a GPU: its
            # handle, its workspace (meta runs it on the script's)
            thread = "autograd" if backward or threading.get_ident() != self.main_thread else "main"
            self.workspace("cuBLAS workspace", thread, self.cublas, frames)
            if self.cublaslt and _lt_addmm(name, args, kwargs, self.torch):
                self.workspace("cuBLASLt workspace", thread, self.cublaslt, frames)

    def workspace(self, kind, thread, size, frames):
        if (kind, thread) in self.workspaces or size == 0:
            return
        self.workspaces[(kind, thread)] = size
        self.alloc(size, frames)  # held for the process's life: never freed

    # -- steps and regions ------------------------------------------------

    def region(self, stage, name):
        if not self.recording:
            return
        self.annotations.append({"stage": stage, "name": name, "device": 0, "time_us": self.clock})
        if stage == "END" and name.startswith("Optimizer.step#"):
            self.steps += 1
            if self.steps_wanted and self.steps >= self.steps_wanted:
                self.stop("steps")

    def stop(self, reason):
        self.recording = False
        raise _Stop(reason)

    def check_time(self):
        if self.deadline is not None and time.monotonic() > self.deadline and self.recording:
            self.stop("time")

    def value(self):
        """A value the script read: counted, and where the first few were.
        Reading it is an op that reaches the device: what was freed
        before it is freed there."""
        if self.recording:
            self.poll()
        self.values += 1
        if len(self.value_sites) < 3:
            site = self.where()
            if site not in self.value_sites:
                self.value_sites.append(site)


_SELF_FILE = os.path.splitext(os.path.abspath(__file__))[0]
_WATCH_FILE = os.path.join(os.path.dirname(_SELF_FILE), "vramscope_watch")
_MODE_FILES = tuple(os.path.join("torch", p) for p in ("overrides.py", os.path.join("utils", "_python_dispatch.py"), "_ops.py"))
_SUBCLASSES = os.path.join("torch", "_subclasses", "")


def _machinery(filename):
    """Frames no real run has: this module's and the watcher's, and those
    of the modes (FakeTensorMode's included)."""
    return os.path.splitext(filename)[0] in (_SELF_FILE, _WATCH_FILE) or filename.endswith(_MODE_FILES) or _SUBCLASSES in filename


def _rounded(size):
    """The block the allocator gives for size (round_size: 512 B steps)."""
    return max(512, (size + 511) // 512 * 512)


def _op_name(func):
    """aten.addmm.default -> addmm."""
    s = getattr(func, "__name__", "") or str(func)
    s = s.split(".")[0] if "." in s else s
    return s


def _tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


def _lt_addmm(name, args, kwargs, torch):
    """Whether addmm takes cuBLASLt's path (addmm_out_cuda_impl's
    useLtInterface: a 1-D bias, 2-D matrices over 1 in both sizes, float,
    half or bfloat16, alpha and beta 1)."""
    if name not in ("addmm", "_addmm_activation") or len(args) < 3:
        return False
    bias, a, b = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (bias, a, b)):
        return False
    if bias.dim() != 1 or a.dim() != 2 or b.dim() != 2 or a.shape[0] <= 1 or b.shape[0] <= 1 or b.shape[1] <= 1:
        return False
    if a.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    return kwargs.get("alpha", 1) == 1 and kwargs.get("beta", 1) == 1


# ---------------------------------------------------------------- the stand-in device


class _Properties:
    """torch.cuda.get_device_properties() of the stand-in device."""

    def __init__(self, name, total, capability):
        self.name = name
        self.total_memory = total
        self.major, self.minor = capability
        self.multi_processor_count = 132
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.uuid = "00000000-0000-0000-0000-000000000000"
        self.L2_cache_size = 50 * MiB
        self.gcnArchName = ""

    def __repr__(self):
        return "_CudaDeviceProperties(name=%r, major=%d, minor=%d, total_memory=%dMB, multi_processor_count=%d)" % (
            self.name, self.major, self.minor, self.total_memory // MiB, self.multi_processor_count)


class _NoOp:
    """A stream, an event or a context that does nothing."""

    def __init__(self, *args, **kwargs):
        self.device = None
        self.cuda_stream = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __call__(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: {"query": True, "elapsed_time": 0.0}.get(name)

    def __eq__(self, other):
        return isinstance(other, _NoOp)

    def __hash__(self):
        return 0


def _patch(obj, name, value, undo):
    """Sets obj.name to value; undo gets what puts it back."""
    old = getattr(obj, name, _MISSING)
    setattr(obj, name, value)
    undo.append(lambda: delattr(obj, name) if old is _MISSING else setattr(obj, name, old))


_MISSING = object()


def _stand_in_cuda(torch, rec, props, fake_device, undo):
    """torch.cuda answering as the stand-in device would: its properties;
    memory from the recorder's count; synchronize, streams, events and the
    random state as no-ops. fake_device: CUDA is only faked (no GPU),
    else the real one answers what it can."""
    cuda = torch.cuda
    p = lambda name, value: _patch(cuda, name, value, undo)  # noqa: E731
    allocated = lambda *a, **k: rec.allocated  # noqa: E731
    peak = lambda *a, **k: rec.peak  # noqa: E731

    def reset_peak(*a, **k):
        rec.peak = rec.allocated

    def stats(*a, **k):
        return {"allocated_bytes.all.current": rec.allocated, "allocated_bytes.all.peak": rec.peak,
                "reserved_bytes.all.current": rec.allocated, "reserved_bytes.all.peak": rec.peak}

    p("memory_allocated", allocated)
    p("max_memory_allocated", peak)
    p("memory_reserved", allocated)  # segments come from vramscope's replay, not from here
    p("max_memory_reserved", peak)
    p("reset_peak_memory_stats", reset_peak)
    p("reset_max_memory_allocated", reset_peak)
    p("reset_max_memory_cached", reset_peak)
    p("memory_stats", stats)
    p("memory_summary", lambda *a, **k: "vramscope estimate: %s allocated (peak %s), estimated on a CPU, not recorded"
      % (format_bytes(rec.allocated), format_bytes(rec.peak)))
    p("mem_get_info", lambda *a, **k: (max(0, props.total_memory - rec.allocated), props.total_memory))
    p("empty_cache", lambda *a, **k: None)
    p("synchronize", lambda *a, **k: None)
    if hasattr(cuda, "memory"):
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                     "reset_peak_memory_stats", "memory_stats", "mem_get_info", "empty_cache"):
            if hasattr(cuda.memory, name):
                _patch(cuda.memory, name, getattr(cuda, name), undo)
    if not fake_device:
        return
    p("is_available", lambda: True)
    p("is_initialized", lambda: True)
    p("init", lambda: None)
    p("_lazy_init", lambda: None)
    p("device_count", lambda: 1)
    p("current_device", lambda: 0)
    p("set_device", lambda *a, **k: None)
    p("get_device_name", lambda *a, **k: props.name)
    p("get_device_capability", lambda *a, **k: (props.major, props.minor))
    p("get_device_properties", lambda *a, **k: props)
    p("get_arch_list", lambda: ["sm_%d%d" % (props.major, props.minor)])
    p("is_bf16_supported", lambda *a, **k: props.major >= 8)
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_rng_state_all"):
        p(name, lambda *a, **k: None)
    p("initial_seed", lambda: 0)
    p("get_rng_state", lambda *a, **k: torch.zeros(16, dtype=torch.uint8))
    p("get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8)])
    for name in ("Stream", "Event", "stream", "StreamContext", "device", "device_of", "ExternalStream"):
        p(name, _NoOp)
    p("current_stream", lambda *a, **k: _NoOp())
    p("default_stream", lambda *a, **k: _NoOp())
    p("set_stream", lambda *a, **k: None)
    p("set_per_process_memory_fraction", lambda *a, **k: None)
    if hasattr(cuda, "nvtx"):
        for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
            _patch(cuda.nvtx, name, lambda *a, **k: 0, undo)
        _patch(cuda.nvtx, "range", _NoOp, undo)
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        _patch(torch._C, "_cuda_clearCublasWorkspaces", lambda: None, undo)


def _restore(undo):
    """Undoes what was patched, last first."""
    while undo:
        try:
            undo.pop()()
        except AttributeError:
            pass


def _regions(torch, rec, undo):
    """record_function regions (ProfilerStep#N, Optimizer.step#AdamW.step)
    as annotations, as _record_memory_history records them."""
    cls = torch.autograd.profiler.record_function
    enter, exit_ = cls.__enter__, cls.__exit__

    def __enter__(self):
        out = enter(self)
        rec.region("START", self.name)
        return out

    def __exit__(self, *exc):
        out = exit_(self, *exc)
        rec.region("END", self.name)
        return out

    _patch(cls, "__enter__", __enter__, undo)
    _patch(cls, "__exit__", __exit__, undo)


def _checkpointing(torch, rec, class_name, undo):
    """Every module of class class_name runs under torch.utils.checkpoint
    (non-reentrant, as apply_activation_checkpointing wraps modules) while
    it trains; returns a list that counts the calls wrapped."""
    import torch.utils.checkpoint as cp

    module = torch.nn.Module
    call = module.__call__
    wrapped = [0]
    import inspect

    non_reentrant = "use_reentrant" in inspect.signature(cp.checkpoint).parameters

    def matches(m):
        cls = type(m)
        return class_name in (cls.__name__, cls.__qualname__, "%s.%s" % (cls.__module__, cls.__qualname__))

    def __call__(self, *args, **kwargs):
        if not (matches(self) and self.training and torch.is_grad_enabled()):
            return call(self, *args, **kwargs)
        wrapped[0] += 1

        def run(*a, **k):
            return call(self, *a, **k)

        if non_reentrant:
            return cp.checkpoint(run, *args, use_reentrant=False, **kwargs)
        return cp.checkpoint(run, *args, **kwargs)

    _patch(module, "__call__", __call__, undo)
    return wrapped


def _stand_in_values(torch, rec):
    """Handlers for the calls that read a tensor's values: a stand-in (0,
    False, zeros on the CPU), counted."""
    T = torch.Tensor

    def zero(t):
        if t.dtype == torch.bool:
            return False
        return 0.0 if (t.is_floating_point() or t.is_complex()) else 0

    def item(args, kwargs):
        rec.value()
        return zero(args[0])

    def tolist(args, kwargs):
        rec.value()
        t = args[0]
        z = zero(t)

        def nest(shape):
            return z if not shape else [nest(shape[1:]) for _ in range(shape[0])]

        return nest(list(t.shape))

    def scalar(cast):
        def f(args, kwargs):
            rec.value()
            return cast(zero(args[0]))

        return f

    def fmt(args, kwargs):
        t, spec = args[0], args[1] if len(args) > 1 else ""
        if t.dim() == 0:
            rec.value()
            return format(zero(t), spec)
        return format(shown(args, kwargs), spec)

    def on_cpu(args, kwargs):
        rec.value()
        t = args[0]
        return torch.zeros(t.shape, dtype=t.dtype)

    def numpy(args, kwargs):
        return on_cpu(args, kwargs).numpy()

    def shown(args, kwargs):
        rec.value()
        t = args[0]
        return "tensor(<not computed: estimated on a CPU>, size=%s, dtype=%s, device='cuda:0')" % (tuple(t.shape), t.dtype)

    return {T.item: item, T.tolist: tolist, T.__bool__: scalar(bool), T.__int__: scalar(int), T.__float__: scalar(float),
            T.__index__: scalar(int), T.__format__: fmt, T.cpu: on_cpu, T.numpy: numpy, T.__repr__: shown}


def _is_cuda(d):
    """Whether a device argument names CUDA (ints are CUDA ordinals)."""
    import torch

    if isinstance(d, str):
        return d == "cuda" or d.startswith("cuda:")
    if isinstance(d, torch.device):
        return d.type == "cuda"
    return isinstance(d, int) and not isinstance(d, bool)


def _meta_modes(torch, rec):
    """The modes that make meta stand in for cuda: a TorchFunctionMode
    that moves device arguments, answers device queries, reads values
    and applies CUDA autocast, and the dispatch mode that records."""
    from torch.overrides import TorchFunctionMode

    T = torch.Tensor
    cuda0 = torch.device("cuda", 0)
    meta = torch.device("meta")
    values = _stand_in_values(torch, rec)
    getters = {T.device.__get__: lambda t: cuda0 if t.is_meta else t.device,
               T.is_cuda.__get__: lambda t: t.is_meta or t.is_cuda}
    to_meta = {T.to, T.new_empty, T.new_zeros, T.new_ones, T.new_full, T.new_tensor}
    cast_cache = {}
    lower_types = {torch.float16, torch.bfloat16}

    def device_args(func, args, kwargs):
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = meta
        if func is T.to:
            args = tuple(meta if i > 0 and _is_cuda(a) else a for i, a in enumerate(args))
        return args, kwargs

    def cast(t, dtype, cache):
        if not (isinstance(t, T) and t.is_meta and t.is_floating_point() and t.dtype != torch.float64 and t.dtype != dtype):
            return t
        if cache and t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view():
            key = (id(t), dtype)
            hit = cast_cache.get(key)
            if hit is None or hit[0]() is not t:
                import weakref

                hit = cast_cache[key] = (weakref.ref(t), t.to(dtype))
            return hit[1]
        return t.to(dtype)

    def cast_all(x, dtype, cache=False):
        if isinstance(x, (list, tuple)):
            return type(x)(cast_all(y, dtype, cache) for y in x)
        return cast(x, dtype, cache)

    def cast_args(args, kwargs, dtype, cache=False):
        """The casts in the order PyTorch's autocast makes them: its
        kernels cast their arguments as C++ function arguments, which GCC
        evaluates last first (a real recording's linear casts its bias,
        then its weight, then its input)."""
        kw = {k: cast_all(v, dtype, cache) for k, v in reversed(list(kwargs.items()))}
        out = [cast_all(a, dtype, cache) for a in reversed(args)]
        return tuple(reversed(out)), {k: kw[k] for k in kwargs}

    def autocast(name, args, kwargs):
        """torch.autocast("cuda")'s casts, as its lists say."""
        lower = torch.get_autocast_gpu_dtype()
        if name in _AUTOCAST_LOWER:
            return cast_args(args, kwargs, lower, True)
        if name in _AUTOCAST_FP32:
            return cast_args(args, kwargs, torch.float32)
        if name in _AUTOCAST_FP32_DTYPE:
            t = args[0] if args else None
            if isinstance(t, T) and t.is_meta and t.dtype in lower_types and kwargs.get("dtype") is None and len(args) < 3:
                kwargs = dict(kwargs, dtype=torch.float32)
            return args, kwargs
        if name in _AUTOCAST_PROMOTE:
            ts = [t for t in _tensors((args, kwargs)) if t.is_meta and t.is_floating_point()]
            if ts:
                widest = max((t.dtype for t in ts), key=lambda d: torch.finfo(d).bits)
                return cast_args(args, kwargs, widest)
        return args, kwargs

    class CudaOnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            get = getters.get(func)
            if get is not None:
                return get(args[0])
            if func in values and isinstance(args[0], T) and args[0].is_meta:
                return values[func](args, kwargs)
            if func is T.backward:
                # autograd's engine runs with this mode on, so that what it
                # calls back (checkpoints' recomputation) is stood in too
                t, rest = args[0], args[1:]
                names = ("gradient", "retain_graph", "create_graph", "inputs")
                kw = dict(zip(names, rest), **kwargs)
                with self:
                    return torch.autograd.backward(t, kw.get("gradient"), kw.get("retain_graph"), kw.get("create_graph", False),
                                                   inputs=kw.get("inputs"))
            if func is T.record_stream or func is T.pin_memory:
                return args[0] if func is T.pin_memory else None
            if func is T.cuda:  # x.cuda(device, non_blocking): a copy to the stand-in, as x.to("cuda")
                func, args = T.to, (args[0], meta)
                kwargs = {k: v for k, v in kwargs.items() if k in ("non_blocking", "memory_format")}
            elif func is T.type and len(args) > 1 and isinstance(args[1], str) and args[1].startswith("torch.cuda."):
                # x.type("torch.cuda.HalfTensor"): that dtype on the stand-in
                legacy = getattr(torch, args[1][len("torch.cuda."):], None)
                func, args, kwargs = T.to, (args[0], meta, getattr(legacy, "dtype", torch.float32)), {}
            elif func in to_meta or "device" in kwargs:
                args, kwargs = device_args(func, args, kwargs)
            if torch.is_autocast_enabled():
                name = getattr(func, "__name__", "")
                if name in ("cross_entropy", "cross_entropy_loss"):
                    return cross_entropy(func, args, kwargs)
                args, kwargs = autocast(name, args, kwargs)
            return func(*args, **kwargs)

    def cross_entropy(func, args, kwargs):
        """Under CUDA autocast, cross_entropy is log_softmax in float32 and
        nll_loss: a lower-precision input is not copied."""
        x = args[0]
        simple = isinstance(x, T) and x.is_meta and x.dtype in lower_types and not kwargs.get("label_smoothing") and \
            len(args) <= 2 and x.dim() >= 1
        if not simple:
            return func(*args, **kwargs)
        import torch.nn.functional as F

        target = args[1] if len(args) > 1 else kwargs.pop("target")
        kw = {k: v for k, v in kwargs.items() if k in ("weight", "ignore_index", "reduction")}
        return F.nll_loss(torch.log_softmax(x, 1 if x.dim() > 1 else 0, dtype=torch.float32), target, **kw)

    def clear_cache():
        cast_cache.clear()

    return CudaOnMeta, clear_cache


def _watch_mode(torch, rec):
    """The dispatch mode that records: before each op the storages freed
    since the last; after it those it made."""
    from torch.utils._python_dispatch import TorchDispatchMode

    detach = torch.ops.aten.detach.default

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is detach and args and not isinstance(args[0], torch.Tensor):
                # PyTorch 1.13 hands a mode a wrapped number as the Python
                # scalar it was (a checkpoint's pack hook detaches mul's)
                return torch.tensor(args[0])
            if rec.recording:
                rec.poll()
                rec.check_time()
            try:
                out = func(*args, **kwargs)
            except _Stop:
                raise
            except NotImplementedError as e:
                # An op that only writes into the tensors it is given makes
                # no storage: without a kernel for it, nothing is missed.
                done, out = _written_in_place(func, args, kwargs)
                if not done:
                    if rec.failure is None and rec.recording and any(rec.is_stand_in(t) for t in _tensors((args, kwargs))):
                        rec.failure = (str(func), rec.where(), e)
                    raise
            except Exception as e:
                if rec.failure is None and rec.recording and any(rec.is_stand_in(t) for t in _tensors((args, kwargs))):
                    rec.failure = (str(func), rec.where(), e)
                raise
            if rec.recording:
                rec.outputs(func, args, kwargs, out)
            return out

    return Watch


def _written_in_place(func, args, kwargs):
    """For an op whose every result is one of the tensors it writes into
    (GradScaler's unscale and update, say): (True, those results). Else
    (False, None)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False, None
    written = {}
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is not None and info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for name in info.before_set:
                written[name] = value
    results = []
    for r in schema.returns:
        info = r.alias_info
        if info is None or not info.is_write or not info.before_set or next(iter(info.before_set)) not in written:
            return False, None
        results.append(written[next(iter(info.before_set))])
    if not written:
        return False, None
    if not results:
        return True, None
    return True, results[0] if len(results) == 1 else tuple(results)


# ---------------------------------------------------------------- running the script


def _fake_cuda_works(torch):
    """Whether FakeTensorMode can fake the CUDA device here: a CUDA build
    with a GPU (without one, autograd's engine needs what a CPU build
    lacks), and a PyTorch whose FakeTensorMode makes factory tensors."""
    try:
        from torch._subclasses import fake_tensor
    except ImportError:
        return False
    try:
        return hasattr(fake_tensor, "FakeTensorMode") and bool(torch.version.cuda) and torch.cuda.is_available()
    except Exception:
        return False


def _op_failure_message(op, where, err, torch_version):
    name = op.split(".")[1] if op.startswith("aten.") else op
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if name in _VALUE_SIZED:
        why = "its output's size depends on tensor values, which an estimate does not compute"
    elif isinstance(err, NotImplementedError) or "Meta" in first or "meta" in first:
        why = "the stand-in device cannot run it: PyTorch %s has no meta kernel for it" % torch_version
    else:
        why = first
    return "%s: %s failed on the stand-in device: %s" % (where, op, why)


def _install(torch, rec, props, stand_in, checkpoint, undo):
    """Stands in for CUDA (patches torch.cuda, enters the modes), records
    regions, wraps the checkpointed class; undo gets what takes it all
    back. Returns the count of checkpointed calls (a one-item list)."""
    _stand_in_cuda(torch, rec, props, stand_in == "meta", undo)
    _regions(torch, rec, undo)
    wrapped = _checkpointing(torch, rec, checkpoint, undo) if checkpoint else [0]
    if stand_in == "meta":
        mode_cls, clear_cache = _meta_modes(torch, rec)
        clear = torch.clear_autocast_cache

        def clear_autocast_cache():
            clear_cache()
            clear()

        _patch(torch, "clear_autocast_cache", clear_autocast_cache, undo)
        # nn.Module.cuda() makes new parameters of the stand-in's tensors
        # rather than swapping their data in place
        old = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        undo.append(lambda: torch.__future__.set_overwrite_module_params_on_conversion(old))
        modes = [mode_cls(), _watch_mode(torch, rec)()]
    else:
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        from torch.overrides import TorchFunctionMode

        vals = _stand_in_values(torch, rec)

        class Values(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in vals and isinstance(args[0], FakeTensor):
                    return vals[func](args, kwargs or {})
                return func(*args, **(kwargs or {}))

        # optimizers pick their multi-tensor path as for real CUDA tensors
        supported = getattr(torch.optim.optimizer, "_foreach_supported_types", None)
        if isinstance(supported, list):
            _patch(torch.optim.optimizer, "_foreach_supported_types", supported + [FakeTensor], undo)
        modes = [FakeTensorMode(allow_non_fake_inputs=True), Values(), _watch_mode(torch, rec)()]
    for m in modes:
        m.__enter__()
        undo.append(lambda m=m: m.__exit__(None, None, None))
    return wrapped


def _run(script, args, rec, time_limit, undo):
    """Runs the script as python would, to its end, the steps wanted or
    the time limit; returns which ("end", "steps", "time")."""
    import runpy

    if time_limit and hasattr(signal, "SIGALRM"):
        def alarm(signum, frame):
            if rec.recording:
                rec.stop("time")

        old = signal.signal(signal.SIGALRM, alarm)
        undo.append(lambda: signal.signal(signal.SIGALRM, old))
        signal.setitimer(signal.ITIMER_REAL, time_limit)
        undo.append(lambda: signal.setitimer(signal.ITIMER_REAL, 0))
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script] + list(args)
    sys.path[0:1] = [os.path.dirname(script)]
    try:
        runpy.run_path(script, run_name="__main__")
        return "end"
    except _Stop as s:
        return s.reason
    except SystemExit as e:
        if e.code not in (None, 0):
            raise EstimateError("%s exited with status %s before the estimate was done" % (script, e.code))
        return "end"
    finally:
        rec.recording = False
        sys.argv, sys.path[:] = old_argv, old_path


def estimate(script, args=(), steps=3, device_memory=80 * GiB, capability=(9, 0), checkpoint=None, time_limit=600.0,
             stand_in=None, name=None, workspaces=True):
    """Runs script (with args as its sys.argv[1:]) with CUDA stood in for
    and returns the snapshot dict. steps: stop after that many optimizer
    steps (0: run to the end). stand_in: "meta" or "fake" (default: fake
    where the installed PyTorch can fake CUDA). workspaces: add the cuBLAS
    workspaces as PyTorch allocates them. Raises EstimateError."""
    try:
        import torch
    except ImportError as e:
        raise EstimateError("this Python (%s) cannot import torch (%s): run the estimate with the Python of your PyTorch "
                            "environment (vramscope estimate --python PATH)" % (sys.executable, e))
    if stand_in is None:
        stand_in = "fake" if _fake_cuda_works(torch) else "meta"
    if stand_in == "fake" and not _fake_cuda_works(torch):
        raise EstimateError("--stand-in fake needs a CUDA build of PyTorch with a GPU (FakeTensorMode cannot fake CUDA here); "
                            "--stand-in meta works anywhere")
    cublas = cublas_workspace_bytes(capability) if workspaces else 0
    deadline = time.monotonic() + time_limit if time_limit else None
    if stand_in == "fake":
        from torch._subclasses.fake_tensor import FakeTensor

        def on_stand_in(t):
            return isinstance(t, FakeTensor) and t.device.type == "cuda"
    else:
        def on_stand_in(t):
            return t.is_meta

    rec = Recorder(torch, on_stand_in, steps, cublas, cublaslt_workspace_bytes(cublas) if workspaces else 0, deadline)
    script = os.path.abspath(script)
    rec.script_files.add(script)
    rec.script_files.add(os.path.realpath(script))
    props = _Properties(name or "NVIDIA stand-in (%s, sm_%d%d)" % (format_bytes(device_memory), capability[0], capability[1]),
                        device_memory, capability)
    undo = []
    started = time.monotonic()
    try:
        wrapped = _install(torch, rec, props, stand_in, checkpoint, undo)
        stopped = _run(script, args, rec, time_limit, undo)
    except (EstimateError, KeyboardInterrupt):
        raise
    except BaseException as e:
        if rec.failure is not None:
            raise EstimateError(_op_failure_message(rec.failure[0], rec.failure[1], rec.failure[2], torch.__version__))
        import traceback

        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        raise EstimateError("%s raised %s under the estimate:\n%s" % (os.path.basename(script), type(e).__name__, tb))
    finally:
        _restore(undo)
    if rec.failure is not None:
        # the script caught the error and went on: what it measured is not the job's
        raise EstimateError(_op_failure_message(rec.failure[0], rec.failure[1], rec.failure[2], torch.__version__))
    if stopped == "time" and rec.steps == 0:
        raise EstimateError("%s ran %.0f s (the time limit, --time-limit) without reaching an optimizer step: "
                            "estimate a script that trains (an optimizer's step() ends a step), or give it more time"
                            % (os.path.basename(script), time_limit))
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    added = []
    for (kind, thread), size in sorted(rec.workspaces.items()):
        for a in added:
            if a["name"] == kind and a["bytes"] == size:
                a["count"] += 1
                break
        else:
            added.append({"name": kind, "bytes": size, "count": 1})
    mark = {
        "version": 1,
        "script": os.path.basename(script),
        "argv": list(args),
        "stand_in": stand_in,
        "torch": str(torch.__version__),
        "device_name": props.name,
        "device_memory": device_memory,
        "compute_capability": list(capability),
        "steps": rec.steps,
        "steps_wanted": steps,
        "stopped": stopped,
        "seconds": round(time.monotonic() - started, 3),
        "values_not_computed": rec.values,
        "value_sites": rec.value_sites,
        "checkpoint": checkpoint or "",
        "checkpointed_calls": wrapped[0],
        "added": added,
        "outside_allocator": [
            {"name": "the CUDA context", "bytes": CONTEXT_BYTES, "note": "a usual figure, not measured"},
            {"name": "NCCL's buffers", "bytes": 0, "note": "when the job communicates: not estimated"},
        ],
    }
    return {
        "segments": [],
        "device_traces": [rec.entries],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
        "external_annotations": rec.annotations,
        MARK: mark,
    }


def write(snap, path):
    """Writes the snapshot whole or not at all."""
    with open(path + ".part", "wb") as f:
        pickle.dump(snap, f, protocol=4)
    os.replace(path + ".part", path)


def summary(snap):
    m = snap[MARK]
    entries = snap["device_traces"][0]
    live = peak = 0
    for e in entries:
        if e["action"] == "alloc":
            live += _rounded(e["size"])
            peak = max(peak, live)
        elif e["action"] == "free_completed":
            live -= _rounded(e["size"])
    allocs = sum(1 for e in entries if e["action"] == "alloc")
    steps = "%d optimizer step%s" % (m["steps"], "" if m["steps"] == 1 else "s")
    why = {"steps": "", "end": " (the script ended)", "time": " (the time limit ended it)"}[m["stopped"]]
    lines = ["vramscope: estimated on a CPU, not recorded: %s of %s%s; %d requests, peak allocated %s (vramscope replays "
             "them through the allocator for what it reserves; stand-in: %s, PyTorch %s, %.1f s)"
             % (steps, m["script"], why, allocs, format_bytes(peak), m["stand_in"], m["torch"], m["seconds"])]
    for a in m["added"]:
        lines.append("vramscope: added %d× %s of %s, as PyTorch allocates them" % (a["count"], a["name"], format_bytes(a["bytes"])))
    if m["values_not_computed"]:
        lines.append("vramscope: the script read %d values (%s): each is a stand-in 0, not computed"
                     % (m["values_not_computed"], ", ".join(m["value_sites"])))
    if m["checkpoint"] and not m["checkpointed_calls"]:
        lines.append("vramscope: --checkpoint %s: no module of that class ran while training" % m["checkpoint"])
    return "\n".join(lines)


def _post(url, token, snap, name, out):
    """Uploads the estimate (POST /api/traces); returns the trace's link."""
    import json
    import urllib.parse
    import urllib.request

    base = url.rstrip("/")
    q = urllib.parse.urlencode({"name": name})
    headers = {"Content-Type": "application/octet-stream"}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(base + "/api/traces?" + q, data=pickle.dumps(snap, protocol=4), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            got = json.load(resp)
    except Exception as e:
        raise EstimateError("uploading the estimate to %s failed: %s" % (base, e))
    return base + got.get("url", "")


def main(argv=None, prog="python -m vramscope_watch --estimate"):
    p = argparse.ArgumentParser(prog=prog, description="Estimate a PyTorch script's CUDA memory on a CPU: the requests the "
                                "caching allocator would get, as a snapshot vramscope replays through the allocator.")
    p.add_argument("--steps", type=int, default=3, help="stop after this many optimizer steps (default 3; 0: run to the end)")
    p.add_argument("--device-memory", default="80GiB", help="the GPU's memory (default 80GiB)")
    p.add_argument("--capability", default="9.0", help="its compute capability, which sets the cuBLAS workspace (default 9.0: Hopper)")
    p.add_argument("--checkpoint", metavar="CLASS", help="wrap every module of this class in torch.utils.checkpoint")
    p.add_argument("--time-limit", type=float, default=600, help="seconds the script may run (default 600)")
    p.add_argument("--stand-in", choices=("meta", "fake"), help="what stands in for CUDA (default: fake where PyTorch can fake it, else meta)")
    p.add_argument("--out", help="write the snapshot here (default: SCRIPT-estimate.pickle)")
    p.add_argument("--url", help="upload it to this vramscope server instead (default: $VRAMSCOPE_URL when set)")
    p.add_argument("--token", help="the server's token (default: $VRAMSCOPE_TOKEN)")
    p.add_argument("--name", help="the trace's name on the server (default: SCRIPT ARGS (estimate))")
    p.add_argument("--quiet", action="store_true", help="say nothing but errors")
    p.add_argument("script", help="the script to estimate")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    try:
        memory = parse_bytes(a.device_memory)
    except ValueError as e:
        p.error("--device-memory: %s" % e)
    m = re.fullmatch(r"\s*([0-9]+)\.([0-9]+)\s*", a.capability)
    if not m:
        p.error("--capability %r: want MAJOR.MINOR, as 9.0 or 8.0" % a.capability)
    if a.steps < 0:
        p.error("--steps %d: want 0 or more" % a.steps)
    if not os.path.isfile(a.script):
        p.error("%s: no such file" % a.script)
    url = a.url or (None if a.out else os.environ.get("VRAMSCOPE_URL"))
    try:
        snap = estimate(a.script, a.args, steps=a.steps, device_memory=memory, capability=(int(m.group(1)), int(m.group(2))),
                        checkpoint=a.checkpoint, time_limit=a.time_limit, stand_in=a.stand_in)
        if not a.quiet:
            print(summary(snap), file=sys.stderr)
        if url:
            name = a.name or " ".join([os.path.basename(a.script)] + a.args) + " (estimate)"
            link = _post(url, a.token or os.environ.get("VRAMSCOPE_TOKEN"), snap, name, sys.stderr)
            print("vramscope: estimate: %s" % link, file=sys.stderr)
        else:
            out = a.out or os.path.splitext(os.path.basename(a.script))[0] + "-estimate.pickle"
            write(snap, out)
            if not a.quiet:
                print("vramscope: written to %s (vramscope import %s, or vramscope whatif %s)" % (out, out, out), file=sys.stderr)
    except EstimateError as e:
        print("vramscope: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m vramscope_estimate"))
