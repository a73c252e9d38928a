"""Watch a PyTorch job's CUDA memory in vramscope, live or on out-of-memory only.

    import vramscope_watch
    vramscope_watch.watch("http://127.0.0.1:8080")     # token=... when the server has one
    vramscope_watch.watch(url, run="job-42")           # every rank of a job: one run
    vramscope_watch.on_oom(dir="oom/")                 # nothing but PyTorch's recording until an OOM

or, without editing the script (as python -m cProfile does; under torchrun
every rank reports as a rank of one run):

    python -m vramscope_watch --url http://127.0.0.1:8080 train.py ARGS...
    python -m vramscope_watch --on-oom --dir oom/ train.py ARGS...
    torchrun --nproc-per-node 8 -m vramscope_watch --url URL train.py ARGS...

Before there is a GPU, --estimate runs the script on a CPU with CUDA stood
in for and writes (or uploads) the requests it would make of the caching
allocator (vramscope_estimate.py, beside this file):

    python -m vramscope_watch --estimate [--steps 3] [--device-memory 80GiB] train.py ARGS...

watch() turns on PyTorch's memory-history recording (Python frames only
unless stacks="all": C++ frames cost far more to record and to read), and a
background thread reads what the allocator recorded every interval and
streams it to the server over a websocket (/ws/ingest); the trace page
follows it as it comes.

What watching costs. Each read is one torch.cuda.memory._snapshot(), which
holds the GIL while it turns the ring into Python objects (2.9 us an entry
on an H200 with C++ frames). The watcher clears the ring after every read
(so a read costs what is new, not the ring), sends the snapshot as the
pickle it already is (no Python work per entry), and keeps its own time
holding the GIL under `duty` (3 % by default) of the job's: it sizes the
ring to what that time can read. A job that records more than that between
two reads loses the oldest entries of the interval; the server then
records a gap (where, and how many, on the trace page and in the API) and
brings its state to the job's from the snapshot, so the trace stays right
from there on. Even when the ring is not full, the entries the job makes
between a read and its clear (its thread may run there) are lost, and
said. duty=1 never clears: every read converts the whole ring (up to
max_entries), and nothing is lost unless more than that come between two
reads.

Every entry of the next N steps, on request: from the trace page, the
server's API, the job (Watcher.complete(N)), a file (echo N >
/tmp/vramscope-PID.steps) or a signal (kill -USR1 PID: 10 steps), the
watcher clears the ring once, sized for those steps (from the entries a
step made in the reads before), reads nothing until they are over, then
reads the whole ring at once and sends it marked as read whole: no entry
of the steps that began and ended within it is lost. Then it goes back to
its duty cycle. What such a step costs the job is PyTorch's _snapshot()
of its entries, once (see docs/live.md).

On out-of-memory only (on_oom(), or --on-oom): recording is on (PyTorch's
own cost) and nothing else runs until PyTorch's OOM observer fires; then
the snapshot is uploaded (its incident's link is printed) or written to a
folder, one file per rank with the rank in its name, for
`vramscope import --run NAME FOLDER` later.

Standard library only: the websocket client is the few lines it needs,
written here.
"""

import atexit
import base64
import json
import os
import pickle
import re
import select
import signal
import socket
import ssl
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

__all__ = ["watch", "on_oom", "Watcher", "OOMWatcher", "ServerError", "main"]


def _memory():
    import torch

    return torch.cuda.memory


def _record(stacks, max_entries, clear=False):
    """Turns recording on (again), with a ring of max_entries; clear
    empties it."""
    kw = dict(enabled="all", context="all", stacks=stacks, max_entries=max_entries)
    if clear:
        kw["clear_history"] = True
    _memory()._record_memory_history(**kw)


def _can_clear():
    """Whether this PyTorch's _record_memory_history can clear the ring
    (clear_history, in 2.1 and later)."""
    import inspect

    try:
        return "clear_history" in inspect.signature(_memory()._record_memory_history).parameters
    except (TypeError, ValueError):
        return False


def _torch_snapshot():
    return _memory()._snapshot()


def _entry_count(device):
    """About how many entries the allocator has recorded on device, from
    its counters (cheap: no ring is read): each allocation makes an alloc
    and, freed, a free_requested and a free_completed; each segment a
    segment_alloc or _map and a segment_free or _unmap."""
    s = _memory().memory_stats(device)
    seg = s.get("num_device_alloc", s.get("segment.all.allocated", 0)) + s.get("num_device_free", s.get("segment.all.freed", 0))
    return s.get("allocation.all.allocated", 0) + 2 * s.get("allocation.all.freed", 0) + seg + s.get("num_ooms", 0)


def _attach_oom_observer(fn):
    import torch

    torch._C._cuda_attach_out_of_memory_observer(fn)


def _dist_rank():
    """This process's rank and world size: torch.distributed's once it is
    initialised, else torchrun's RANK and WORLD_SIZE, else (None, 0)."""
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
    try:
        rank = int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None, 0
    try:
        return rank, int(os.environ.get("WORLD_SIZE", "0"))
    except ValueError:
        return rank, 0


def _run_name():
    """The run the ranks of this job share by default: $VRAMSCOPE_RUN, or
    torchrun's rendezvous id ($TORCHELASTIC_RUN_ID) when it has one."""
    name = os.environ.get("VRAMSCOPE_RUN")
    if name:
        return name
    rdzv = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return rdzv if rdzv and rdzv != "none" else None


def _current_device():
    try:
        import torch

        return torch.cuda.current_device()
    except Exception:
        return 0


def _prog():
    return os.path.basename(sys.argv[0] or "python") or "python"


class ServerError(Exception):
    """The server refused the stream; retrying would not help."""


class _Ended(ServerError):
    """The server says the trace was ended: by this stream's end, when the
    done that answered it was lost."""


class _WebSocket:
    """A websocket client: text frames out (masked), frames in."""

    def __init__(self, url, headers, timeout=30):
        u = urllib.parse.urlsplit(url)
        secure = u.scheme in ("https", "wss")
        port = u.port or (443 if secure else 80)
        sock = socket.create_connection((u.hostname, port), timeout=timeout)
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=u.hostname)
        self.sock = sock
        self.buf = b""
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET %s HTTP/1.1" % (u.path or "/"),
            "Host: %s:%d" % (u.hostname, port),
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: " + key,
            "Sec-WebSocket-Version: 13",
        ] + ["%s: %s" % kv for kv in headers.items()]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status + " ":
            code = status.split(" ")[1] if " " in status else status
            self.sock.close()
            if code in ("401", "403", "404"):
                raise ServerError("%s: %s" % (url, status))
            raise ConnectionError("%s: %s" % (url, status))

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed")
        self.buf += data

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _frame(self, opcode, payload):
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        # Masking a whole message a byte at a time is slow; do it as one
        # big integer.
        m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        body = (int.from_bytes(payload, "big") ^ m).to_bytes(n, "big") if n else b""
        self.sock.sendall(head + mask + body)

    def send(self, obj):
        self._frame(1, json.dumps(obj, separators=(",", ":")).encode())

    def send_binary(self, data):
        self._frame(2, data)

    def ready(self):
        """Whether a frame can be read without waiting."""
        if self.buf:
            return True
        r, _, _ = select.select([self.sock], [], [], 0)
        return bool(r)

    def recv(self, block=True):
        """The next text message, parsed; answers pings on the way. Not
        to block: None once the frames at hand were only pings."""
        msg = b""
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            mask = self._take(4) if b1 & 0x80 else None
            data = self._take(n)
            if mask:
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
            op = b0 & 0x0F
            if op == 9:
                self._frame(10, data)
            if op in (9, 10) and not block and not msg and not self.ready():
                return None
            if op == 8:
                raise ConnectionError("closed by the server")
            elif op in (0, 1, 2):
                msg += data
                if b0 & 0x80:
                    return json.loads(msg)

    def close(self):
        try:
            self._frame(8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


def _key(e):
    return (e.get("action"), e.get("addr"), e.get("size"), e.get("stream"), e.get("time_us"), e.get("device_free"))


def _annotation_key(a):
    return (a.get("time_us"), a.get("stage"), a.get("name"))


def _headers(token):
    return {"Authorization": "Bearer " + token} if token else {}


def _upload(base, token, snap, name, device, out):
    """Uploads a snapshot (POST /api/traces) and prints its incident's
    link; None when the upload failed (the job matters more)."""
    body = pickle.dumps(snap, protocol=4)
    q = urllib.parse.urlencode({"name": "%s OOM %s" % (name, time.strftime("%Y-%m-%d %H:%M:%S"))})
    req = urllib.request.Request(base + "/api/traces?" + q, data=body, method="POST",
                                 headers=dict(_headers(token), **{"Content-Type": "application/octet-stream"}))
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            got = json.load(resp)
    except Exception as e:
        print("vramscope: uploading the snapshot failed: %s" % e, file=out)
        return None
    for t in got.get("traces", []):
        if t.get("oom_count", 0) > 0 and t.get("device_ordinal", device) == device:
            link = "%s/traces/%s/incidents/%d" % (base, t["id"], t["oom_count"])
            break
    else:
        link = base + got.get("url", "")
    print("vramscope: CUDA out of memory; incident: %s" % link, file=out)
    return link


class _Poll:
    """One read of the ring, as sent: entries [first, end), annotations
    before ann_end, and the message."""

    __slots__ = ("first", "end", "ann_end", "message")

    def __init__(self, first, end, ann_end, message):
        self.first, self.end, self.ann_end, self.message = first, end, ann_end, message


class _Identity:
    """Who the job is: its run, rank, name and device."""

    def __init__(self, device, name, run, rank, world_size):
        self.device = _current_device() if device is None else device
        # Every rank of a job names the same run and the server groups them.
        self.run = run if run is not None else _run_name()
        dist_rank, dist_world = _dist_rank()
        self.rank = rank if rank is not None else dist_rank
        self.world_size = world_size if world_size is not None else dist_world
        if self.run is not None and self.rank is None:
            self.rank = 0
        if self.run is None and rank is not None:
            raise ValueError("vramscope: rank= needs run=, the name every rank of the job gives")
        prog = _prog()
        if self.rank is not None:
            prog = "%s rank %d" % (prog, self.rank)
        # A server lists many jobs' traces: the name says which script and
        # rank, on which machine and device, started when.
        self.name = name or "%s · %s cuda:%d · %s" % (prog, socket.gethostname() or "unknown host", self.device,
                                                     time.strftime("%Y-%m-%d %H:%M:%S"))


class Watcher:
    """Streams one device's allocator entries to a vramscope server.

    snapshot, start_recording, clear and count stand in for PyTorch's calls
    (tests, benchmarks): snapshot() is torch.cuda.memory._snapshot();
    start_recording(n) turns recording on with a ring of n entries;
    clear(n) empties the ring and makes it n entries long (False: it
    cannot); count() is about how many entries have been recorded so far.
    Without clear, each read looks for where the entries it sent end."""

    TAIL = 16  # entries remembered to find where the sent ones end
    MIN_RING = 1000
    STALL = 0.04  # the most one read may hold the GIL, in seconds
    WINDOW_LOOK = 0.25  # seconds of entries a window's ring holds past its steps: a busy machine may keep the watcher from looking
    MAX_MESSAGE = 7 << 20  # under the server's cap on a message (8 MiB by default)

    def __init__(self, url, token=None, device=None, interval=0.5, name=None, max_entries=100000,
                 stacks="python", duty=0.03, snapshot=None, start_recording=None, clear=None, count=None,
                 out=sys.stderr, run=None, rank=None, world_size=None, max_window=1000000, request_file=None):
        if stacks not in ("python", "all"):
            raise ValueError("vramscope: stacks=%r: 'python' or 'all'" % (stacks,))
        if not 0 < duty <= 1:
            raise ValueError("vramscope: duty=%r: a fraction of the job's time, in (0, 1]" % (duty,))
        self.base = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("VRAMSCOPE_TOKEN")
        who = _Identity(device, name, run, rank, world_size)
        self.device, self.run, self.rank, self.world_size, self.name = who.device, who.run, who.rank, who.world_size, who.name
        self.interval = interval
        self.duty = duty
        self.max_entries = max_entries
        if snapshot is None:
            self._snapshot = _torch_snapshot
            self._start_recording = lambda n: _record(stacks, n)
            self._clear = (lambda n: _record(stacks, n, clear=True)) if _can_clear() else None
            self._count = lambda: _entry_count(self.device)
            self._observe = _attach_oom_observer
        else:
            self._snapshot = snapshot
            self._start_recording = start_recording or (lambda n: None)
            self._clear, self._count, self._observe = clear, count, None
        self.out = out
        self.trace = None  # the server's id of the trace
        self.traces = []  # every trace this watcher made
        self.incidents = []  # links printed for out-of-memory errors
        self.lost = 0  # entries known lost; gaps of unknown size add nothing
        self.gaps = 0
        self.held = 0.0  # seconds spent reading the ring (the GIL held nearly all of it)
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = None
        self.ws = None
        self.error = None
        self.closed = False
        self._oom = False
        # Steps read whole on request (complete()): asked and not begun,
        # the window being read, and what each window read.
        self.max_window = max(max_entries, max_window)
        self.request_file = request_file or os.path.join(tempfile.gettempdir(), "vramscope-%d.steps" % os.getpid())
        self.asked = 0
        self.asked_reads = 0  # reads since the request, before the window could be sized
        self.window = None
        self.windows = []
        self.steps_begun = 0  # steps whose start was read
        self.made_steps = []  # (entries made, steps begun) as of the last reads
        self.carry = 0  # entries lost after the last read's snapshot, before its clear

    # -- reading the ring --------------------------------------------------

    def _entries(self, snap):
        traces = snap.get("device_traces") or []
        return traces[self.device] if self.device < len(traces) else []

    def _begin(self, snap):
        """Starts the stream at snap: its segments are the state, its
        entries history from before the watch."""
        entries = self._entries(snap)
        self.tail = [_key(e) for e in entries[-self.TAIL:]]
        self.seen = len(entries)
        self.seq = 0  # the number of the next entry
        self.pending = []  # _Poll, not yet acknowledged
        self.sent = 0  # of pending, sent on this connection
        self.ann_next = 0  # the number of the next annotation
        self.ann_last = None
        self._annotations(snap)  # those from before the trace name the regions it begins inside of
        segs = [s for s in snap.get("segments", []) if s.get("device", 0) == self.device]
        initial = {"segments": segs, "device_traces": []}
        if "allocator_settings" in snap:
            initial["allocator_settings"] = snap["allocator_settings"]
        self.hello = {"type": "hello", "meta": {"name": self.name, "device_ordinal": self.device,
                                                "device_name": "cuda:%d" % self.device}, "snapshot": initial,
                      "sampled": self.clearing}
        if self.run is not None:
            self.hello["run"] = {"name": self.run, "rank": self.rank, "world_size": self.world_size or 0}
        self._first_anns = self.anns_read
        self.counted = self._count() if self._count else None

    def _new(self, entries):
        """Without clearing: the entries after the last one sent, or None
        when they cannot be found (the ring overwrote them)."""
        if not self.tail:
            return entries
        k = len(self.tail)
        # Usually the ring has only grown: try where it ended last time.
        cands = [self.seen] + list(range(len(entries), k - 1, -1))
        for p in cands:
            if k <= p <= len(entries) and [_key(e) for e in entries[p - k:p]] == self.tail:
                return entries[p:]
        return None

    def _annotations(self, snap):
        """The device's annotations read since the last call. Like the
        entries they are a ring: go on after the last one read, or when
        the ring dropped it, after its time."""
        anns = [a for a in snap.get("external_annotations") or [] if a.get("device", 0) == self.device]
        start = 0
        if self.ann_last is not None:
            start = next((i + 1 for i in range(len(anns) - 1, -1, -1) if _annotation_key(anns[i]) == self.ann_last), None)
            if start is None:
                start = next((i for i, a in enumerate(anns) if a.get("time_us", 0) > self.ann_last[0]), len(anns))
        new = anns[start:]
        if new:
            self.ann_last = _annotation_key(new[-1])
        self.anns_read = new
        return new

    def _size_ring(self, took, n):
        """The ring for the next interval: as many entries as duty lets a
        read convert, at what this one cost an entry, and no more than one
        read may hold the GIL for (STALL)."""
        if n < 100 or not self.clearing:
            return
        per = took / n
        self.per_entry = per if self.per_entry is None else 0.5 * (self.per_entry + per)
        fit = min(self.duty * self.interval, self.STALL) / self.per_entry
        self.ring = int(min(self.max_entries, max(self.MIN_RING, fit)))

    def poll(self, snap=None, counted_before=None, whole=0):
        """Reads the ring once (snap, when it was taken already, with the
        counters read just before it) and queues what is new; returns the
        number of new entries. whole, for the read that ends a window of
        steps read whole, is how many steps were asked for."""
        if snap is None:
            counted_before = self._count() if self._count else None
            snap = self._snapshot()
        ring_was = self.ring_set  # the ring's length since the last clear
        if self.clearing:
            self._clear(self.ring)  # at once: what comes before the clear is lost
            self.ring_set = self.ring
            entries = self._entries(snap)
            # The allocator's counters say about how many entries came
            # since the last read: those the ring overwrote are lost before
            # these; those that came between this read and its clear (the
            # job's thread may run there) after them, and are said with
            # the next read. A full ring without counters: some.
            lost = -1 if len(entries) >= ring_was else 0
            counted = self._count() if self._count else None
            if counted_before is not None and self.counted is not None and counted_before - self.counted > len(entries):
                lost = counted_before - self.counted - len(entries)
            if self.carry:
                lost = max(lost, 0) + self.carry
            self.carry = max(0, counted - counted_before) if counted is not None and counted_before is not None else 0
            self.counted = counted
        else:
            entries = self._entries(snap)
            new = self._new(entries)
            lost = 0
            if new is None:
                new, lost = entries, -1
            if new:
                self.tail = (self.tail + [_key(e) for e in new])[-self.TAIL:]
            self.seen = len(entries)
            entries = new
        anns = self._annotations(snap)
        self._note_steps(anns, self.counted if self.clearing else None)
        if entries or anns or lost or whole:
            segs = [s for s in snap.get("segments", []) if s.get("device", 0) == self.device]
            body = {"segments": segs, "device_traces": [[]] * self.device + [entries], "external_annotations": anns}
            if "allocator_settings" in snap:
                body["allocator_settings"] = snap["allocator_settings"]
            # The snapshot goes as the pickle it is: no Python work per entry.
            data = pickle.dumps(body, protocol=4)
            if len(data) > self.MAX_MESSAGE and entries:
                # Too big for one message: the newest entries that fit go,
                # the others are lost, and said.
                keep = int(len(entries) * self.MAX_MESSAGE / len(data) * 0.9)
                lost = max(lost, 0) + len(entries) - keep
                entries = entries[len(entries) - keep:]
                body["device_traces"] = [[]] * self.device + [entries]
                data = pickle.dumps(body, protocol=4)
                whole = 0
            head = _uvarint(self.seq) + _uvarint(2 * (-lost) - 1 if lost < 0 else 2 * lost) + _uvarint(self.ann_next)
            head = bytes([3]) + head + _uvarint(whole) if whole else bytes([2]) + head
            self.ann_next += len(anns)
            self.pending.append(_Poll(self.seq, self.seq + len(entries), self.ann_next, head + data))
            self.seq += len(entries)
        if lost:
            self.gaps += 1
            self.lost += max(lost, 0)
        oom = self._oom or (self._observe is None and any(e.get("action") == "oom" for e in entries))
        if oom:
            self._oom = False
            self._send()
            link = _upload(self.base, self.token, snap, self.name, self.device, self.out)
            if link:
                self.incidents.append(link)
        return len(entries)

    # -- steps read whole, on request --------------------------------------

    STEP = re.compile(r"^(?:ProfilerStep#|(?:train[_ ]?)?step[ _#:-]?)(\d+)$", re.IGNORECASE)  # attrib's stepName

    def complete(self, steps=10):
        """Asks for every entry of the next `steps` training steps (as the
        trace names them: ProfilerStep#N, step N). Returns at once; the
        watcher's thread does it. Asked while steps are read whole, the
        steps asked for are read after those; asked twice before they
        begin, the larger number is read."""
        steps = int(steps)
        if not 0 < steps <= 10000:
            raise ValueError("vramscope: complete(%r): 1 to 10000 steps" % (steps,))
        self.asked = max(self.asked, steps)

    def _note_steps(self, anns, counted):
        """Counts the steps begun, as the annotations read say, against the
        entries made: how many entries a step makes, and how fast."""
        self.steps_begun += sum(1 for a in anns if a.get("stage") == "START" and self.STEP.match(a.get("name", "")))
        if counted is not None:
            self.made_steps = (self.made_steps + [(counted, self.steps_begun, time.monotonic())])[-20:]

    def _per_step(self):
        """Entries a step makes, over the last reads; None before two
        steps were seen."""
        (c0, s0, _), (c1, s1, _) = (self.made_steps[0], self.made_steps[-1]) if self.made_steps else ((0, 0, 0), (0, 0, 0))
        return (c1 - c0) / (s1 - s0) if s1 - s0 >= 2 and c1 > c0 else None

    def _rate(self):
        """Entries made a second, over the last reads (0 when unknown)."""
        (c0, _, t0), (c1, _, t1) = (self.made_steps[0], self.made_steps[-1]) if self.made_steps else ((0, 0, 0), (0, 0, 0))
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0

    def _requested_by_file(self):
        try:
            with open(self.request_file) as f:
                text = f.read().strip()
            os.remove(self.request_file)
        except OSError:
            return
        try:
            self.complete(int(text or "10"))
        except ValueError as e:
            print("vramscope: %s: %r is not a number of steps (%s)" % (self.request_file, text, e), file=self.out)

    def _sized_for_window(self):
        """Whether a window can open now: once the reads have seen how many
        entries a step makes (a request made as the job starts waits for
        two steps), or after ten reads without: a job whose steps are not
        annotated gets the largest ring, read after a read interval a step."""
        if self._per_step():
            return True
        self.asked_reads += 1
        return self.asked_reads > 10

    def _open_window(self):
        """Begins reading `asked` steps whole: a read as every other, whose
        clear leaves a ring sized for the steps (and the one under way)."""
        asked = self.asked
        per_step, rate = self._per_step(), self._rate()
        target = (asked + 1.5) * per_step if per_step else None
        # Room past the target for what comes while the watcher waits for
        # the GIL, or a busy machine, to let it look (half the target and
        # WINDOW_LOOK of entries at the rate seen): a ring costs memory,
        # not time; a read costs the entries it holds.
        ring = int(min(self.max_window, 1.5 * (target or 0) + rate * self.WINDOW_LOOK + self.MIN_RING))
        if target is None:
            ring = self.max_window  # nothing to size it by: the largest
        duty_ring = self.ring
        self.ring = ring
        n = self.poll()
        self.ring = duty_ring
        self.window = {"asked": asked, "ring": ring, "opened": time.monotonic(), "target": target, "per_step": per_step,
                       "rate": rate, "wait": asked * self.interval, "count0": self.counted, "tries": 0, "read_s": 0.0}
        # Asked until the window is open: one or the other, never neither.
        self.asked = 0 if self.asked == asked else self.asked
        self.asked_reads = 0
        return n

    def _made(self):
        """Entries made since the window opened (None without counters)."""
        w = self.window
        return self._count() - w["count0"] if self._count and w["count0"] is not None else None

    def _window_due(self):
        """The window is read once the job has made the entries of the
        steps asked for (and the step it opened in), or as its ring nears
        full; without the counters or a step length, after a read interval
        a step."""
        w, made = self.window, self._made()
        if made is not None and (made >= 0.8 * w["ring"] or w["target"] is not None and made >= w["target"]):
            return True
        return (made is None or w["target"] is None) and time.monotonic() - w["opened"] >= w["wait"]

    def _steps_within(self, snap, entries):
        """How many steps began and ended between the first and the last
        entry read (strictly: entries lost before or after the window
        come at or before its first, at or after its last)."""
        if not entries:
            return 0
        first, last = entries[0].get("time_us", 0), entries[-1].get("time_us", 0)
        begun = {}
        n = 0
        for a in snap.get("external_annotations") or []:
            name, t = a.get("name", ""), a.get("time_us", 0)
            if a.get("device", 0) != self.device or not self.STEP.match(name):
                continue
            if a.get("stage") == "START" and t > first:
                begun[name] = t
            elif a.get("stage") == "END" and name in begun and t < last:
                del begun[name]
                n += 1
        return n

    def _close_window(self):
        """Reads the window's ring whole. Before the steps asked for are
        over, and while the ring has room, it waits for them (the read
        dropped: at most twice); then it sends the read, marked whole
        unless the ring overflowed, and goes back to the duty cycle."""
        w = self.window
        t0 = time.perf_counter()
        counted_before = self._count() if self._count else None
        snap = self._snapshot()
        took = time.perf_counter() - t0
        w["read_s"] += took
        entries = self._entries(snap)
        whole = len(entries) < w["ring"]
        done = self._steps_within(snap, entries)
        more = (w["asked"] - done + 1) * (w["per_step"] or len(entries) / (done + 1))
        if whole and done < w["asked"] and w["tries"] < 2 and len(entries) + more <= 0.9 * w["ring"]:
            # Not over yet (the steps ran longer than those before) and
            # room for the rest: wait for them.
            w["tries"] += 1
            if w["target"] is not None:
                w["target"] = len(entries) + more
            w["wait"] += (w["asked"] - done + 1) * self.interval
            self.held += took
            return
        self.window = None
        n = self.poll(snap, counted_before, w["asked"] if whole else 0)
        self.held += time.perf_counter() - t0
        self.windows.append({"asked": w["asked"], "steps": done if whole else 0, "entries": n, "ring": w["ring"],
                             "whole": whole, "read_s": round(w["read_s"], 4)})
        if not whole:
            print("vramscope: the steps asked for made more entries than the ring sized for them held (%d): "
                  "some were lost; ask for fewer steps" % w["ring"], file=self.out)

    # -- the connection ----------------------------------------------------

    def _connect(self):
        ws_url = self.base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws/ingest"
        ws = _WebSocket(ws_url, _headers(self.token))
        hello = dict(self.hello, trace=self.trace) if self.trace else self.hello
        ws.send(hello)
        r = ws.recv()
        if r.get("type") == "error":
            ws.close()
            raise ServerError(r.get("error"))
        if r.get("type") == "done":
            ws.close()
            raise _Ended("trace %s has ended" % r.get("trace"))
        if self.trace is None:
            self.traces.append(r["trace"])
            print("vramscope: watching live at %s%s" % (self.base, r.get("url", "")), file=self.out)
        self.trace = r["trace"]
        self.ws = ws
        self.sent = 0
        self._acked(r["seq"], r.get("annotations", 0))

    def _acked(self, seq, anns):
        i = 0
        while i < len(self.pending) and self.pending[i].end - 1 <= seq and self.pending[i].ann_end <= anns:
            i += 1
        del self.pending[:i]
        self.sent = max(0, self.sent - i)

    def _drain(self):
        while self.ws.ready():
            r = self.ws.recv(block=False)
            if r is None:
                return
            if r.get("type") == "ack":
                self._acked(r["seq"], r.get("annotations", 0))
            elif r.get("type") == "complete":
                self.complete(r.get("steps", 10))
            elif r.get("type") == "error":
                raise ServerError(r.get("error"))

    def _send(self, retry_for=60.0):
        """Sends what is queued, reconnecting (and sending again what the
        server lacks) when the connection drops."""
        deadline = time.monotonic() + retry_for
        wait = 0.05
        while True:
            try:
                if self.ws is None:
                    self._connect()
                self._drain()
                if self.sent < len(self.pending):
                    self.ws.send_binary(self.pending[self.sent].message)
                    self.sent += 1
                    continue
                return
            except ServerError:
                raise
            except (OSError, ConnectionError, ValueError) as e:
                wait = self._dropped(e, deadline, wait)

    def _dropped(self, e, deadline, wait):
        """Lets a dropped connection go and waits before the next try;
        returns the wait after that. Past deadline it raises."""
        if self.ws is not None:
            self.ws.sock.close()
            self.ws = None
        if time.monotonic() > deadline:
            raise ConnectionError("vramscope: server unreachable: %s" % e)
        time.sleep(wait)
        return min(wait * 2, 2.0)

    def _end(self, status, retry_for=60.0):
        """Ends the trace: everything sent, then end, then done. A
        connection that drops before done comes is made again, what the
        server lacks sent again, and end with it, as for every other
        message; a server that had stored the end answers the new
        connection with done."""
        deadline = time.monotonic() + retry_for
        wait = 0.05
        while True:
            try:
                self._send(retry_for=max(0.0, deadline - time.monotonic()))
            except _Ended:
                return  # the end was stored; its done was lost
            try:
                self.ws.send({"type": "end", "status": status})
                while True:
                    r = self.ws.recv()
                    if r.get("type") == "done":
                        break
                    if r.get("type") == "ack":
                        self._acked(r["seq"], r.get("annotations", 0))
                    elif r.get("type") == "error":
                        raise ServerError(r.get("error"))
                break
            except ServerError:
                raise
            except (OSError, ConnectionError, ValueError) as e:
                wait = self._dropped(e, deadline, wait)
        self.ws.close()
        self.ws = None

    # -- the thread --------------------------------------------------------

    def start(self):
        # Cleared after each read, a read costs what is new; duty=1, or a
        # PyTorch that cannot clear, reads the whole ring of max_entries
        # (nothing lost but what overflows it).
        self.clearing = self._clear is not None and self.duty < 1
        # A ring a first read converts in tens of milliseconds, sized to
        # the duty after it.
        self.ring = min(self.max_entries, 10000) if self.clearing else self.max_entries
        self.per_entry = None
        self._start_recording(self.ring)
        self.ring_set = self.ring
        snap = self._snapshot()
        if self.clearing:
            self._clear(self.ring)
        self._begin(snap)
        if self._observe is not None:
            self._observe(self._on_oom)
        # The first connection is tried once: a server that is not there
        # is the caller's to hear of now, not after a minute of retries.
        self._send(retry_for=0)
        how = "echo N > %s" % self.request_file
        if self._listen_for_signal():
            how += ", or kill -USR1 %d (10 steps)" % os.getpid()
        print("vramscope: to read the next N steps whole: the trace page, or %s" % how, file=self.out)
        self.thread = threading.Thread(target=self._run, name="vramscope-watch", daemon=True)
        self.thread.start()
        atexit.register(self.close)
        return self

    def _listen_for_signal(self):
        """SIGUSR1 asks for 10 steps whole, unless the job handles it
        itself (or this is not the main thread, where Python takes
        signal handlers)."""
        if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return False
        signal.signal(signal.SIGUSR1, lambda *_: self.complete(10))
        return True

    def _on_oom(self, device, alloc, device_allocated, device_free):
        if device == self.device:
            self._oom = True

    def _pause(self):
        """How long the thread waits before it looks again: an interval;
        while steps are read whole, until the ring would be half way from
        what it holds to 80 % full at the rate entries come in the window
        (5 ms to begin with), at most 50 ms."""
        w = self.window
        if w is None:
            return self.interval
        made, since = self._made(), time.monotonic() - w["opened"]
        if made is None:
            return min(self.interval, 0.05)
        if since < 0.005 or made <= 0:
            return 0.005
        return max(0.001, min(self.interval, 0.05, (0.8 * w["ring"] - made) / (made / since) / 2))

    def _run(self):
        while not self.stop_event.wait(self._pause()):
            try:
                with self.lock:
                    self.step()
            except Exception as e:
                self.error = e
                print("vramscope: watching stopped: %s" % e, file=self.out)
                return

    def step(self):
        """One read and send; the thread calls this every interval. How
        long the read took (the GIL held for nearly all of it, a thread
        the machine let wait included) sizes the ring. While steps are
        read whole, it only looks at the counters until they are over."""
        if self.window is not None:
            if self._window_due():
                self._close_window()
                self._send()
            return
        self._requested_by_file()
        t0 = time.perf_counter()
        if not self.clearing:
            self.asked = 0  # every entry is read already
        if self.asked and self._sized_for_window():
            n = self._open_window()
        else:
            n = self.poll()
        took = time.perf_counter() - t0
        self.held += took
        self._size_ring(took, n)
        self._send()

    def close(self, status="complete"):
        """Sends what is left and ends the trace."""
        if self.closed:
            return
        self.closed = True
        self.stop_event.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        if self.error is not None:
            return
        with self.lock:
            try:
                if self.window is not None:
                    self.window["tries"] = 2  # the job ends: read what the window holds now
                    self._close_window()
                self.step()
                self._end(status)
            except Exception as e:
                print("vramscope: ending the trace failed: %s" % e, file=self.out)
            if self.gaps:
                print("vramscope: %d gaps in the trace (%d entries known lost): the job recorded more between two "
                      "reads than duty=%g let the watcher read (a larger duty reads more, at that cost)"
                      % (self.gaps, self.lost, self.duty), file=self.out)
            self.trace = None


def _uvarint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class OOMWatcher:
    """Records the allocator's history and, only when PyTorch runs out of
    memory, uploads its snapshot to url or writes it into dir (or both).
    snapshot, start_recording and attach stand in for PyTorch's calls."""

    def __init__(self, url=None, dir=None, token=None, device=None, name=None, max_entries=100000,
                 stacks="python", run=None, rank=None, world_size=None, out=sys.stderr,
                 snapshot=None, start_recording=None, attach=None):
        if url is None and dir is None:
            raise ValueError("vramscope: on_oom() needs url= (upload) or dir= (write a file)")
        self.base = url.rstrip("/") if url else None
        self.dir = dir
        self.token = token if token is not None else os.environ.get("VRAMSCOPE_TOKEN")
        who = _Identity(device, name, run, rank, world_size)
        self.device, self.rank, self.world_size, self.name = who.device, who.rank, who.world_size, who.name
        self.max_entries = max_entries
        self._snapshot = snapshot or _torch_snapshot
        self._start_recording = start_recording or (lambda n: _record(stacks, n))
        self._attach = attach or _attach_oom_observer
        self.out = out
        self.files = []  # snapshots written
        self.incidents = []  # links printed

    def start(self):
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)
        self._start_recording(self.max_entries)
        self._attach(self.observe)
        return self

    def file_name(self):
        """<script>-rank<R>[-of-<W>]-<time>-<pid>.pickle: vramscope import
        --run reads the rank from the name."""
        prog = os.path.splitext(_prog())[0]
        who = ""
        if self.rank is not None:
            who = "-rank%d" % self.rank + ("-of-%d" % self.world_size if self.world_size else "")
        return "%s%s-%s-%d.pickle" % (prog, who, time.strftime("%Y%m%d-%H%M%S"), os.getpid())

    def observe(self, device, alloc, device_allocated, device_free):
        """PyTorch's OOM observer: runs in the thread that ran out, before
        the error is raised."""
        if device != self.device:
            return
        try:
            snap = self._snapshot()
            if self.dir:
                path = os.path.join(self.dir, self.file_name())
                with open(path + ".part", "wb") as f:
                    pickle.dump(snap, f, protocol=4)
                os.replace(path + ".part", path)  # whole or not at all
                self.files.append(path)
                print("vramscope: CUDA out of memory; snapshot written to %s" % path, file=self.out)
            if self.base:
                link = _upload(self.base, self.token, snap, self.name, self.device, self.out)
                if link:
                    self.incidents.append(link)
        except Exception as e:  # the job's own error comes next; this one must not hide it
            print("vramscope: saving the out-of-memory snapshot failed: %s" % e, file=self.out)


def watch(url, token=None, **kw):
    """Starts watching this process's CUDA memory live; returns the Watcher
    (close() ends the trace; it also ends when the process exits). Raises
    ConnectionError at once when the server cannot be reached, ServerError
    when it refuses the stream (a wrong token, say); later drops are
    retried in the background.

    stacks="all" records C++ frames too (costly); duty (0.03) is the most
    of the job's time the watcher may hold the GIL, interval (0.5 s) how
    often it reads. One watcher a process: clearing the ring clears every
    device's, so a second watcher's device would lose entries (said). In a job of several ranks, run="NAME" (or
    $VRAMSCOPE_RUN, or torchrun's rendezvous id) makes every rank's trace
    part of one run on the server; rank= and world_size= default to
    torch.distributed's, else to $RANK and $WORLD_SIZE."""
    return Watcher(url, token=token, **kw).start()


def on_oom(url=None, dir=None, **kw):
    """Records the allocator's history (PyTorch's own cost, nothing more)
    and, when PyTorch runs out of memory, uploads the snapshot to url (an
    incident; its link is printed) or writes it into dir, one file per
    rank with the rank in its name, for vramscope import --run. Returns
    the OOMWatcher."""
    return OOMWatcher(url=url, dir=dir, **kw).start()


def _estimate_args(argv):
    """argv without its --estimate flag when it asks for an estimate (the
    flag before the script), else None."""
    for i, a in enumerate(argv):
        if a == "--estimate":
            return argv[:i] + argv[i + 1:]
        if a == "--" or not a.startswith("-") and os.path.isfile(a):
            return None
    return None


def main(argv=None):
    """python -m vramscope_watch [options] SCRIPT ARGS...: runs SCRIPT as
    python would, watched. With --estimate, estimates its memory on a CPU
    instead (vramscope_estimate)."""
    import argparse
    import runpy

    rest = _estimate_args(sys.argv[1:] if argv is None else list(argv))
    if rest is not None:
        try:
            import vramscope_estimate
        except ImportError:
            print("vramscope: --estimate needs vramscope_estimate.py beside vramscope_watch.py (a vramscope server serves "
                  "it at /vramscope_estimate.py; pip install of vramscope-watch has both)", file=sys.stderr)
            return 2
        return vramscope_estimate.main(rest)

    p = argparse.ArgumentParser(prog="python -m vramscope_watch",
                                description="Run a PyTorch script with its CUDA memory watched by vramscope.")
    p.add_argument("--url", help="the vramscope server (default: $VRAMSCOPE_URL)")
    p.add_argument("--dir", help="with --on-oom: write the snapshot into this folder")
    p.add_argument("--on-oom", action="store_true", help="record, and report only an out-of-memory error")
    p.add_argument("--token", help="the server's token (default: $VRAMSCOPE_TOKEN)")
    p.add_argument("--run", help="the run every rank names (default: $VRAMSCOPE_RUN, or torchrun's)")
    p.add_argument("--name", help="the trace's name")
    p.add_argument("--stacks", choices=("python", "all"), default="python", help="frames recorded (default: python)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between reads (default: 0.5)")
    p.add_argument("--duty", type=float, default=0.03, help="most of the job's time spent reading (default: 0.03)")
    p.add_argument("--max-entries", type=int, default=100000, help="the largest ring (default: 100000)")
    p.add_argument("--estimate", action="store_true", help="estimate the script's memory on a CPU, no GPU needed "
                   "(python -m vramscope_watch --estimate --help: its options)")
    p.add_argument("script", help="the script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    url = a.url or os.environ.get("VRAMSCOPE_URL")
    if a.dir and not a.on_oom:
        p.error("--dir writes a file on out-of-memory: it needs --on-oom")
    if not url and not a.dir:
        p.error("give --url (or $VRAMSCOPE_URL), or --on-oom --dir")
    run = a.run
    if run is None and _run_name() is None and "RANK" in os.environ:
        # torchrun without a rendezvous id: the ranks share the script's name.
        run = "%s (torchrun)" % os.path.basename(a.script)
    sys.argv = [a.script] + a.args
    sys.path[0] = os.path.dirname(os.path.abspath(a.script))
    common = dict(token=a.token, name=a.name, stacks=a.stacks, max_entries=a.max_entries, run=run)
    if os.environ.get("LOCAL_RANK", "").isdigit():
        # A rank's script picks its device (LOCAL_RANK's, as a rule) only
        # after the watcher starts.
        common["device"] = int(os.environ["LOCAL_RANK"])
    if a.on_oom:
        on_oom(url=url, dir=a.dir, **common)
    else:
        watch(url, interval=a.interval, duty=a.duty, **common)
    runpy.run_path(a.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
