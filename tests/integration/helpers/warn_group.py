"""A job of several processes that treat the warning signal (USR1)
differently, for --warn-before's delivery.

    warn_group.py

Forks three children, all in the job's process group: "catcher" (a
handler), "ignorer" (SIG_IGN) and "blocker" (USR1 blocked, no handler); the
parent itself keeps USR1's default action. Each prints "ready ROLE PID";
the parent prints "ready" once all have. The catcher prints "usr1 catcher"
on each USR1. On TERM each child prints "term ROLE PENDING" (PENDING: 1
when a USR1 is pending, blocked) and exits; the parent waits for them and
exits 143."""
import os
import signal
import sys


def child(role):
    if role == "catcher":
        signal.signal(signal.SIGUSR1, lambda *_: print("usr1 catcher", flush=True))
    elif role == "ignorer":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def on_term(*_):
        pending = int(signal.SIGUSR1 in signal.sigpending())
        print(f"term {role} {pending}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    print(f"ready {role} {os.getpid()}", flush=True)
    while True:
        signal.pause()


signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the parent outlives its children's TERM lines
kids = []
for role in ("catcher", "ignorer", "blocker"):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.dup2(w, 1)
        sys.stdout = os.fdopen(1, "w")
        child(role)
    os.close(w)
    kids.append((pid, os.fdopen(r)))
for _, out in kids:
    print(out.readline().strip(), flush=True)
print("ready", flush=True)
for pid, out in kids:
    for line in out:
        print(line.strip(), flush=True)
    os.waitpid(pid, 0)
sys.exit(143)
