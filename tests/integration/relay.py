#!/usr/bin/python3
"""A TCP relay between one looplock (a "host") and an etcd member, whose
faults are switched on demand, in the spirit of Shopify's toxiproxy.

    relay.py TARGET_HOST:TARGET_PORT

prints "ready PORT" once it listens on 127.0.0.1:PORT, then reads one
command per line on stdin and answers "ok MODE" on stdout when it is in
effect:

  pass        forward both ways (the default)
  slow MS     delay everything etcd sends by MS milliseconds (a slow answer)
  stall       stop forwarding (kept connections hang, new ones are accepted
              and hang: a frozen member); "pass" resumes with what was held
  blackhole   a partition: new connections are never accepted (their SYN is
              dropped: the listener's accept queue is kept full) and kept
              connections hang; leaving it resets them
  refuse      connections are refused (RST) and kept ones reset
  count       answers "ok count N": how many pieces of etcd's answers reached
              looplock since the mode was last set
  tally       answers "ok tally {JSON}": since the relay started, how many
              connections it accepted ("connections") and how many HTTP
              requests looplock sent, by path ("requests": {"/v3/...": N}),
              read from the request lines that pass through it
  quit        exit

One thread, selectors; stdin EOF also ends it, so it never outlives its test.
"""
import collections
import heapq
import json
import os
import re
import selectors
import socket
import struct
import sys
import time

CHUNK = 65536


def reset(sock):
    """Close with RST (SO_LINGER 0) instead of FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Relay:
    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sel = selectors.DefaultSelector()
        self.mode = "pass"
        self.delay = 0.0
        self.pairs = []  # [client, upstream]
        self.out = collections.defaultdict(bytearray)  # socket -> bytes waiting to be written
        self.timed = []  # (due, seq, socket, bytes): slowed data
        self.seq = 0
        self.fillers = []
        self.delivered = 0
        self.clients = set()
        self.accepted = 0
        self.requests = collections.Counter()
        self.request_tail = {}  # client socket -> the end of what it sent, for a request line cut in two
        self.listener = self.listen(port=0, backlog=64)
        self.port = self.listener.getsockname()[1]
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
        os.set_blocking(sys.stdin.fileno(), False)
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "control")
        self.control = b""

    def listen(self, port, backlog):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(backlog)
        s.setblocking(False)
        return s

    # -- modes -------------------------------------------------------------

    def close_listener(self):
        if self.listener is not None:
            if self.registered(self.listener):
                self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
        for f in self.fillers:
            f.close()
        self.fillers = []

    def set_mode(self, mode, arg=None):
        old = self.mode
        special = ("blackhole", "refuse")
        if old != mode and (old in special or mode in special):
            self.close_listener()
            if old == "blackhole" or mode == "refuse":
                self.drop_all(reset_them=True)  # a partition that heals: its connections are gone
            if mode == "blackhole":
                # A listener whose accept queue is full drops every SYN: connects hang.
                self.listener = self.listen(self.port, 0)
                for _ in range(2):
                    f = socket.socket()
                    f.setblocking(False)
                    f.connect_ex(("127.0.0.1", self.port))
                    self.fillers.append(f)
            elif mode != "refuse":
                self.listener = self.listen(self.port, 64)
                self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.mode = mode
        self.delay = float(arg) / 1000 if mode == "slow" else 0.0
        self.delivered = 0
        self.update_interest()

    def drop_all(self, reset_them):
        for pair in self.pairs:
            for s in pair:
                try:
                    self.sel.unregister(s)
                except (KeyError, ValueError):
                    pass
                self.out.pop(s, None)
                if reset_them:
                    reset(s)
                else:
                    s.close()
        self.pairs = []
        self.timed = []

    def forwarding(self):
        return self.mode in ("pass", "slow")

    def update_interest(self):
        for pair in self.pairs:
            for s in pair:
                events = 0
                if self.forwarding():
                    events |= selectors.EVENT_READ
                    if self.out.get(s):
                        events |= selectors.EVENT_WRITE
                try:
                    if events:
                        self.sel.modify(s, events, "data") if self.registered(s) else self.sel.register(s, events, "data")
                    elif self.registered(s):
                        self.sel.unregister(s)
                except (ValueError, OSError):
                    pass

    def registered(self, s):
        try:
            self.sel.get_key(s)
            return True
        except (KeyError, ValueError):
            return False

    # -- traffic -----------------------------------------------------------

    def peer(self, s):
        for a, b in self.pairs:
            if s is a:
                return b
            if s is b:
                return a
        return None

    def close_pair(self, s):
        for pair in self.pairs:
            if s in pair:
                self.pairs.remove(pair)
                for x in pair:
                    self.clients.discard(x)
                    if self.registered(x):
                        self.sel.unregister(x)
                    self.out.pop(x, None)
                    x.close()
                self.timed = [t for t in self.timed if t[2] not in pair]
                heapq.heapify(self.timed)
                return

    def accept(self):
        try:
            c, _ = self.listener.accept()
        except OSError:
            return
        c.setblocking(False)
        u = socket.socket()
        u.setblocking(False)
        u.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        u.connect_ex(self.target)
        self.pairs.append([c, u])
        self.clients.add(c)
        self.accepted += 1
        self.update_interest()

    def read(self, s):
        try:
            data = s.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_pair(s)
            return
        dest = self.peer(s)
        if dest is None:
            return
        upstream = any(s is b for _, b in self.pairs)
        if not upstream:
            self.tally_requests(s, data)
        if upstream and self.delay > 0:
            self.seq += 1
            heapq.heappush(self.timed, (time.monotonic() + self.delay, self.seq, dest, data))
        else:
            self.out[dest] += data
            self.update_interest()

    def tally_requests(self, s, data):
        """Counts the request lines ("POST /v3/kv/range HTTP/1.1") in what
        looplock sent."""
        tail = self.request_tail.get(s, b"")
        text = tail + data
        # A request line follows the previous request's body directly (no
        # line end); one that lies wholly in the tail was counted already.
        for m in re.finditer(rb"(GET|POST) (/[^ \r\n]*) HTTP/1\.[01]\r\n", text):
            if m.end() > len(tail):
                self.requests[m.group(2).decode(errors="replace")] += 1
        self.request_tail[s] = text[-64:]

    def write(self, s):
        buf = self.out.get(s)
        if not buf:
            self.update_interest()
            return
        try:
            n = s.send(buf)
        except BlockingIOError:
            return
        except OSError:
            self.close_pair(s)
            return
        del buf[:n]
        if n and s in self.clients:
            self.delivered += 1
        if not buf:
            self.update_interest()

    def command(self):
        try:
            chunk = os.read(sys.stdin.fileno(), 4096)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.control += chunk
        while b"\n" in self.control:
            line, self.control = self.control.split(b"\n", 1)
            words = line.decode().split()
            if not words:
                continue
            if words[0] == "quit":
                return False
            if words[0] == "count":
                print(f"ok count {self.delivered}", flush=True)
                continue
            if words[0] == "tally":
                print("ok tally " + json.dumps({"connections": self.accepted, "requests": self.requests}),
                      flush=True)
                continue
            if words[0] not in ("pass", "slow", "stall", "blackhole", "refuse"):
                print(f"error unknown command {words[0]}", flush=True)
                continue
            self.set_mode(words[0], words[1] if len(words) > 1 else None)
            print(f"ok {self.mode}", flush=True)
        return True

    def run(self):
        print(f"ready {self.port}", flush=True)
        while True:
            timeout = None
            if self.timed:
                timeout = max(0.0, self.timed[0][0] - time.monotonic())
            for key, events in self.sel.select(timeout):
                if key.data == "control":
                    if not self.command():
                        return
                elif key.data == "accept":
                    if self.mode != "blackhole":
                        self.accept()
                else:
                    s = key.fileobj
                    if events & selectors.EVENT_READ and self.forwarding():
                        self.read(s)
                    if events & selectors.EVENT_WRITE and self.registered(s):
                        self.write(s)
            now = time.monotonic()
            while self.timed and self.timed[0][0] <= now:
                _, _, dest, data = heapq.heappop(self.timed)
                if any(dest in p for p in self.pairs):
                    self.out[dest] += data
            self.update_interest()


if __name__ == "__main__":
    Relay(sys.argv[1]).run()
