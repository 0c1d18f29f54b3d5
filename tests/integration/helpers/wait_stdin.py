"""Prints "ready", then waits until stdin is closed; exits with argv[1] (default 0).

Used as the command of a lock holder: the test releases the lock by closing
the holder's stdin.
"""
import sys

print("ready", flush=True)
sys.stdin.read()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
