"""Prints "ready", then the name of every signal it receives, one per line
(after dumb-init's testing/print_signals.py). Exits with status 0 when stdin
is closed, or dies of SIGTERM/SIGINT if --die is given after receiving one.

usage: print_signals.py [--die] [--ignore SIGNAME]...
"""
import os
import signal
import sys

# Also when run with runpy.run_path, which does not put this directory on
# sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stdin_end import StdinEnd  # noqa: E402

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

end = StdinEnd()
print("ready", flush=True)
end.wait()
