"""How cooperating Python code takes a loop's lock: the same flock(2) lock on
LOOP_DIR/.state.lock that looplock, flock(1) and fcntl.flock take.

    from loop_lock import _loop_lock

    with _loop_lock("/srv/loops/nightly"):
        ...  # read .state.loop, change it, write it back

When this code already runs under looplock for the same loop (say
`looplock /srv/loops/nightly -- python3 status.py --tick`), opening
.state.lock again and locking it would wait for its own parent, forever: a
flock(2) lock belongs to an open file, and the new open is another one. So
_loop_lock first checks, as a nested looplock does (looplock-sharing(7),
NESTING), whether it already runs inside that looplock's critical section,
and then simply runs there:

- its own descriptor LOOPLOCK_HOLDER_FD (or LOOPLOCK_FD), inherited from
  looplock, is this very lock file and holds the lock; or
- that descriptor is gone (under `looplock -o`, or in a child that Python's
  subprocess started without pass_fds), but LOOPLOCK_HOLDER_PID is an
  ancestor of this process whose descriptor LOOPLOCK_HOLDER_FD is this very
  lock file and holds the lock.

Linux shows both in /proc (/proc/PID/fdinfo/N lists the locks held through
descriptor N). A forged or stale environment (variables copied into a cron
line, a holder that has exited, another loop's lock, a descriptor that does
not hold the lock), or no /proc, never bypasses the lock: _loop_lock then
takes it as usual. It never unlocks or closes an inherited descriptor: that
would release the lock for looplock too.

A missing lock file is created with mode 0660 (less the umask), as looplock
creates it: flock(2) needs only a read descriptor, so any local user who can
read the file can take the lock and stall every run.

On Windows (looplock-windows(7)) the lock is the C runtime's on byte 0,
msvcrt.locking(fd, LK_NBLCK, 1), which looplock.exe takes there too. There
LK_LOCK is no blocking lock (it gives up after about 10 s), so _loop_lock
tries LK_NBLCK every 10 ms until its own deadline (none: for ever). And no
command holds looplock.exe's lock, so under looplock.exe _loop_lock nests
only when LOOPLOCK_HOLDER_PID names a live ancestor that is a looplock with
the creation time its current holder record (LOOP_DIR/.state.lock.holder)
gives it, and the lock is held: then it runs inside that hold. A copied
environment or a rewritten record alone never bypasses the lock. (This path
is tested with the system's facts stood in for, on Linux; looplock.exe's own
nesting is tested under wine.)

As a script, `python3 loop_lock.py LOOP_DIR` takes the lock and says how
("inherited fd N", "held by ancestor pid P" or "opened fd N").
"""
import contextlib
import json
import os
import time

if os.name == "nt":
    import msvcrt
else:
    import fcntl

LOCK_NAME = ".state.lock"


def _lock_mode(pid, fd, lock):
    """"WRITE" (exclusive) or "READ" (shared) if descriptor FD of process PID
    ("self" or a number) is the file LOCK (an os.stat_result) and holds its
    flock(2) lock; else None."""
    try:
        st = os.stat(f"/proc/{pid}/fd/{fd}")
        if (st.st_dev, st.st_ino) != (lock.st_dev, lock.st_ino):
            return None
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            for line in f:  # lock:  1: FLOCK  ADVISORY  WRITE 2181 fe:00:10952825 0 EOF
                words = line.split()
                if words[:1] == ["lock:"] and words[2:4] == ["FLOCK", "ADVISORY"]:
                    return words[4]
    except (OSError, IndexError):
        pass
    return None


def _is_ancestor(pid):
    """Whether PID is this process or one of its ancestors."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return False  # /proc of another pid namespace: its pids are not ours
        p = os.getpid()
        while p > 0 and p != pid:
            with open(f"/proc/{p}/stat") as f:  # "PID (COMM) STATE PPID ..."
                p = int(f.read().rpartition(")")[2].split()[1])
        return p == pid
    except (OSError, ValueError, IndexError):
        return False


def _outer_lock(lock_path):
    """(pid, fd) when the looplock this process runs under holds LOCK_PATH
    exclusively through descriptor fd: of this process (pid None), inherited,
    or of that ancestor looplock (pid). None when nothing confirms it."""
    try:
        lock = os.stat(lock_path, follow_symlinks=False)
    except OSError:
        return None  # no lock file: nobody holds it
    env = os.environ
    pid, holder_fd = env.get("LOOPLOCK_HOLDER_PID", ""), env.get("LOOPLOCK_HOLDER_FD", "")
    candidates = [("self", holder_fd), ("self", env.get("LOOPLOCK_FD", ""))]
    if pid.isdigit() and _is_ancestor(int(pid)):
        candidates.append((pid, holder_fd))
    for who, fd in candidates:
        mode = _lock_mode(who, fd, lock) if fd.isdigit() else None
        if mode == "READ":
            index = env.get("LOOPLOCK_HOLDER_INDEX", "")
            if index:
                raise RuntimeError(
                    f"running inside holder {index} of `looplock --holders` for {lock_path}: "
                    "the lock is held shared by this job's looplock, so an exclusive lock here "
                    "would wait for its own holder; run this step outside the --holders run")
            raise RuntimeError(
                f"running under `looplock -s` for {lock_path}: the lock is held shared, "
                "and converting it to exclusive could lose it; use looplock without -s")
        if mode == "WRITE":
            return (None if who == "self" else int(who)), int(fd)
    return None


class _WindowsFacts:
    """What Windows tells of processes and of the lock (ctypes), for
    _windows_outer_holder, which takes them as an argument."""

    def __init__(self):
        import ctypes
        from ctypes import wintypes
        self.ctypes, self.wintypes = ctypes, wintypes
        self.kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)

    def parents(self):
        """{pid: parent pid} of every process, from one Toolhelp snapshot."""
        ctypes, w = self.ctypes, self.wintypes

        class Entry(ctypes.Structure):
            _fields_ = [("dwSize", w.DWORD), ("cntUsage", w.DWORD), ("th32ProcessID", w.DWORD),
                        ("th32DefaultHeapID", ctypes.c_size_t), ("th32ModuleID", w.DWORD),
                        ("cntThreads", w.DWORD), ("th32ParentProcessID", w.DWORD), ("pcPriClassBase", w.LONG),
                        ("dwFlags", w.DWORD), ("szExeFile", w.WCHAR * 260)]
        k = self.kernel32
        k.CreateToolhelp32Snapshot.restype = w.HANDLE
        snap = k.CreateToolhelp32Snapshot(2, 0)  # TH32CS_SNAPPROCESS
        if snap in (None, w.HANDLE(-1).value):
            return {}
        out, e = {}, Entry()
        e.dwSize = ctypes.sizeof(Entry)
        more = k.Process32FirstW(w.HANDLE(snap), ctypes.byref(e))
        while more:
            out[e.th32ProcessID] = e.th32ParentProcessID
            more = k.Process32NextW(w.HANDLE(snap), ctypes.byref(e))
        k.CloseHandle(w.HANDLE(snap))
        return out

    def _open(self, pid):
        self.kernel32.OpenProcess.restype = self.wintypes.HANDLE
        return self.kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION

    def created(self, pid):
        """Process PID's creation time (100 ns units since 1601, as
        looplock.exe records it), or None when it has exited or cannot be
        read."""
        ctypes, w = self.ctypes, self.wintypes
        h = self._open(pid)
        if not h:
            return None
        times = [w.FILETIME() for _ in range(4)]
        ok = self.kernel32.GetProcessTimes(w.HANDLE(h), *(ctypes.byref(t) for t in times))
        self.kernel32.CloseHandle(w.HANDLE(h))
        created, exited = ((t.dwHighDateTime << 32) | t.dwLowDateTime for t in times[:2])
        return created if ok and exited == 0 else None

    def image_stem(self, pid):
        """Process PID's executable, without its directory and ".exe"."""
        ctypes, w = self.ctypes, self.wintypes
        h = self._open(pid)
        if not h:
            return None
        buf, size = ctypes.create_unicode_buffer(32768), w.DWORD(32768)
        ok = self.kernel32.QueryFullProcessImageNameW(w.HANDLE(h), 0, buf, ctypes.byref(size))
        self.kernel32.CloseHandle(w.HANDLE(h))
        return os.path.splitext(os.path.basename(buf.value))[0] if ok else None

    def lock_held(self, lock_path):
        """Whether another holds the lock: one try through a handle of our own."""
        try:
            fd = os.open(lock_path, os.O_RDONLY | os.O_BINARY | os.O_NOINHERIT)
        except OSError:
            return False
        try:
            msvcrt.locking(fd, msvcrt.LK_NBRLCK, 1)
        except OSError:
            return True
        else:
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
            return False
        finally:
            os.close(fd)


def _windows_is_ancestor(pid, facts, self_pid=None):
    """Whether PID is this process or an ancestor, by parent pids checked
    against creation times (a parent created after its child is a later
    process that got an exited parent's pid: the chain ends there)."""
    at = os.getpid() if self_pid is None else self_pid
    if at == pid:
        return True
    parents = facts.parents()
    for _ in range(1024):
        up = parents.get(at)
        if not up or up == at:
            return False
        child_time, parent_time = facts.created(at), facts.created(up)
        if child_time is None or parent_time is None or parent_time > child_time:
            return False
        if up == pid:
            return True
        at = up
    return False


def _windows_outer_holder(lock_path, env, facts, self_pid=None):
    """The pid of the looplock.exe this process runs under that holds
    LOCK_PATH on its behalf, or None when nothing confirms one (see the top
    of this file)."""
    pid = env.get("LOOPLOCK_HOLDER_PID", "")
    if not pid.isdigit():
        return None
    pid = int(pid)
    try:
        with open(lock_path + ".holder", encoding="utf-8") as f:
            record = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if record.get("pid") != pid or record.get("released_at") or not record.get("pid_start"):
        return None
    # This lock's: the ancestor exported the lock_id it holds, and the record
    # names the same (a record copied from another loop does not).
    if not record.get("lock_id") or env.get("LOOPLOCK_LOCK_ID") != record["lock_id"]:
        return None
    if str(facts.created(pid)) != record["pid_start"] or facts.image_stem(pid) != "looplock":
        return None
    if not _windows_is_ancestor(pid, facts, self_pid):
        return None
    return pid if facts.lock_held(lock_path) else None


@contextlib.contextmanager
def _windows_loop_lock(path, timeout):
    """_loop_lock on Windows: byte 0 by msvcrt.locking, tried every 10 ms."""
    if _windows_outer_holder(path, os.environ, _WindowsFacts()) is not None:
        yield None  # inside the ancestor looplock.exe's hold
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_BINARY | os.O_NOINHERIT, 0o660)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            os.lseek(fd, 0, os.SEEK_SET)  # msvcrt.locking locks from the file position
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                break
            except OSError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{path} still held after {timeout} s") from None
                time.sleep(0.01)
        try:
            yield fd
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _loop_lock(loop_path, timeout=None):
    """Holds LOOP_PATH/.state.lock exclusively for the `with` block. Yields
    the descriptor this process holds it through, or None when an ancestor
    looplock holds it on this process's behalf. timeout (seconds) bounds the
    wait: TimeoutError after it (None waits without limit)."""
    path = os.path.join(loop_path, LOCK_NAME)
    if os.name == "nt":
        with _windows_loop_lock(path, timeout) as held:
            yield held
        return
    outer = _outer_lock(path)
    if outer is not None:
        yield outer[1] if outer[0] is None else None  # never unlock or close it
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
    try:
        if timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{path} still held after {timeout} s") from None
                    time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)  # closing our own open file releases its lock


if __name__ == "__main__":
    import sys

    loop = sys.argv[1]
    path = os.path.join(loop, LOCK_NAME)
    if os.name == "nt":
        pid = _windows_outer_holder(path, os.environ, _WindowsFacts())
        outer = None if pid is None else (pid, None)
    else:
        outer = _outer_lock(path)
    with _loop_lock(loop) as lock_fd:
        if outer is None:
            print(f"opened fd {lock_fd}", flush=True)
        elif outer[0] is None:
            print(f"inherited fd {lock_fd}", flush=True)
        else:
            print(f"held by ancestor pid {outer[0]}", flush=True)
