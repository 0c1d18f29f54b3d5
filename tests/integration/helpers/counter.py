"""One read-modify-write tick of a loop script: reads DIR/.state.loop (JSON),
increments "count", and writes it back with tmp-then-replace, like the loop
scripts' _write_state_loop. The sleep between read and write widens the race
window, so that unprotected concurrent ticks lose updates.

An occupancy marker (DIR/.occupied, created with O_EXCL) detects two ticks
inside the critical section at once; on overlap the tick exits 3.

usage: counter.py DIR [SLEEP_SECONDS]
"""
import json
import os
import sys
import time

loop = sys.argv[1]
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.002
state = os.path.join(loop, ".state.loop")
marker = os.path.join(loop, ".occupied")

try:
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    owned = True
except FileExistsError:
    owned = False
try:
    try:
        with open(state) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"count": 0}
    time.sleep(pause)
    data["count"] += 1
    tmp = f"{state}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, state)
finally:
    if owned:
        os.unlink(marker)
sys.exit(0 if owned else 3)
