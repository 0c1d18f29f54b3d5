"""Prints "ready", then the name of every signal it receives, one per line
(after dumb-init's testing/print_signals.py). Exits with status 0 when stdin
is closed, or dies of SIGTERM/SIGINT if --die is given after receiving one.

usage: print_signals.py [--die] [--ignore SIGNAME]...
"""
import os
import select
import signal
import sys

die = "--die" in sys.argv
ignored = {sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--ignore" and i + 1 < len(sys.argv)}

catchable = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD,
                                                      signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                                                      signal.SIGCONT, signal.SIGWINCH, signal.SIGURG)]


def signal_name(sig):
    """SIGUSR1, ..., SIGRTMIN, SIGRTMIN+3, SIGRTMAX (Python names only the
    ends of the real-time range)."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"


def handler(sig, frame):
    name = signal_name(sig)
    os.write(1, (name + "\n").encode())
    if die and sig in (signal.SIGTERM, signal.SIGINT) and name not in ignored:
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


for s in catchable:
    try:
        signal.signal(s, handler)
    except (OSError, ValueError):
        pass
for i in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
    try:
        signal.signal(i, handler)
    except (OSError, ValueError):
        pass

# Waits for stdin's end with select() on it and on a wakeup fd: a signal that
# arrives just before a blocking read() would run its Python handler only once
# that read returns (its C handler runs first, so the read is not
# interrupted); the wakeup fd makes the select() return instead.
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
print("ready", flush=True)
while True:
    readable, _, _ = select.select([0, wake_r], [], [])
    if wake_r in readable:
        os.read(wake_r, 4096)
    if 0 in readable and not os.read(0, 4096):
        break
