# examples/python/loop_lock.py as it was before it nested the way looplock
# does (it trusted LOOPLOCK_FD alone), kept unchanged so that test_examples.py
# can show the waits for its own parent that the example has no more. Do not fix.
"""How cooperating Python code takes a loop's lock: the same flock(2) lock on
LOOP_DIR/.state.lock that looplock, flock(1) and fcntl.flock take.

    from loop_lock import _loop_lock

    with _loop_lock("/srv/loops/nightly"):
        ...  # read .state.loop, change it, write it back

When this code already runs under looplock for the same loop (say
`looplock /srv/loops/nightly -- python3 status.py --tick`), opening
.state.lock again and locking it would wait for its own parent, forever: a
flock(2) lock belongs to an open file, and the new open is another one. So
_loop_lock first checks whether it inherited the lock (LOOPLOCK_FD, for the
same directory, the same file, and locked exclusively through that fd) and
then simply runs inside the parent's critical section. It never unlocks or
closes an inherited fd: that would release the lock for looplock too.

As a script, `python3 loop_lock.py LOOP_DIR` takes the lock and says how
("inherited fd N" or "opened fd N").
"""
import contextlib
import fcntl
import os
import time

LOCK_NAME = ".state.lock"


def _inherited_lock_fd(loop_path):
    """The lock fd inherited from a looplock that holds LOOP_PATH's lock
    exclusively, or None."""
    try:
        fd = int(os.environ["LOOPLOCK_FD"])
    except (KeyError, ValueError):
        return None
    if os.environ.get("LOOPLOCK_DIR") != os.path.realpath(loop_path):
        return None  # running under looplock, but for another loop
    try:
        held = os.fstat(fd)
        lock = os.stat(os.path.join(loop_path, LOCK_NAME), follow_symlinks=False)
    except OSError:
        return None  # the fd was closed (or the file is gone): not inherited
    if (held.st_dev, held.st_ino) != (lock.st_dev, lock.st_ino):
        return None  # a stale LOOPLOCK_FD that now names some other file
    # Linux lists the locks held through an open file in /proc/self/fdinfo.
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            info = f.read()
    except OSError:
        return fd  # no /proc: trust the checks above
    if "FLOCK  ADVISORY  WRITE" in info.replace("\t", " "):
        return fd
    if "FLOCK  ADVISORY  READ" in info.replace("\t", " "):
        raise RuntimeError(
            f"running under `looplock -s` for {loop_path}: the inherited lock is shared, "
            "and converting it to exclusive could lose it; use looplock without -s")
    return None  # the fd is the lock file, but nothing is locked through it


@contextlib.contextmanager
def _loop_lock(loop_path, timeout=None):
    """Holds LOOP_PATH/.state.lock exclusively for the `with` block; yields
    the lock fd. timeout (seconds) bounds the wait: TimeoutError after it
    (None waits without limit)."""
    fd = _inherited_lock_fd(loop_path)
    if fd is not None:
        yield fd  # looplock holds it for us: never unlock or close it
        return
    fd = os.open(os.path.join(loop_path, LOCK_NAME),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
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
                        raise TimeoutError(f"{loop_path}/{LOCK_NAME} still held after {timeout} s") from None
                    time.sleep(0.01)
        yield fd
    finally:
        os.close(fd)  # closing our own open file releases its lock


if __name__ == "__main__":
    import sys

    loop = sys.argv[1]
    inherited = _inherited_lock_fd(loop) is not None
    with _loop_lock(loop) as lock_fd:
        print(f"{'inherited' if inherited else 'opened'} fd {lock_fd}", flush=True)
