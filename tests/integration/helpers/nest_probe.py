"""A command for nesting tests: prints one JSON line with what it sees of
DIR/.state.lock, then exits with STATUS (default 0).

    pid, ppid        this process and its parent (the looplock that ran it)
    held             whether the lock is held by someone (a fresh open file
                     description cannot take it, even shared)
    kernel           the flock(2) locks /proc/locks reports on the file, as
                     [pid, "WRITE"|"READ"] pairs
    record           the lock file's content parsed as JSON (null if empty,
                     the raw text if it is not JSON)
    env              the LOOPLOCK_* variables it was given

usage: nest_probe.py DIR [STATUS]
"""
import fcntl
import json
import os
import sys

lock = os.path.join(sys.argv[1], ".state.lock")
status = int(sys.argv[2]) if len(sys.argv) > 2 else 0

st = os.stat(lock)
fd = os.open(lock, os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    held = False
    fcntl.flock(fd, fcntl.LOCK_UN)
except BlockingIOError:
    held = True
finally:
    os.close(fd)

kernel = []
with open("/proc/locks") as f:
    for line in f:
        w = line.split()
        if len(w) < 6 or w[1] != "FLOCK":
            continue  # blocked waiters ("->") and other lock kinds
        maj, mnr, ino = w[5].split(":")
        if (int(maj, 16), int(mnr, 16), int(ino)) == (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino):
            kernel.append([int(w[4]), w[3]])

with open(lock) as f:
    text = f.read()
try:
    record = json.loads(text) if text else None
except ValueError:
    record = text

print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "held": held, "kernel": sorted(kernel),
                  "record": record, "env": {k: v for k, v in os.environ.items() if k.startswith("LOOPLOCK_")}}),
      flush=True)
sys.exit(status)
