"""Starts a daemon-like background process that keeps every inherited file
descriptor (close_fds=False, new session, stdio on /dev/null), prints its pid
and exits at once, leaving the daemon behind. The daemon sleeps for SECONDS
(default 60) unless killed; the test kills it.

Popen returns only after the daemon's exec succeeded, so when this prints the
pid, the daemon already holds whatever descriptors it inherited.

usage: spawn_daemon.py [SECONDS]
"""
import subprocess
import sys

seconds = sys.argv[1] if len(sys.argv) > 1 else "60"
p = subprocess.Popen(["sleep", seconds], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=False, start_new_session=True)
print(p.pid, flush=True)
