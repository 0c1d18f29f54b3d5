"""Runs COMMAND as the foreground job of a terminal, as an interactive shell
does, so that the terminal's ^C and ^Z reach it and job control works.

stdin must be the slave side of a pseudo-terminal that is nobody's
controlling terminal. This process becomes the session leader with that
terminal as its controlling terminal (the "shell"), starts COMMAND in a
process group of its own, makes that group the terminal's foreground group
before COMMAND is exec'd, and reports on stderr:

    pty_job: job PID          (the job is in the foreground; PID = its pgid)
    pty_job: stopped SIG      (the job's leader was stopped, e.g. by ^Z)
    pty_job: exit N | signal N  (how the job's leader ended; then it exits)

The shell's own group stays in the session, so the job's process group is not
orphaned and ^Z really stops it (the kernel ignores terminal stop signals
sent to orphaned process groups).

usage: pty_job.py COMMAND [ARG]...
"""
import fcntl
import os
import signal
import sys
import termios


def say(text):
    os.write(2, f"pty_job: {text}\n".encode())


os.setsid()
fcntl.ioctl(0, termios.TIOCSCTTY, 0)
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(go_w)
    os.setpgid(0, 0)
    os.read(go_r, 1)  # until the shell made this group the foreground job
    os.close(go_r)
    # A fresh process, as an interactive shell starts a job: default
    # dispositions and nothing blocked (Python ignores PIPE and XFSZ, and a
    # background job inherits INT and QUIT ignored).
    for s in signal.Signals:
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
os.close(go_r)
try:
    os.setpgid(pid, pid)
except OSError:
    pass  # the child did it already
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
os.tcsetpgrp(0, pid)
say(f"job {pid}")
os.write(go_w, b"x")
os.close(go_w)
while True:
    _, status = os.waitpid(pid, os.WUNTRACED | os.WCONTINUED)
    if os.WIFSTOPPED(status):
        say(f"stopped {os.WSTOPSIG(status)}")
        continue
    if os.WIFCONTINUED(status):
        continue
    break
if os.WIFSIGNALED(status):
    say(f"signal {os.WTERMSIG(status)}")
else:
    say(f"exit {os.WEXITSTATUS(status)}")
