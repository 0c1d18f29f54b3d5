"""A job for the --holders history tests.

    holder_tick.py HISTORY LABEL BARRIER [BEYOND]

Appends "start LABEL INDEX STAMP" to HISTORY (INDEX: LOOPLOCK_HOLDER_INDEX,
or "-"; STAMP: CLOCK_MONOTONIC ns), waits (at most 20 s) until HISTORY holds
at least BARRIER starts, so that the runs the lock lets in at once are seen
together, then appends "end LABEL INDEX STAMP". With BEYOND, it then stays
up to 0.5 s more, or until BEYOND runs are inside at once (starts less ends):
room for a run the lock should have kept out to show itself in the history."""
import os
import sys
import time

history, label, barrier = sys.argv[1], sys.argv[2], int(sys.argv[3])
beyond = int(sys.argv[4]) if len(sys.argv) > 4 else 0
index = os.environ.get("LOOPLOCK_HOLDER_INDEX", "-")


def note(what):
    fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{what} {label} {index} {time.monotonic_ns()}\n".encode())
    os.close(fd)


def starts():
    with open(history) as f:
        return sum(line.startswith("start ") for line in f)


def inside():
    with open(history) as f:
        lines = f.read().splitlines()
    return sum(x.startswith("start ") for x in lines) - sum(x.startswith("end ") for x in lines)


note("start")
until = time.monotonic() + 20
while starts() < barrier and time.monotonic() < until:
    time.sleep(0.01)
until = time.monotonic() + 0.5
while beyond and inside() < beyond and time.monotonic() < until:
    time.sleep(0.01)
note("end")
