"""A cluster lock holder's command for the history tests.

    history_hold.py FIFO obey|ignore

Writes "start TOKEN STAMP" (LOOPLOCK_FENCING_TOKEN, CLOCK_MONOTONIC ns) into
FIFO, prints "ready", and holds until its stdin closes. With "obey" a TERM
ends it; with "ignore" TERM is ignored (only KILL ends it). When it exits by
itself it writes "end STAMP" just before."""
import os
import signal
import sys
import time

fifo, mode = sys.argv[1], sys.argv[2]
fd = os.open(fifo, os.O_WRONLY)
token = os.environ.get("LOOPLOCK_FENCING_TOKEN", "0")


def end(*_):
    os.write(fd, f"end {time.monotonic_ns()}\n".encode())
    os._exit(0)


if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, end)
os.write(fd, f"start {token} {time.monotonic_ns()}\n".encode())
print("ready", flush=True)
while sys.stdin.buffer.read(4096):
    pass
end()
