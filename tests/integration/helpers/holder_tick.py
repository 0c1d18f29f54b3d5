"""A job for the --holders history tests.

    holder_tick.py HISTORY LABEL BARRIER

Appends "start LABEL INDEX STAMP" to HISTORY (INDEX: LOOPLOCK_HOLDER_INDEX,
or "-"; STAMP: CLOCK_MONOTONIC ns), waits (at most 20 s) until HISTORY holds
at least BARRIER starts, so that the runs the lock lets in at once are seen
together, then appends "end LABEL INDEX STAMP"."""
import os
import sys
import time

history, label, barrier = sys.argv[1], sys.argv[2], int(sys.argv[3])
index = os.environ.get("LOOPLOCK_HOLDER_INDEX", "-")


def note(what):
    fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{what} {label} {index} {time.monotonic_ns()}\n".encode())
    os.close(fd)


def starts():
    with open(history) as f:
        return sum(line.startswith("start ") for line in f)


note("start")
until = time.monotonic() + 20
while starts() < barrier and time.monotonic() < until:
    time.sleep(0.01)
note("end")
