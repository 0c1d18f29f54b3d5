"""A cluster lock holder's command for the history tests.

    history_hold.py FIFO obey|ignore

Writes "start TOKEN STAMP" (LOOPLOCK_FENCING_TOKEN, CLOCK_MONOTONIC ns) into
FIFO, prints "ready", and holds until its stdin closes. With "obey" a TERM
ends it; with "ignore" TERM is ignored (only KILL ends it). When it exits by
itself it writes "end STAMP" just before."""
import os
import select
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
# A TERM that arrives just before a blocking read() would run `end` only once
# that read returns: select() on stdin and a wakeup fd returns instead.
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
os.write(fd, f"start {token} {time.monotonic_ns()}\n".encode())
print("ready", flush=True)
while True:
    readable, _, _ = select.select([0, wake_r], [], [])
    if wake_r in readable:
        os.read(wake_r, 4096)
    if 0 in readable and not os.read(0, 4096):
        break
end()
