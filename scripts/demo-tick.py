#!/usr/bin/env python3
"""A stand-in for a loop script's tick (status.py --tick): reads the loop
dir's .state.loop, bumps iteration_count, and writes it back with
tmp-then-replace. The write is atomic; the read-modify-write is not, which is
why two ticks at once lose updates unless something like looplock serialises
them.

usage: demo-tick.py LOOP_DIR
"""
import json
import os
import sys
import time

loop = sys.argv[1]
state = os.path.join(loop, ".state.loop")
try:
    with open(state) as f:
        data = json.load(f)
except FileNotFoundError:
    data = {"iteration_count": 0}
time.sleep(0.005)  # the tick's real work happens here
data["iteration_count"] += 1
data["last_tick_pid"] = os.getpid()
tmp = f"{state}.tmp.{os.getpid()}"
with open(tmp, "w") as f:
    json.dump(data, f)
os.replace(tmp, state)
