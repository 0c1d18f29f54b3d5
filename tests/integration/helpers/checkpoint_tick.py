"""A tick that stops at a safe point when looplock warns it (--warn-before).

    checkpoint_tick.py CHECKPOINT [ignore]

Works in small steps until the warning signal (USR1) comes, then writes how
far it got to CHECKPOINT and exits 0. It prints "ready", and, on the warning,
"warned AFTER_MS DEADLINE_LEFT_MS" (how long it had run, and how long
LOOPLOCK_DEADLINE still gave it). With "ignore" it notes each warning and
goes on until TERM, then prints "term WARNINGS" and exits 143."""
import os
import signal
import sys
import time

checkpoint = sys.argv[1]
ignore = len(sys.argv) > 2 and sys.argv[2] == "ignore"
started = time.monotonic()
deadline = float(os.environ["LOOPLOCK_DEADLINE"]) if "LOOPLOCK_DEADLINE" in os.environ else None
warnings = 0
stop = False


def on_warning(*_):
    global warnings, stop
    warnings += 1
    left = (deadline - time.time()) * 1000 if deadline is not None else -1
    print(f"warned {int((time.monotonic() - started) * 1000)} {int(left)}", flush=True)
    if not ignore:
        stop = True


def on_term(*_):
    print(f"term {warnings}", flush=True)
    os._exit(143)


signal.signal(signal.SIGUSR1, on_warning)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
step = 0
while not stop:
    step += 1
    time.sleep(0.01)
with open(checkpoint + ".tmp", "w") as f:
    f.write(f"{step}\n")
os.rename(checkpoint + ".tmp", checkpoint)
print("checkpointed", flush=True)
