"""For helpers whose signal handlers must run as soon as a signal comes
while they wait for stdin's end (a module, not a command).

A signal that arrives just before a blocking read() runs its C handler
first, so the read is not interrupted, and the Python handler runs only once
the read returns. StdinEnd waits with select() on stdin and on a wakeup fd
(signal.set_wakeup_fd) instead, which a signal always makes readable.

    end = StdinEnd()     # after the handlers are set, before "ready"
    print("ready", flush=True)
    end.wait()
"""
import os
import select
import signal


class StdinEnd:
    def __init__(self):
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)

    def wait(self):
        while True:
            readable, _, _ = select.select([0, self.wake_r], [], [])
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
            if 0 in readable and not os.read(0, 4096):
                return
