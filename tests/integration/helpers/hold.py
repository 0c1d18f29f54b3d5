"""Holds LOCKFILE with Python's fcntl.flock (as the loop scripts' _loop_lock
helper does), prints "ready", and releases when stdin is closed.

usage: hold.py LOCKFILE [--shared]
"""
import fcntl
import os
import sys

path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660)
fcntl.flock(fd, fcntl.LOCK_SH if "--shared" in sys.argv[2:] else fcntl.LOCK_EX)
print("ready", flush=True)
sys.stdin.read()
fcntl.flock(fd, fcntl.LOCK_UN)
os.close(fd)
