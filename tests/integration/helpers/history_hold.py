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

from stdin_end import StdinEnd

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
stdin_end = StdinEnd()  # a TERM just before "ready" still runs `end` at once
os.write(fd, f"start {token} {time.monotonic_ns()}\n".encode())
print("ready", flush=True)
stdin_end.wait()
end()
