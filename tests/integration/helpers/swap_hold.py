"""Holds LOCKFILE exclusively with fcntl.flock and prints "ready". For each
line "swap" on stdin it replaces the lock file and keeps the lock across the
swap: it creates and locks a new file, renames it over LOCKFILE, then closes
(releases) the old one, and prints "swapped". A waiter blocked on the old
file is then woken with the lock, finds the path names another file, and
must wait again. Exits (releasing) when stdin is closed.

usage: swap_hold.py LOCKFILE
"""
import fcntl
import os
import sys

path = sys.argv[1]
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "swap":
        tmp = f"{path}.swap.{os.getpid()}"
        new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(new, fcntl.LOCK_EX)
        os.rename(tmp, path)
        os.close(fd)
        fd = new
        print("swapped", flush=True)
os.close(fd)
