"""Like print_signals.py, but counts signals exactly: prints "ready", then one
line per signal it receives, and exits 0 when stdin is closed.

print_signals.py uses Python signal handlers, and CPython runs a handler
once for any number of deliveries of the same signal that arrive before the
interpreter gets to it, so a signal sent twice in quick succession prints
one line. Here the signals stay blocked and a loop takes them with
sigwaitinfo(2), one per delivery: queued real-time signals are each reported,
and a standard signal is reported again whenever it arrives after the previous
one was taken.

With --origin each line also says where the signal came from:
"SIGINT kernel" (e.g. a terminal's ^C) or "SIGINT user PID" (kill(2) by PID).
With --job-control it also takes the job-control and ignored-by-default
signals (TSTP, TTIN, TTOU, CONT, WINCH, URG), which it otherwise leaves
alone: blocked, a TSTP does not stop it and is reported instead.

usage: sigwait_print.py [--origin] [--job-control]
"""
import os
import signal
import sys
import threading

origin = "--origin" in sys.argv[1:]

never = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}
if "--job-control" not in sys.argv[1:]:
    never |= {signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCONT, signal.SIGWINCH, signal.SIGURG}
waited = {s for s in signal.Signals if s not in never} | set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
# Block before any thread exists, so that every thread has them blocked.
signal.pthread_sigmask(signal.SIG_BLOCK, waited)


def name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"


def watch_stdin():
    while os.read(0, 4096):
        pass
    os._exit(0)


threading.Thread(target=watch_stdin, daemon=True).start()
os.write(1, b"ready\n")
while True:
    info = signal.sigwaitinfo(waited)
    line = name(info.si_signo)
    if origin:
        line += " kernel" if info.si_code == 0x80 else f" user {info.si_pid}"  # 0x80: SI_KERNEL
    os.write(1, (line + "\n").encode())
