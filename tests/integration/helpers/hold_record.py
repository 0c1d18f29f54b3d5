"""Holds LOCKFILE with fcntl.flock (exclusive), writes a forged holder record
into it that names this very process (its pid and its real pid_start), prints
"ready", and releases when stdin is closed. Used to give --inspect a live,
consistent holder whose record says whatever the test wants (an old
acquired_at, another agent, ...).

usage: hold_record.py LOCKFILE RECORD_JSON
  RECORD_JSON is a JSON object; its "pid" and "pid_start" are replaced by this
  process's own unless it sets "keep_pid": true (which is then removed);
  "blank_start": true leaves pid_start empty.
"""
import fcntl
import json
import os
import sys


def pid_start(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rindex(")") + 2:].split()[19]  # field 22 (starttime)


path, record = sys.argv[1], json.loads(sys.argv[2])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660)
fcntl.flock(fd, fcntl.LOCK_EX)
blank_start = record.pop("blank_start", False)
if not record.pop("keep_pid", False):
    record["pid"] = os.getpid()
    record["pid_start"] = pid_start(os.getpid())
if blank_start:  # as a writer without /proc leaves it
    record["pid_start"] = ""
data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
os.pwrite(fd, data, 0)
os.ftruncate(fd, len(data))
print("ready", flush=True)
sys.stdin.read()
fcntl.flock(fd, fcntl.LOCK_UN)
os.close(fd)
