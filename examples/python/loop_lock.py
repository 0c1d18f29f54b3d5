"""How cooperating Python code takes a loop's lock: the same flock(2) lock on
LOOP_DIR/.state.lock that looplock, flock(1) and fcntl.flock take.

    from loop_lock import _loop_lock

    with _loop_lock("/srv/loops/nightly"):
        ...  # read .state.loop, change it, write it back

When this code already runs under looplock for the same loop (say
`looplock /srv/loops/nightly -- python3 status.py --tick`), opening
.state.lock again and locking it would wait for its own parent, forever: a
flock(2) lock belongs to an open file, and the new open is another one. So
_loop_lock first checks, as a nested looplock does (looplock(1), ENVIRONMENT,
Nesting), whether it already runs inside that looplock's critical section,
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

As a script, `python3 loop_lock.py LOOP_DIR` takes the lock and says how
("inherited fd N", "held by ancestor pid P" or "opened fd N").
"""
import contextlib
import fcntl
import os
import time

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
            raise RuntimeError(
                f"running under `looplock -s` for {lock_path}: the lock is held shared, "
                "and converting it to exclusive could lose it; use looplock without -s")
        if mode == "WRITE":
            return (None if who == "self" else int(who)), int(fd)
    return None


@contextlib.contextmanager
def _loop_lock(loop_path, timeout=None):
    """Holds LOOP_PATH/.state.lock exclusively for the `with` block. Yields
    the descriptor this process holds it through, or None when an ancestor
    looplock holds it on this process's behalf. timeout (seconds) bounds the
    wait: TimeoutError after it (None waits without limit)."""
    path = os.path.join(loop_path, LOCK_NAME)
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
    outer = _outer_lock(os.path.join(loop, LOCK_NAME))
    with _loop_lock(loop) as lock_fd:
        if outer is None:
            print(f"opened fd {lock_fd}", flush=True)
        elif outer[0] is None:
            print(f"inherited fd {lock_fd}", flush=True)
        else:
            print(f"held by ancestor pid {outer[0]}", flush=True)
