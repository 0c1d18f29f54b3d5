"""A stand-in for a loop's scripts/status.py, for the examples/ tests.

Appends one JSON line per call to $FAKE_STATUS_LOG: its arguments, the
LOOPLOCK_* variables it sees, and whether the loop's lock is held while it
runs (it opens DIR/.state.lock anew and tries a non-blocking flock: that fails
while looplock, or anyone else, holds the lock). With --tick it also does a
read-modify-write of DIR/.state.loop (iteration_count += 1).

The loop dir is $FAKE_STATUS_LOOP, else $LOOPLOCK_DIR. With $FAKE_STATUS_HANG
set it then prints "ready" and hangs (a tick that never ends) until a signal
ends it. With $FAKE_STATUS_FAIL set to one of its arguments (--tick, say) it
exits 1 after logging the call (a failing tick).

usage: fake_status.py [--tick | --approve --loop NAME | --check-gate | ...]
"""
import errno
import fcntl
import json
import os
import sys
import time

loop = os.environ.get("FAKE_STATUS_LOOP") or os.environ.get("LOOPLOCK_DIR")
log = os.environ["FAKE_STATUS_LOG"]


def lock_held():
    if not loop:
        return None
    fd = os.open(os.path.join(loop, ".state.lock"), os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno != errno.EWOULDBLOCK:
            raise
        return True
    finally:
        os.close(fd)


entry = {
    "argv": sys.argv[1:],
    "pid": os.getpid(),
    "lock_held": lock_held(),
    **{k: v for k, v in os.environ.items() if k.startswith("LOOPLOCK_")},
}

if "--tick" in sys.argv[1:]:
    state = os.path.join(loop, ".state.loop")
    try:
        with open(state) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"iteration_count": 0}
    data["iteration_count"] += 1
    tmp = f"{state}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, state)

with open(log, "a") as f:
    f.write(json.dumps(entry) + "\n")

if os.environ.get("FAKE_STATUS_FAIL") in sys.argv[1:]:
    sys.exit(1)

if os.environ.get("FAKE_STATUS_HANG"):
    print("ready", flush=True)
    while True:
        time.sleep(3600)
