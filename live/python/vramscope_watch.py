"""Watch a PyTorch job's CUDA memory live in vramscope.

    import vramscope_watch
    vramscope_watch.watch("http://127.0.0.1:8080")     # token=... when the server has one
    vramscope_watch.watch(url, run="job-42")           # every rank of a job: one run

watch() turns on PyTorch's memory-history recording, and a background thread
sends the new trace entries to the server every few hundred milliseconds over
a websocket (/ws/ingest); the trace page follows them as they come. When an
entry says the allocator ran out of memory, the whole snapshot is uploaded
(POST /api/traces) and the incident's link is printed. Standard library only:
the websocket client is the few lines it needs, written here.

PyTorch's snapshot returns the whole ring buffer of entries every time; the
watcher finds where the entries it already sent end (by their fields, even
after the ring has wrapped) and sends only what follows, each entry once,
numbered. If more entries than the ring holds happen between two polls the
thread cannot tell what was lost: it ends the trace and starts a new one from
the current state, saying so.
"""

import atexit
import base64
import json
import os
import pickle
import select
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse
import urllib.request

__all__ = ["watch", "Watcher"]


def _start_recording(max_entries):
    """The one call that turns recording on."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", max_entries=max_entries)


def _snapshot():
    """The one call that reads the allocator's state and entries."""
    import torch

    return torch.cuda.memory._snapshot()


def _dist_rank():
    """This process's rank and world size: torch.distributed's once it is
    initialised, else torchrun's RANK and WORLD_SIZE, else (None, 0)."""
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

    def ready(self):
        """Whether a frame can be read without waiting."""
        if self.buf:
            return True
        r, _, _ = select.select([self.sock], [], [], 0)
        return bool(r)

    def recv(self):
        """The next text message, parsed; answers pings on the way."""
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
            elif op == 8:
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


class Watcher:
    """Streams one device's trace entries to a vramscope server."""

    TAIL = 16  # entries remembered to find where the sent ones end

    def __init__(self, url, token=None, device=None, interval=0.3, name=None, max_entries=100000,
                 snapshot=_snapshot, start_recording=_start_recording, out=sys.stderr,
                 run=None, rank=None, world_size=None):
        self.base = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("VRAMSCOPE_TOKEN")
        self.device = _current_device() if device is None else device
        self.interval = interval
        # The run this trace is a rank of: every rank of a job names the
        # same run and the server groups them.
        self.run = run if run is not None else _run_name()
        dist_rank, dist_world = _dist_rank()
        self.rank = rank if rank is not None else dist_rank
        self.world_size = world_size if world_size is not None else dist_world
        if self.run is not None and self.rank is None:
            self.rank = 0
        if self.run is None and rank is not None:
            raise ValueError("vramscope: rank= needs run=, the name every rank of the job gives")
        prog = os.path.basename(sys.argv[0] or "python")
        if self.run is not None:
            prog = "%s rank %d" % (prog, self.rank)
        self.name = name or "%s (cuda:%d)" % (prog, self.device)
        self.max_entries = max_entries
        self._snapshot = snapshot
        self._start_recording = start_recording
        self.out = out
        self.trace = None  # the server's id of the current trace
        self.traces = []  # every trace this watcher made
        self.incidents = []  # links printed for out-of-memory errors
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = None
        self.ws = None
        self.error = None
        self.closed = False

    # -- the entries -------------------------------------------------------

    def _begin(self, snap):
        """Starts a trace at snap: its segments are the state, its entries
        are history from before the trace."""
        self.tail = [_key(e) for e in self._entries(snap)[-self.TAIL:]]
        self.seen = len(self._entries(snap))
        self.seq = 0
        self.pending = []  # (seq, message entry), not yet acknowledged
        self.sent = 0
        self.stacks = {}  # frames key -> id
        self.stack_defs = {}  # id (str) -> frames
        # The job's annotations (record_function regions: steps, phases),
        # numbered in the order read: anns holds those from number
        # ann_base on, the server has the first ann_sent. Those read now,
        # from before the trace, name the regions it begins inside of.
        self.anns, self.ann_base, self.ann_sent, self.ann_last = [], 0, 0, None
        self._annotations(snap)
        self.trace = None
        segs = [s for s in snap.get("segments", []) if s.get("device", 0) == self.device]
        initial = {"segments": segs, "device_traces": []}
        if "allocator_settings" in snap:
            initial["allocator_settings"] = snap["allocator_settings"]
        self.hello = {"type": "hello", "meta": {"name": self.name, "device_ordinal": self.device,
                                                "device_name": "cuda:%d" % self.device}, "snapshot": initial}
        if self.run is not None:
            self.hello["run"] = {"name": self.run, "rank": self.rank, "world_size": self.world_size or 0}

    def _entries(self, snap):
        traces = snap.get("device_traces") or []
        return traces[self.device] if self.device < len(traces) else []

    def _new(self, entries):
        """The entries after the last one sent, or None when they cannot be
        found (the ring overwrote them)."""
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
        """Queues the device's annotations read since the last call. Like
        the entries they are a ring: go on after the last one read, or when
        the ring dropped it, after its time."""
        anns = [a for a in snap.get("external_annotations") or [] if a.get("device", 0) == self.device]
        start = 0
        if self.ann_last is not None:
            start = next((i + 1 for i in range(len(anns) - 1, -1, -1) if _annotation_key(anns[i]) == self.ann_last), None)
            if start is None:
                start = next((i for i, a in enumerate(anns) if a.get("time_us", 0) > self.ann_last[0]), len(anns))
        for a in anns[start:]:
            self.anns.append({"time_us": a.get("time_us", 0), "stage": a.get("stage"), "name": a.get("name", "")})
            self.ann_last = _annotation_key(a)

    def _server_has(self, n):
        """The server has annotations 0..n-1: those are let go."""
        drop = min(max(0, n - self.ann_base), len(self.anns))
        del self.anns[:drop]
        self.ann_base += drop

    def _stack(self, frames):
        if not frames:
            return 0
        key = tuple((f.get("name"), f.get("filename"), f.get("line")) for f in frames)
        sid = self.stacks.get(key)
        if sid is None:
            sid = len(self.stacks) + 1
            self.stacks[key] = sid
            self.stack_defs[str(sid)] = [{"name": n, "filename": fn, "line": ln} for n, fn, ln in key]
        return sid

    def poll(self):
        """Reads the entries once and queues the new ones; returns them."""
        snap = self._snapshot()
        entries = self._entries(snap)
        new = self._new(entries)
        if new is None:
            print("vramscope: more than %d allocator events between two polls; "
                  "ending this trace and starting another from the current state" % len(entries), file=self.out)
            self._end("incomplete")
            self._begin(snap)
            return []
        for e in new:
            m = {"seq": self.seq, "time_us": e.get("time_us", 0), "action": e.get("action"),
                 "addr": e.get("addr", 0), "size": e.get("size", 0), "stream": e.get("stream", 0)}
            if "device_free" in e:
                m["device_free"] = e["device_free"]
            sid = self._stack(e.get("frames"))
            if sid:
                m["stack"] = sid
            self.pending.append((self.seq, m))
            self.seq += 1
        if new:
            self.tail = (self.tail + [_key(e) for e in new])[-self.TAIL:]
        self.seen = len(entries)
        self._annotations(snap)
        if any(e.get("action") == "oom" for e in new):
            self._send()
            self.upload(snap)
        return new

    # -- the connection ----------------------------------------------------

    def _headers(self):
        return {"Authorization": "Bearer " + self.token} if self.token else {}

    def _connect(self):
        ws_url = self.base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + "/ws/ingest"
        ws = _WebSocket(ws_url, self._headers())
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
        self._acked(r["seq"])
        self.ann_sent = r.get("annotations", 0)
        self._server_has(self.ann_sent)
        self.sent = 0
        self.ws = ws
        self.defs_sent = 0  # stack ids 1..defs_sent are defined on this connection

    def _acked(self, seq):
        i = 0
        while i < len(self.pending) and self.pending[i][0] <= seq:
            i += 1
        del self.pending[:i]
        self.sent = max(0, self.sent - i)

    def _drain(self):
        while self.ws.ready():
            r = self.ws.recv()
            if r.get("type") == "ack":
                self._acked(r["seq"])
                self._server_has(r.get("annotations", 0))
            elif r.get("type") == "error":
                raise ServerError(r.get("error"))

    def _send(self, retry_for=60.0):
        """Sends what is queued, reconnecting (and resending what the server
        lacks) when the connection drops."""
        deadline = time.monotonic() + retry_for
        wait = 0.05
        while True:
            try:
                if self.ws is None:
                    self._connect()
                self._drain()
                unsent_anns = self.anns[self.ann_sent - self.ann_base:]
                if self.sent < len(self.pending) or self.defs_sent < len(self.stack_defs) or unsent_anns:
                    batch = [m for _, m in self.pending[self.sent:self.sent + 2000]]
                    msg = {"type": "events", "events": batch}
                    if unsent_anns:
                        msg["annotations"] = unsent_anns[:2000]
                    if self.defs_sent < len(self.stack_defs):
                        # Ids are given in order, so the undefined ones are the last.
                        msg["stacks"] = {str(i): self.stack_defs[str(i)]
                                         for i in range(self.defs_sent + 1, len(self.stack_defs) + 1)}
                    self.ws.send(msg)
                    self.defs_sent = len(self.stack_defs)
                    self.sent += len(batch)
                    self.ann_sent += len(msg.get("annotations", ()))
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
        """Ends the current trace: everything sent, then end, then done. A
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
                        self._acked(r["seq"])
                    elif r.get("type") == "error":
                        raise ServerError(r.get("error"))
                break
            except ServerError:
                raise
            except (OSError, ConnectionError, ValueError) as e:
                wait = self._dropped(e, deadline, wait)
        self.ws.close()
        self.ws = None

    # -- out of memory -----------------------------------------------------

    def upload(self, snap):
        """Uploads the whole snapshot and prints the incident's link."""
        body = pickle.dumps(snap, protocol=4)
        q = urllib.parse.urlencode({"name": "%s OOM %s" % (self.name, time.strftime("%Y-%m-%d %H:%M:%S"))})
        req = urllib.request.Request(self.base + "/api/traces?" + q, data=body, method="POST",
                                     headers=dict(self._headers(), **{"Content-Type": "application/octet-stream"}))
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                out = json.load(resp)
        except Exception as e:  # the job matters more than the upload
            print("vramscope: uploading the snapshot failed: %s" % e, file=self.out)
            return None
        for t in out.get("traces", []):
            if t.get("oom_count", 0) > 0 and t.get("device_ordinal", self.device) == self.device:
                link = "%s/traces/%s/incidents/%d" % (self.base, t["id"], t["oom_count"])
                break
        else:
            link = self.base + out.get("url", "")
        self.incidents.append(link)
        print("vramscope: CUDA out of memory; incident: %s" % link, file=self.out)
        return link

    # -- the thread --------------------------------------------------------

    def start(self):
        self._start_recording(self.max_entries)
        self._begin(self._snapshot())
        # The first connection is tried once: a server that is not there
        # is the caller's to hear of now, not after a minute of retries.
        self._send(retry_for=0)
        self.thread = threading.Thread(target=self._run, name="vramscope-watch", daemon=True)
        self.thread.start()
        atexit.register(self.close)
        return self

    def _run(self):
        while not self.stop_event.wait(self.interval):
            try:
                with self.lock:
                    self.step()
            except Exception as e:
                self.error = e
                print("vramscope: watching stopped: %s" % e, file=self.out)
                return

    def step(self):
        """One poll and send; the thread calls this every interval."""
        self.poll()
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
                self.step()
                self._end(status)
            except Exception as e:
                print("vramscope: ending the trace failed: %s" % e, file=self.out)
            self.trace = None


def watch(url, token=None, **kw):
    """Starts watching this process's CUDA memory; returns the Watcher
    (close() ends the trace; it also ends when the process exits). Raises
    ConnectionError at once when the server cannot be reached, ServerError
    when it refuses the stream (a wrong token, say); later drops are
    retried in the background.

    In a job of several ranks, run="NAME" (or $VRAMSCOPE_RUN, or torchrun's
    rendezvous id) makes every rank's trace part of one run on the server;
    rank= and world_size= default to torch.distributed's, else to $RANK and
    $WORLD_SIZE."""
    return Watcher(url, token=token, **kw).start()
