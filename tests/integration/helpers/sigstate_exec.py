"""Execs a program with a chosen inherited signal state, to check that
looplock does not depend on what it inherits.

usage: sigstate_exec.py [--block SIG]... [--ignore SIG]... -- PROGRAM [ARG]...

SIG is a name without the SIG prefix (ALRM, CHLD, ...). --block adds it to
the signal mask (kept across exec); --ignore sets it to SIG_IGN (also kept
across exec).
"""
import os
import signal
import sys

args = sys.argv[1:]
block, ignore = set(), []
while args and args[0] != "--":
    opt, name = args[0], args[1]
    sig = signal.Signals["SIG" + name]
    if opt == "--block":
        block.add(sig)
    elif opt == "--ignore":
        ignore.append(sig)
    else:
        sys.exit(f"sigstate_exec.py: unknown option {opt}")
    args = args[2:]
argv = args[1:]
# Python itself ignores SIGPIPE and SIGXFSZ; give the program the defaults
# before applying what was asked for.
for sig in (signal.SIGPIPE, signal.SIGXFSZ):
    signal.signal(sig, signal.SIG_DFL)
for sig in ignore:
    signal.signal(sig, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, block)
os.execvp(argv[0], argv)
