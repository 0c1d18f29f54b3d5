"""A command that tells when the warning and the TERM reached it.

    warn_times.py [DELAY]

Catches USR1 and TERM. Prints "ready", then "usr1 MS" for each USR1 and
"term MS" for the TERM (MS: CLOCK_MONOTONIC in milliseconds, comparable
with the test's time.monotonic()), and exits 143 on the TERM. With DELAY,
it sleeps DELAY seconds after "ready" and only then installs its handlers,
printing "handlers MS" (a handler installed late)."""
import os
import signal
import sys
import time


def now_ms():
    return int(time.monotonic() * 1000)


def on_usr1(*_):
    print(f"usr1 {now_ms()}", flush=True)


def on_term(*_):
    print(f"term {now_ms()}", flush=True)
    os._exit(143)


print("ready", flush=True)
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, on_term)
if len(sys.argv) > 1:
    print(f"handlers {now_ms()}", flush=True)
while True:
    signal.pause()
