"""What the GPU checks (scripts/gpu_*_check.py, run by scripts/gpu-check.sh)
share: tables, the verdict line, running a command with its output logged,
record.py's recordings. Standard library only.

A check prints its table, then one last line "verdict: ok|FAIL|n/a: why",
and exits 0 (ok), 1 (FAIL) or 3 (n/a: what it checks is not there to
check); gpu-check.sh shows that line in its closing table.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OK, FAIL, NA = "ok", "FAIL", "n/a"
EXIT = {OK: 0, FAIL: 1, NA: 3}


def gib(n):
    return "%.2f GiB" % (n / (1 << 30))


def num(n):
    return "{:,}".format(n)


def diff_pct(real, other):
    """other against real, in per cent; None when real is 0."""
    return (other - real) / real * 100 if real else None


def pct_text(d, digits=2):
    return "-" if d is None else "%+.*f %%" % (digits, d)


def within(d, bound):
    return d is not None and abs(d) <= bound


def table(head, rows, out=None):
    """Prints rows (tuples of strings) under head, columns left-aligned."""
    out = out or sys.stdout
    rows = [tuple("" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) if i < len(r) else 0 for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def verdict(status, why):
    """Prints the verdict line and returns the exit status it stands for."""
    print("verdict: %s: %s" % (status, why), flush=True)
    return EXIT[status]


def worst(*statuses):
    """FAIL over ok over n/a: the verdict of several parts."""
    for s in (FAIL, OK):
        if s in statuses:
            return s
    return NA


_groups = set()  # process groups of the commands running now


def _stop(signum, frame):
    """Killed from outside (gpu-check.sh's timeout): the commands this
    check started go too (each runs in a group of its own), then it."""
    for pgid in list(_groups):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(124)


signal.signal(signal.SIGTERM, _stop)


class Log:
    """Commands run with their output appended to one file, each headed by
    its command line, time and status."""

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def run(self, cmd, cwd=None, env=None, timeout=None, stdout_only=False):
        """Runs cmd in a process group of its own; returns (status,
        output): stdout and stderr, or with stdout_only stdout alone (both
        go to the log). A command that cannot start, or runs past timeout
        (its whole group is killed: record.py ddp's workers too), gives
        status 127 or 124, as a shell would."""
        t0 = time.time()
        err = ""
        try:
            p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE if stdout_only else subprocess.STDOUT,
                                 text=True, errors="replace", start_new_session=True)
        except OSError as e:
            status, output = 127, ""
            err = str(e) + "\n"
        else:
            _groups.add(p.pid)
            try:
                output, err = p.communicate(timeout=timeout)
                status = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                output, err = p.communicate()
                status, err = 124, (err or "") + "(killed after %.0f s)\n" % timeout
            finally:
                _groups.discard(p.pid)
            err = err or ""
        with open(self.path, "a") as f:
            f.write("$ %s%s\n%s%s(status %d, %.1f s)\n\n" % (" ".join(cmd), " (in %s)" % cwd if cwd else "", output, err,
                                                            status, time.time() - t0))
        self.last_err = err
        return status, output if stdout_only else output + err


class Deadline:
    """A check's time: what is left of it, less what its report needs."""

    def __init__(self, seconds):
        self.end = time.time() + seconds if seconds else None

    def left(self, keep=0):
        return None if self.end is None else max(1.0, self.end - time.time() - keep)


def python_env():
    """The environment record.py runs in: the allocator's default settings."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    return env


def record(log, python, recordings, rec, scenario, name, *flags, timeout=None, makes=None):
    """Runs record.py SCENARIO REC --name NAME FLAGS unless REC holds what
    it makes already (makes, default NAME.json); returns None, or why it
    failed."""
    if os.path.exists(os.path.join(rec, makes or name + ".json")):
        return None
    t0 = time.time()
    status, out = log.run([python, os.path.join(recordings, "record.py"), scenario, rec, "--name", name, *flags],
                          env=python_env(), timeout=timeout)
    print("  recorded %s (record.py %s %s) in %.1f s%s" % (name, scenario, " ".join(flags), time.time() - t0,
                                                         "" if status == 0 else ": status %d" % status), flush=True)
    if status != 0:
        tail = out.strip().splitlines()[-1:] or ["no output"]
        return "record.py %s %s: status %d (%s)" % (scenario, name, status, tail[0])
    return None


def load_json(path):
    with open(path) as f:
        return json.load(f)


def copy_into(folder, *paths):
    os.makedirs(folder, exist_ok=True)
    for p in paths:
        shutil.copy(p, folder)
    return folder


def go_tests(output):
    """The results of `go test -v` output: {name: (PASS|FAIL|SKIP, [its
    log lines], seconds)}."""
    results, logs, current = {}, {}, None
    for line in output.splitlines():
        s = line.strip()
        if s.startswith(("=== RUN", "=== NAME", "=== CONT")):
            current = s.split(None, 2)[2]
            logs.setdefault(current, [])
        elif s.startswith("--- "):
            word, rest = s[4:].split(":", 1)
            name, _, took = rest.strip().partition(" ")
            results[name] = (word, float(took.strip("()s") or 0))
        elif current and s and not s.startswith(("=== ", "PASS", "FAIL", "ok ")):
            logs[current].append(s)
    return {n: (w, logs.get(n, []), took) for n, (w, took) in results.items()}
