"""Holds LOCKFILE exclusively with fcntl.flock, prints "ready", then keeps
dropping the exclusive lock and retaking it (converting to shared and back,
which the kernel does without letting an exclusive waiter in, but wakes
every waiter each time) until stdin is closed.

usage: churn_hold.py LOCKFILE
"""
import fcntl
import os
import select
import sys

fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.002)[0]:
    fcntl.flock(fd, fcntl.LOCK_SH)
    fcntl.flock(fd, fcntl.LOCK_EX)
os.close(fd)
