"""A tick of a --once-per schedule, for the slot tests.

    slot_tick.py HISTORY LABEL [hold|SECONDS]

Appends "LABEL PID WALL_MS LOOPLOCK_FENCING_TOKEN" to HISTORY (one write on
an O_APPEND descriptor, so that ticks of several processes never mix), prints
"ready", then holds until its stdin closes ("hold") or sleeps SECONDS
(default 0), and exits 0."""
import os
import sys
import time

history, label = sys.argv[1], sys.argv[2]
how = sys.argv[3] if len(sys.argv) > 3 else "0"
fd = os.open(history, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
token = os.environ.get("LOOPLOCK_FENCING_TOKEN", "-")
os.write(fd, f"{label} {os.getpid()} {time.time_ns() // 1_000_000} {token}\n".encode())
os.close(fd)
print("ready", flush=True)
if how == "hold":
    sys.stdin.read()
else:
    time.sleep(float(how))
