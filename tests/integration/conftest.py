"""Shared fixtures for looplock's integration tests.

The binary under test comes from $LOOPLOCK (meson sets it); every subprocess
gets a timeout so that a hang fails the test instead of wedging CI, and
processes that must be in a given state before the test goes on print
"ready" first (a handshake, never a sleep).
"""
import fcntl
import hashlib
import json
import errno
import os
import resource
import select
import signal
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOOPLOCK = os.environ.get("LOOPLOCK", str(ROOT / "build" / "src" / "looplock"))
HELPERS = Path(__file__).resolve().parent / "helpers"
PY = sys.executable
TIMEOUT = 30  # seconds, for any single subprocess
# The ASan+UBSan build (scripts/test's sanitize stage): its runtime needs
# /proc, handles SIGSEGV and SIGBUS itself, and reserves terabytes of
# address space, so a few fault tests cannot run there.
SANITIZED = os.environ.get("LOOPLOCK_SANITIZED") == "1"

# Exit statuses (looplock(1), EXIT STATUS; mirrors src/base/exit_codes.hpp).
EX_USAGE = 64
EX_NOINPUT = 66
EX_OSERR = 71
EX_CANTCREAT = 73
EX_VANISHED = 74
EX_TEMPFAIL = 75
EX_NOTEXEC = 126
EX_NOTFOUND = 127


def helper(name):
    return str(HELPERS / name)


@pytest.fixture
def loop_dir(tmp_path):
    d = tmp_path / "loop"
    d.mkdir()
    return d


def run(args, timeout=TIMEOUT, env=None, input=None, **kw):
    """Runs looplock with args; returns CompletedProcess with text output."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.run(
        [LOOPLOCK, *[str(a) for a in args]],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        env=full_env,
        input=input,
        **kw,
    )


def start(args, env=None, **kw):
    """Starts looplock with args (pipes for all three streams)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    return subprocess.Popen(
        [LOOPLOCK, *[str(a) for a in args]],
        stdin=kw.pop("stdin", subprocess.PIPE),
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=kw.pop("stderr", subprocess.PIPE),
        text=True,
        env=full_env,
        **kw,
    )


def read_until(proc, stream, matches, timeout=TIMEOUT):
    """Reads lines from `stream` (proc.stdout or proc.stderr) until one for
    which matches(line) holds: returns (True, the lines read). When the stream
    ends or `timeout` passes first, kills proc and returns (False, lines)."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        if not sel.select(timeout=max(0.0, end - time.monotonic())):
            break
        line = stream.readline()
        if line == "":
            break
        seen.append(line)
        if matches(line):
            return True, seen
    proc.kill()
    return False, seen


def expect_line(proc, expected="ready", timeout=TIMEOUT):
    """Reads proc.stdout until a line equal to `expected` (handshake)."""
    found, seen = read_until(proc, proc.stdout, lambda line: line.rstrip("\n") == expected, timeout)
    if not found:
        raise AssertionError(f"no {expected!r} line from pid {proc.pid}; saw {seen!r}")
    return seen


class Holder:
    """A process that holds the lock until release() (stdin is closed)."""

    def __init__(self, proc):
        self.proc = proc

    @property
    def pid(self):
        return self.proc.pid

    def release(self, timeout=TIMEOUT):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)


def hold(loop_dir, tool="looplock", shared=False, extra=()):
    """Takes DIR/.state.lock with `tool` (looplock, flock or python) and
    returns a Holder once the lock is visibly held."""
    lock = Path(loop_dir) / ".state.lock"
    waiter = [PY, helper("wait_stdin.py")]
    if tool == "looplock":
        args = [LOOPLOCK, *extra, *(["-s"] if shared else []), "-p", "blocking", str(loop_dir), "--", *waiter]
    elif tool == "flock":
        args = ["flock", *(["-s"] if shared else []), str(lock), *waiter]
    elif tool == "python":
        args = [PY, helper("hold.py"), str(lock), *(["--shared"] if shared else [])]
    else:
        raise ValueError(tool)
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    expect_line(proc, "ready")
    return Holder(proc)


@pytest.fixture
def holders():
    """Collects Holders and makes sure none outlives the test."""
    made = []

    def make(*a, **kw):
        h = hold(*a, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.kill()


def lock_is_free(loop_dir):
    """Whether a non-blocking flock on DIR/.state.lock succeeds right now."""
    fd = os.open(Path(loop_dir) / ".state.lock", os.O_RDONLY | os.O_CREAT, 0o660)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def expected_lock_id(d):
    """The lock_id any tool computes: the first 16 hex digits of the SHA-256
    of the lock file's canonical path (looplock-files(5))."""
    return hashlib.sha256((os.path.realpath(d) + "/.state.lock").encode()).hexdigest()[:16]


def read_record(loop_dir):
    text = (Path(loop_dir) / ".state.lock").read_text()
    return json.loads(text) if text else None


def incident_rows(loop_dir):
    p = Path(loop_dir) / ".state.lock.incidents.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line]


def signame(sig):
    return signal.Signals(sig).name


def expect_stderr(proc, needle, timeout=TIMEOUT):
    """Reads proc.stderr until a line containing `needle` (handshake)."""
    found, seen = read_until(proc, proc.stderr, lambda line: needle in line, timeout)
    if not found:
        raise AssertionError(f"no {needle!r} on stderr of pid {proc.pid}; saw {seen!r}")
    return seen


def eventually(pred, timeout=10.0):
    """Polls pred until it holds or `timeout` passes (a bounded wait for a
    state change that has no handshake); returns pred's last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


def wait_until(pred, what, timeout=10.0):
    """eventually(pred), failing the test, naming `what`, if it never holds."""
    if not eventually(pred, timeout):
        raise AssertionError(f"timed out waiting for {what}")


def proc_state(pid):
    """The state letter of /proc/PID/stat, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2]


def running(pid):
    """Alive and not a zombie waiting to be reaped."""
    return proc_state(pid) not in (None, "Z", "X")


def kill_and_wait_gone(pid):
    """SIGKILL to pid (when it is still there), then wait until it is gone or
    a zombie."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    wait_until(lambda: not running(pid), f"pid {pid} to die")


def blocked_waiters(path):
    """Pids that /proc/locks shows blocked in flock(2) on `path`'s inode."""
    ino = os.stat(path).st_ino
    pids = set()
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 6 and parts[1] == "->" and parts[2] == "FLOCK":
                if int(parts[6].rsplit(":", 1)[1]) == ino:
                    pids.add(int(parts[5]))
    return pids


def fds_on(pid, path):
    """The fd numbers of process PID that refer to the file at `path`."""
    st = os.stat(path)
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            s = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            out.append(int(fd))
    return out


def flock_holder(lock_path):
    """flock(1) holding lock_path until stdin closes (prints ready); the
    returned Popen is released with release()."""
    p = subprocess.Popen(["flock", str(lock_path), "sh", "-c", "echo ready; read x"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    expect_line(p, "ready")
    return p


def release(p):
    """Ends a flock_holder(): closes its stdin and waits (kills it if it hangs)."""
    if p.poll() is None:
        try:
            p.stdin.close()
        except OSError:
            pass
    try:
        p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=TIMEOUT)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size="1m", prepare=None, ro=False): a fresh small tmpfs at
    tmp_path/mntN; `prepare(mnt)` runs on it, then it is remounted read-only
    when ro. Skips when mounting is not permitted; unmounts at the end."""
    mounted = []

    def mount(size="1m", prepare=None, ro=False):
        mnt = tmp_path / f"mnt{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mnt)],
                           capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        if prepare:
            prepare(mnt)
        if ro:
            r = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True,
                               timeout=TIMEOUT)
            if r.returncode != 0:
                pytest.skip(f"cannot remount the tmpfs read-only: {r.stderr.strip()}")
        return mnt

    yield mount
    for mnt in reversed(mounted):
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=TIMEOUT).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=TIMEOUT)


def fill_disk(mnt):
    """Fills the file system at `mnt` (a tmpfs of the fixture above; as
    root, tmpfs keeps no reserve) with the file mnt/filler, to ENOSPC, and
    proves it full; returns the filler's path (unlink it to free the
    space)."""
    filler = Path(mnt) / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (b"\0" * 4096, b"\0"):
            try:
                while f.write(chunk):
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    probe = Path(mnt) / "probe"
    try:
        probe.write_bytes(b"x" * 8192)
    except OSError:
        pass
    else:
        raise AssertionError(f"{mnt} is not full after {filler.stat().st_size} bytes")
    finally:
        probe.unlink(missing_ok=True)
    return filler


# --- signals, jobs and terminals (test_signals.py, test_jobs.py) ---------------

SIGWAIT = helper("sigwait_print.py")  # counts each delivery (see its docstring)
PRINT_SIGNALS = helper("print_signals.py")
READ_TIMEOUT = 10  # for one line that a signal just sent should produce
S = signal.Signals


def sig_name(sig):
    """The line print_signals.py prints for `sig`."""
    try:
        return S(sig).name
    except ValueError:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"


class Lines:
    """Line reader over a pipe's raw fd, with a timeout on every read (the
    buffered file objects of Popen cannot be combined with select)."""

    def __init__(self, stream):
        self.fd = stream.fileno()
        self.buf = b""
        self.eof = False
        self.seen = []

    def next(self, timeout=READ_TIMEOUT):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf and not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line within {timeout} s; saw {self.seen!r}, pending {self.buf!r}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                chunk = os.read(self.fd, 4096)
                if chunk:
                    self.buf += chunk
                else:
                    self.eof = True
        if not self.buf:
            return None  # end of file
        line, sep, rest = self.buf.partition(b"\n")
        self.buf = rest
        text = line.decode(errors="replace")
        self.seen.append(text)
        return text

    def until(self, pred, timeout=READ_TIMEOUT):
        """Reads lines until one satisfies pred; returns it."""
        end = time.monotonic() + timeout
        while True:
            line = self.next(max(0.01, end - time.monotonic()))
            if line is None:
                raise AssertionError(f"end of output before the expected line; saw {self.seen!r}")
            if pred(line):
                return line

    def expect(self, text, timeout=READ_TIMEOUT):
        return self.until(lambda line: line == text, timeout)

    def rest(self, timeout=READ_TIMEOUT):
        """All remaining lines, up to end of file."""
        out = []
        while (line := self.next(timeout)) is not None:
            out.append(line)
        return out


@pytest.fixture
def procs():
    """Starts looplock (conftest.start) and makes sure nothing outlives the test."""
    made = []

    class Starter:
        def start(self, args, **kw):
            kw.setdefault("preexec_fn", fresh_signal_state)
            p = start(args, **kw)
            made.append(p)
            return p

        def popen(self, argv, **kw):
            p = subprocess.Popen(argv, **kw)
            made.append(p)
            return p

        def __init__(self):
            self.extra_pids = []

    s = Starter()
    yield s
    for pid in s.extra_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=TIMEOUT)


def fresh_signals():
    """What a process started by an ordinary caller has: default dispositions
    (the test itself may run in a background job, whose shell ignored INT and
    QUIT, or under nohup)."""
    for s in FRESH:
        signal.signal(s, signal.SIG_DFL)


def fresh_signal_state():
    """fresh_signals(), and no core files (looplock may die of QUIT)."""
    fresh_signals()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(entry))
    return out


def only_child(pid):
    kids = children(pid)
    assert len(kids) == 1, f"pid {pid} has children {kids}"
    return kids[0]


FRESH = [S.SIGHUP, S.SIGINT, S.SIGQUIT, S.SIGTERM, S.SIGUSR1, S.SIGUSR2, S.SIGALRM, S.SIGPIPE, S.SIGXFSZ]


class PtyJob:
    def __init__(self, shell, master):
        self.shell = shell
        self.master = master
        self.out = Lines(shell.stdout)  # the command's stdout
        self.err = Lines(shell.stderr)  # pty_job.py's reports (and looplock's stderr)
        self.pid = None

    def started(self):
        self.pid = int(self.err.until(lambda line: line.startswith("pty_job: job ")).split()[-1])
        return self

    def type(self, data):
        os.write(self.master, data)

    def status(self):
        return self.err.until(lambda line: line.startswith(("pty_job: exit", "pty_job: signal")))


@pytest.fixture
def pty_job(procs):
    """Runs looplock as the foreground job of a fresh pseudo-terminal
    (helpers/pty_job.py plays the interactive shell)."""
    masters = []
    jobs = []

    def make(args, looplock=True):
        """Runs looplock ARGS (or, with looplock=False, the command ARGS) as the job."""
        try:
            master, slave = os.openpty()
        except OSError as e:
            pytest.skip(f"no pseudo-terminal available: {e}")
        masters.append(master)
        try:
            shell = procs.popen([PY, helper("pty_job.py"), *([LOOPLOCK] if looplock else []), *map(str, args)],
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        finally:
            os.close(slave)
        job = PtyJob(shell, master)
        try:
            job.started()
        except AssertionError:
            said = "\n".join(job.err.seen) + job.err.buf.decode(errors="replace")
            if "TIOCSCTTY" in said or "tcsetpgrp" in said:
                pytest.skip(f"cannot make the pseudo-terminal a controlling terminal here: {said}")
            raise
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for m in masters:
        os.close(m)


# --- namespaces (test_nesting.py, test_inspect.py, test_jobs.py) ----------------------

# Runs a command in a mount namespace of its own where /proc is an empty
# tmpfs: as in a container without /proc.
NO_PROC = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs none /proc && exec "$@"', "sh"]
# Runs a command as PID 1 of a new pid namespace with its own /proc.
PID_NS = ["unshare", "--pid", "--fork", "--mount-proc"]


def need_no_proc():
    if SANITIZED:
        pytest.skip("the sanitizer runtime cannot start without /proc")
    probe = subprocess.run([*NO_PROC, "sh", "-c", "test ! -e /proc/self"], capture_output=True, text=True,
                           timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot hide /proc in a mount namespace here: {probe.stderr.strip()}")


def need_pid_namespace():
    probe = subprocess.run([*PID_NS, "true"], capture_output=True, text=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.strip()}")


@pytest.fixture
def public_base():
    """A fresh root-owned 0755 directory under /tmp that any uid can search
    (tmp_path's parents may not be), for runs as other users; removed at the
    end, whatever modes the test left below it."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="looplock-users-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        for dirpath, dirnames, _ in os.walk(base):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o700)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def world_dir():
    """A fresh 0755 directory under /tmp (whose parents other users can
    search), with a loop dir in it; removed at the end."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="looplock-world-", dir="/tmp"))
    os.chmod(base, 0o755)
    d = base / "loop"
    d.mkdir(mode=0o755)
    try:
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- the benchmark report (test_bench_smoke.py, test_bench_report.py) ---------

# Its sections, in order (scripts/benchlib/report.py).
BENCH_SECTIONS = [
    "# looplock benchmarks",
    "## Machine",
    "## 1. Uncontended",
    "## 2. Contended throughput",
    "## 3. Hand-off latency",
    "## 4. Deadline precision",
    "## 5. Memory",
    "## 6. Cluster lock",
    "## Targets",
    "## Plot",
    "## What was tried",
]

# A "What was tried" section as the lead keeps it by hand: the next report
# must end with it, verbatim.
BENCH_TRIED = """## What was tried

- 2026-11-30: tried X; it made no difference (notes kept by hand).

### A sub-heading the lead wrote

| a | b |
|---|---|
| 1 | 2 |
"""


def bench_section(text, heading):
    """The part of a report from heading to the next "## " heading."""
    body = text[text.find(heading):]
    return body[:body.find("\n## ", 1)]
