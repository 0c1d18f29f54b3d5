"""The processes a scenario needs beside the tools it measures: the `stamp`
command of the hand-off scenarios (a small C program compiled at bench
start), a holder of the lock for the deadline scenario, one etcd member on
loopback for the cluster scenarios, and a blackholed endpoint for failover."""
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from . import BenchError
from .launcher import SH, SLEEP

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"

STAMP_C = r"""
/* The wrapped command of the hand-off scenario: CLOCK_MONOTONIC at start,
 * an optional hold, CLOCK_MONOTONIC just before exit, one O_APPEND write. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long long now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
int main(int argc, char **argv) {
  long long t0 = now();
  if (argc < 3) return 2;
  int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return 3;
  long hold_us = atol(argv[2]);
  if (hold_us > 0) {
    struct timespec d = {hold_us / 1000000, (hold_us % 1000000) * 1000L};
    while (nanosleep(&d, &d) != 0) {}
  }
  char buf[96];
  long long t1 = now();
  int n = snprintf(buf, sizeof buf, "%lld %lld %d\n", t0, t1, (int)getpid());
  if (write(fd, buf, (size_t)n) != n) return 4;
  return 0;
}
"""


EMPTY_C = r"""
/* The physical limit of a wrapper: a static program that vforks, execs its
 * arguments, waits, and exits as the command did; nothing else. */
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  if (argc < 2) return 64;
  pid_t pid = vfork();
  if (pid == 0) {
    execve(argv[1], argv + 1, environ);
    _exit(127);
  }
  if (pid < 0) return 71;
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return 71;
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
"""


def build_c(work, name, source, static=False):
    """(path of the compiled program, None), or (None, why it could not be
    built)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no C compiler (cc) found"
    src = Path(work) / f"{name}.c"
    exe = Path(work) / name
    src.write_text(source)
    r = subprocess.run([cc, "-O2", *(["-static"] if static else []), "-o", str(exe), str(src)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, f"cc failed: {r.stderr.strip()[:300]}"
    return str(exe), None


def build_stamp(work):
    """(path of the compiled `stamp`, None), or (None, why it could not be built)."""
    return build_c(work, "stamp", STAMP_C)


def build_empty(work):
    """(path of the empty static vfork-and-exec wrapper, None), or (None,
    why it could not be built: no C compiler, or no static C library)."""
    return build_c(work, "empty", EMPTY_C, static=True)


def build_baseline(root, rev, work):
    """(looplock as built at commit `rev`, its label "REV (commit C)"), built
    from a git worktree of `root` in `work` with meson's defaults and no man
    pages, and run from where the linker wrote it, as the binary under test
    is (a copy of a binary starts faster than the file the linker wrote: on
    this machine 0.52 against 0.57 ms of CPU for the same bytes, perf stat);
    or (None, why it could not be built). remove_baseline(root, work) removes
    the worktree."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120)

    r = git("rev-parse", "--short=12", "--verify", f"{rev}^{{commit}}")
    if r.returncode != 0:
        return None, f"{rev} is no commit here: {r.stderr.strip()}"
    commit = r.stdout.strip()
    tree = Path(work) / "baseline-tree"
    r = git("worktree", "add", "--detach", str(tree), commit)
    if r.returncode != 0:
        return None, f"git worktree add failed: {r.stderr.strip()}"
    build = tree / "b"
    for options in (["-Dman=disabled"], []):  # an older tree may not have the option
        r = subprocess.run(["meson", "setup", str(build), *options], cwd=tree, capture_output=True, text=True,
                           timeout=600)
        if r.returncode == 0:
            break
        shutil.rmtree(build, ignore_errors=True)
    if r.returncode != 0:
        remove_baseline(root, work)
        return None, f"meson setup failed at {commit}: {r.stdout.strip()[-400:]}"
    r = subprocess.run(["ninja", "-C", str(build), "src/looplock"], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        remove_baseline(root, work)
        return None, f"ninja failed at {commit}: {r.stdout.strip()[-400:]}"
    return str(build / "src" / "looplock"), f"{rev} (commit {commit})" if rev != commit else commit


def remove_baseline(root, work):
    """Removes the worktree build_baseline() made in `work`, if any."""
    tree = Path(work) / "baseline-tree"
    if tree.exists():
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], capture_output=True,
                       timeout=120)


class Holder:
    """`flock DIR/.state.lock sh -c 'echo ready; exec sleep 1000'` in its own
    process group, so that ending it ends the sleep that shares its fd."""

    def __init__(self, T):
        self.p = subprocess.Popen([T.flock, T.lock, SH, "-c", f"echo ready; exec {SLEEP} 1000"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise BenchError("the holder (flock(1) + sleep) did not start")

    def stop(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(timeout=30)
        self.p.stdout.close()



class EtcdServer:
    """One etcd member on loopback. Its data is on tmpfs (/dev/shm) when there
    is one, so that the disk's fsync latency, the same for both clients,
    does not drown the difference between them."""

    def __init__(self, work):
        shm = "/dev/shm"
        self.data = tempfile.mkdtemp(prefix="looplock-bench-etcd-", dir=shm if os.access(shm, os.W_OK) else work)
        self.tmpfs = self.data.startswith(shm)
        def port():
            with socket.socket() as so:
                so.bind(("127.0.0.1", 0))
                return so.getsockname()[1]
        cport, pport = port(), port()
        self.url = f"http://127.0.0.1:{cport}"
        peer = f"http://127.0.0.1:{pport}"
        self.log = open(Path(work) / "etcd.log", "w")
        self.p = subprocess.Popen([ETCD, "--name", "bench", "--data-dir", self.data,
                                   "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", f"bench={peer}"],
                                  stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        return
            except OSError:
                pass
            if self.p.poll() is not None or time.monotonic() > end:
                self.stop()
                raise BenchError("etcd did not become healthy")
            time.sleep(0.05)

    def proposals(self):
        """Raft proposals committed so far: etcd's writes."""
        return self.counters()["writes"]

    def counters(self):
        """What etcd has done so far, from its /metrics: writes (raft
        proposals committed), requests (gRPC messages received, every
        method but the health check's: a unary call is one, each message of
        a stream one more; the HTTP gateway's calls are counted the same way),
        keepalives (LeaseKeepAlive messages) and events (watch events sent:
        each is a watcher woken)."""
        out = {"writes": None, "requests": None, "keepalives": 0.0, "events": None}
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("etcd_server_proposals_committed_total "):
                    out["writes"] = float(line.split()[1])
                elif line.startswith("etcd_debugging_mvcc_events_total "):
                    out["events"] = float(line.split()[1])
                elif line.startswith("grpc_server_msg_received_total{") and "grpc.health" not in line:
                    out["requests"] = (out["requests"] or 0.0) + float(line.split()[-1])
                    if 'grpc_method="LeaseKeepAlive"' in line:
                        out["keepalives"] += float(line.split()[-1])
        if out["writes"] is None or out["events"] is None or out["requests"] is None:
            raise BenchError("etcd's /metrics lacks etcd_server_proposals_committed_total, "
                             "etcd_debugging_mvcc_events_total or grpc_server_msg_received_total")
        return out

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


def cluster_skip_reason(looplock):
    """Why the cluster scenarios cannot run here, or None."""
    if not os.access(ETCD, os.X_OK) or not os.access(ETCDCTL, os.X_OK):
        return f"{ETCD} or {ETCDCTL} is missing (Debian packages etcd-server, etcd-client)"
    if not os.access(Path(looplock).parent / "looplock-etcd", os.X_OK):
        return "looplock-etcd was not built beside looplock (libcurl missing)"
    return None


class Blackhole:
    """A loopback endpoint that drops every SYN, as a partitioned or
    blackholed member does: a listener whose accept queue (backlog 0) is
    kept full by two connections that nobody accepts, so a connect to it
    hangs until the client gives up."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.fillers = []
        for _ in range(2):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            self.fillers.append(f)
        # The first filler's handshake completes: it fills the queue.
        if not select.select([], [self.fillers[0]], [], 5)[1]:
            self.close()
            raise BenchError("the blackholed endpoint's listener did not fill its queue")

    def close(self):
        for f in self.fillers:
            f.close()
        self.listener.close()
