"""counter.py's tick inside the loop scripts' own lock: takes DIR/.state.lock
with Python's fcntl.flock (LOCK_EX, blocking, like the _loop_lock helper),
runs helpers/counter.py's tick unchanged, then releases.

usage: counter_flock.py DIR [SLEEP_SECONDS]
"""
import fcntl
import os
import runpy
import sys

loop = sys.argv[1]
fd = os.open(os.path.join(loop, ".state.lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
status = 0
try:
    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "counter.py"), *sys.argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
finally:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
sys.exit(status)
