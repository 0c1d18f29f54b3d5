"""What the cluster-lock tests share: real etcd members on loopback (one, a
3-member cluster, TLS with certificates made by openssl at test time), the
relay that puts faults between one looplock and etcd (relay.py), and a
Jepsen-style history of what each "host" ran, with the checker that finds
overlaps afterwards.

Every process is started here and stopped by its pid; every wait is bounded."""
import fcntl
import json
import os
import random
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import HELPERS, LOOPLOCK, PY, ROOT, TIMEOUT

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"
RELAY = str(Path(__file__).resolve().parent / "relay.py")
EX_UNAVAILABLE = 69
EX_LEASE_LOST = 76

# Where meson built looplock-etcd ('' when libcurl was not found).
HELPER = os.environ.get("LOOPLOCK_ETCD_HELPER", str(Path(LOOPLOCK).parent / "looplock-etcd"))
# The ASan+UBSan build: slower, so fewer trials.
SANITIZED = os.environ.get("LOOPLOCK_SANITIZED") == "1"

needs_etcd = [
    pytest.mark.skipif(not os.access(ETCD, os.X_OK), reason=f"{ETCD} is missing (Debian package etcd-server)"),
    pytest.mark.skipif(not HELPER or not os.access(HELPER, os.X_OK),
                       reason="looplock-etcd was not built (libcurl missing: install libcurl4-openssl-dev)"),
]


# Ports claimed by this test process: an flock(2)ed file per port in
# PORT_CLAIMS, held open until the process exits (the lock then goes with it).
PORT_CLAIMS = Path(tempfile.gettempdir()) / "looplock-test-ports"
_claimed = []


def ephemeral_low():
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A loopback port for an etcd member that no other test process can be
    using or be given while this one runs (the integration tests run in
    parallel, and a member's port stays its own across a kill and restart):
    below the kernel's ephemeral range, so no bind(port 0) anywhere gets it,
    claimed with an flock(2)ed file per port, and free when claimed."""
    PORT_CLAIMS.mkdir(mode=0o1777, exist_ok=True)
    high = ephemeral_low()
    for _ in range(500):
        port = random.randrange(max(1024, high - 12000), high)
        fd = os.open(PORT_CLAIMS / str(port), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:  # claimed by another test process, or in use
            os.close(fd)
            continue
        _claimed.append(fd)
        return port
    raise AssertionError(f"no free loopback port below {high}")


def bounded_wait(pred, what, timeout=TIMEOUT, step=0.02):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


# -- the cluster lock of an earlier version -----------------------------------

# The last commit whose cluster lock keys were NAME unencoded: there
# "--lock-name x/lock/y" lay under "x"'s prefix (the two names collided).
LEGACY_COMMIT = "ae0975f"


def legacy_helper():
    """looplock-etcd as it was at LEGACY_COMMIT: built once from `git archive`
    (that program alone, no tests or man page, unoptimized) into
    $LOOPLOCK_LEGACY_BUILD/LEGACY_COMMIT, by default beside the build tree
    (scripts/test gives every stage the same directory, so a CI run builds it
    once). Skips when the source tree has no git history (a tarball)."""
    base = os.environ.get("LOOPLOCK_LEGACY_BUILD") or str(Path(LOOPLOCK).resolve().parents[2] / "build-legacy")
    cache = Path(base) / LEGACY_COMMIT
    exe = cache / "build" / "src" / "looplock-etcd"
    done = cache / "built"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        # Another test process building it holds this; its steps are bounded below.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and os.access(exe, os.X_OK):
            return str(exe)
        git = shutil.which("git")
        if not git or not (ROOT / ".git").exists():
            pytest.skip(f"no git history in {ROOT}: the looplock of {LEGACY_COMMIT} cannot be built")
        r = subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{LEGACY_COMMIT}^{{commit}}"],
                           capture_output=True, timeout=TIMEOUT)
        if r.returncode != 0:
            pytest.skip(f"commit {LEGACY_COMMIT} is not in this clone (shallow?): its looplock cannot be built")
        src, build = cache / "src", cache / "build"
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(build, ignore_errors=True)
        src.mkdir()
        archive = subprocess.run([git, "-C", str(ROOT), "archive", LEGACY_COMMIT], capture_output=True,
                                 timeout=120, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, capture_output=True, timeout=120,
                       check=True)
        for cmd, limit in ((["meson", "setup", str(build), str(src), "-Dtests=false", "-Dman=disabled",
                             "-Detcd=enabled", "-Dbuildtype=plain", "-Doptimization=0", "-Ddebug=false",
                             "-Dstatic_link=false"], 300),
                           (["ninja", "-C", str(build), "src/looplock-etcd"], 1200)):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0 and f"commit: {LEGACY_COMMIT}" in r.stdout, r.stdout + r.stderr
        done.write_text(r.stdout)
    return str(exe)


# -- certificates ------------------------------------------------------------


class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all
    made by openssl in `d`; `other_ca()` is a second CA that signed nothing."""

    def __init__(self, d):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.ca, self.ca_key = self.make_ca("looplock-test-ca")
        self.server, self.server_key = self.sign("etcd-test", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                                 "extendedKeyUsage=serverAuth,clientAuth\n")
        self.client, self.client_key = self.sign("loop-client", "extendedKeyUsage=clientAuth\n")
        # etcd 3.4's gateway refuses client certificates with a CommonName
        # once authentication is enabled: this one has only a subjectAltName.
        self.client_nocn, self.client_nocn_key = self.sign(
            "loop-client-nocn", "subjectAltName=DNS:loop-client\nextendedKeyUsage=clientAuth\n", "/O=looplock-test")

    def openssl(self, *args):
        r = subprocess.run([OPENSSL, *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=self.d)
        assert r.returncode == 0, r.stderr

    def key(self, name):
        path = self.d / f"{name}-key.pem"
        self.openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(path))
        return path

    def make_ca(self, name):
        key = self.key(name)
        cert = self.d / f"{name}.pem"
        self.openssl("req", "-x509", "-new", "-key", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}")
        return cert, key

    def sign(self, name, ext, subject=None):
        key = self.key(name)
        csr = self.d / f"{name}.csr"
        cert = self.d / f"{name}.pem"
        extfile = self.d / f"{name}.ext"
        extfile.write_text(ext)
        self.openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject or f"/CN={name}")
        self.openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                     "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extfile))
        return cert, key

    def other_ca(self):
        return self.make_ca("someone-else-ca")[0]


# -- etcd ----------------------------------------------------------------------


class Member:
    """One etcd member; `cluster` is the --initial-cluster string when it is
    one of several."""

    def __init__(self, name="default", data=None, client_port=None, peer_port=None, cluster=None, certs=None,
                 extra=()):
        self.name = name
        self.extra = list(extra)
        self.data = data or tempfile.mkdtemp(prefix="looplock-etcd-")
        self.own_data = data is None
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.certs = certs
        scheme = "https" if certs else "http"
        self.url = f"{scheme}://127.0.0.1:{self.client_port}"
        self.peer = f"http://127.0.0.1:{self.peer_port}"
        self.cluster = cluster or f"{name}={self.peer}"
        self.proc = None
        self.log = None

    def command(self):
        args = [ETCD, "--name", self.name, "--data-dir", os.path.join(self.data, self.name),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", self.peer, "--initial-advertise-peer-urls", self.peer,
                "--initial-cluster", self.cluster, "--initial-cluster-token", "looplock-test", *self.extra]
        if self.certs:
            args += ["--cert-file", str(self.certs.server), "--key-file", str(self.certs.server_key),
                     "--trusted-ca-file", str(self.certs.ca), "--client-cert-auth"]
        return args

    def start(self):
        self.log = open(os.path.join(self.data, f"{self.name}.log"), "a")
        self.proc = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def ssl_context(self):
        if not self.certs:
            return None
        ctx = ssl.create_default_context(cafile=str(self.certs.ca))
        ctx.load_cert_chain(str(self.certs.client), str(self.certs.client_key))
        return ctx

    def post(self, path, body, timeout=1.0):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context()) as r:
            return json.load(r)

    def healthy(self):
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1, context=self.ssl_context()) as r:
                return json.load(r).get("health") == "true"
        except (OSError, ValueError):
            return False

    def status(self):
        """(this member's id, the leader's id), or None when it does not answer."""
        try:
            s = self.post("/v3/maintenance/status", {}, timeout=0.5)
            return s["header"]["member_id"], s.get("leader")
        except (OSError, ValueError, KeyError):
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=TIMEOUT)
        if self.log:
            self.log.close()
            self.log = None

    def remove(self):
        self.stop()
        if self.own_data:
            shutil.rmtree(self.data, ignore_errors=True)

    def ctl(self, *args, user=None):
        env = dict(os.environ, ETCDCTL_API="3")
        if user:
            args = ("--user", user, *args)
        tls = []
        if self.certs:
            tls = ["--cacert", str(self.certs.ca), "--cert", str(self.certs.client), "--key",
                   str(self.certs.client_key)]
        return subprocess.run([ETCDCTL, "--endpoints", self.url, *tls, *args], capture_output=True, text=True,
                              timeout=TIMEOUT, env=env)


@pytest.fixture(scope="module")
def etcd():
    """One etcd member for a test module (import it from here: `from etcdtest
    import etcd`); removed after the module's last test."""
    m = start_member()
    yield m
    m.remove()


def start_member(**kw):
    m = Member(**kw)
    m.start()
    try:
        bounded_wait(lambda: m.healthy() or m.proc.poll() is not None, "etcd to become healthy", 20)
    except AssertionError:
        m.remove()
        raise
    if m.proc.poll() is not None:
        m.remove()
        pytest.fail(f"etcd exited with {m.proc.returncode}; see {m.data}")
    return m


class Cluster:
    """Three etcd members. Their election timeout is 500 ms (heartbeat 50
    ms), so that an election after the leader's death takes 0.5 to 1.5 s,
    the 1.0-1.6 s the issue measured. With etcd's defaults (1 s, 100 ms)
    elections take 1 to 2.2 s here, and now and then 2.8 s (with CheckQuorum
    a follower ignores a vote request while its leader seemed alive less
    than an election timeout ago, so a candidate may wait a second timeout):
    more than TTL - kill-after - margin at --ttl 3, which no client can ride
    out and still stop its command before the lease may expire."""

    TIMING = ("--heartbeat-interval", "50", "--election-timeout", "500")

    def __init__(self, n=3):
        self.data = tempfile.mkdtemp(prefix="looplock-etcd3-")
        ports = [(free_port(), free_port()) for _ in range(n)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        self.members = [Member(f"m{i}", self.data, c, p, initial, extra=self.TIMING) for i, (c, p) in enumerate(ports)]
        for m in self.members:
            m.start()
        try:
            bounded_wait(lambda: all(m.healthy() for m in self.members), "the 3 members to become healthy", 30)
        except AssertionError:
            self.remove()
            raise

    @property
    def endpoints(self):
        return ",".join(m.url for m in self.members)

    def leader(self):
        """The member that leads, once the living members agree on one."""
        def agreed():
            seen = [m.status() for m in self.members if m.alive()]
            if not seen or any(s is None for s in seen):
                return None
            leaders = {s[1] for s in seen}
            if len(leaders) != 1:
                return None
            for m, s in zip([m for m in self.members if m.alive()], seen):
                if s[0] == s[1]:
                    return m
            return None
        return bounded_wait(agreed, "the members to agree on a leader", 20)

    def restart(self, m):
        m.stop()
        m.start()
        bounded_wait(lambda: all(x.healthy() for x in self.members), "the restarted member to rejoin", 30)

    def remove(self):
        for m in self.members:
            m.stop()
        shutil.rmtree(self.data, ignore_errors=True)


# -- the relay -----------------------------------------------------------------


class Relay:
    """relay.py in front of `target_url` (an http:// etcd member): looplock
    talks to `self.url`; `set(mode)` switches its faults."""

    def __init__(self, target_url):
        target = target_url.split("://", 1)[1]
        self.proc = subprocess.Popen([PY, RELAY, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)
        line = self.read_line()
        assert line.startswith("ready "), line
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def read_line(self, timeout=TIMEOUT):
        if not self.sel.select(timeout):
            self.stop()
            raise AssertionError("the relay did not answer")
        return self.proc.stdout.readline()

    def set(self, *mode):
        self.proc.stdin.write(" ".join(str(m) for m in mode) + "\n")
        self.proc.stdin.flush()
        line = self.read_line()
        assert line.startswith(f"ok {mode[0]}"), line

    def count(self):
        """How many pieces of etcd's answers reached looplock since the mode was set."""
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        return int(self.read_line().split()[2])

    def tally(self):
        """Since the relay started: connections accepted, and looplock's HTTP
        requests by path ({"connections": N, "requests": {"/v3/...": N}})."""
        self.proc.stdin.write("tally\n")
        self.proc.stdin.flush()
        line = self.read_line()
        assert line.startswith("ok tally "), line
        return json.loads(line[len("ok tally "):])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


# -- histories -----------------------------------------------------------------


HOLD = str(HELPERS / "history_hold.py")


class History:
    """What every host's command did. Each command (helpers/history_hold.py)
    writes "start TOKEN STAMP" into a FIFO of its own when it starts and
    "end STAMP" when it exits by itself (stamps: CLOCK_MONOTONIC ns, the same
    clock for every process here). A command that is killed writes nothing:
    its end is when its FIFO closed, as a thread here sees it (never before
    the process died). Overlaps are computed afterwards."""

    def __init__(self, d):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.records = []
        self.lock = threading.Lock()
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.count = 0
        self.loops = 0  # the reader's rounds so far (drained())
        self.done = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def command(self, host, mode="obey"):
        """The command line for one run of `host` (mode: obey or ignore TERM)."""
        self.count += 1
        fifo = self.d / f"h{self.count}.fifo"
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        # A write end of our own until the command has started, so that the
        # FIFO reads EOF only once the command's end is closed (it died).
        placeholder = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        rec = {"host": host, "token": None, "start": None, "end": None, "how": None, "buf": b"",
               "placeholder": placeholder}
        with self.lock:
            self.records.append(rec)
        self.sel.register(fd, selectors.EVENT_READ, rec)
        os.write(self.wake_w, b"x")
        return [PY, HOLD, str(fifo), mode]

    def run(self):
        while not self.done:
            for key, _ in self.sel.select(0.5):
                if key.data is None:
                    os.read(self.wake_r, 64)
                    continue
                rec = key.data
                data = os.read(key.fd, 4096)
                now = time.monotonic_ns()
                if data:
                    rec["buf"] += data
                    while b"\n" in rec["buf"]:
                        line, rec["buf"] = rec["buf"].split(b"\n", 1)
                        words = line.decode().split()
                        with self.lock:
                            if words[0] == "start":
                                rec["token"], rec["start"] = int(words[1]), int(words[2])
                                os.close(rec.pop("placeholder"))
                            elif words[0] == "end":
                                rec["end"], rec["how"] = int(words[1]), "exited"
                else:  # EOF: the command's write end is closed: it ended
                    with self.lock:
                        if rec["end"] is None:
                            rec["end"], rec["how"] = now, "killed"
                    self.sel.unregister(key.fd)
                    os.close(key.fd)
            with self.lock:
                self.loops += 1

    def drained(self, timeout=TIMEOUT):
        """Returns once the reader has read what the FIFOs held when called:
        three of its rounds begun after it (a round reads every FIFO that has
        data, and a line and the EOF after it may take two), so that a
        command that exited before is seen to have started."""
        with self.lock:
            target = self.loops + 3
        for _ in range(3):
            os.write(self.wake_w, b"x")  # no round waits for select's timeout
        bounded_wait(lambda: self.loops >= target, "the history's reader", timeout)

    def wait_ended(self, timeout=TIMEOUT):
        """Every command that has started has ended; call it once every
        command's looplock has exited (what they wrote before is read
        first: drained())."""
        self.drained(timeout)
        bounded_wait(lambda: all(r["end"] is not None for r in self.started()), "every command's end", timeout)

    def started(self):
        with self.lock:
            return [{k: v for k, v in r.items() if k not in ("buf", "placeholder")}
                    for r in self.records if r["start"] is not None]

    def close(self):
        self.done = True
        os.write(self.wake_w, b"x")
        self.thread.join(timeout=5)
        for r in self.records:
            if "placeholder" in r:
                os.close(r.pop("placeholder"))


def overlaps(records):
    """Pairs of runs of different hosts whose [start, end] intervals meet:
    two holders at once. A run that never ended counts as still running."""
    out = []
    runs = sorted(records, key=lambda r: r["start"])
    for i, a in enumerate(runs):
        a_end = a["end"] if a["end"] is not None else float("inf")
        for b in runs[i + 1:]:
            if b["start"] >= a_end:
                break
            if b["host"] != a["host"]:
                out.append((a, b))
    return out


def cluster_args(endpoints, name, *extra):
    return ["--etcd", endpoints, "--lock-name", name, *extra]


def start_looplock(args, env=None):
    full = dict(os.environ)
    if env:
        full.update(env)
    return subprocess.Popen([LOOPLOCK, *[str(a) for a in args]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full)


def finish(p, timeout=TIMEOUT):
    """Waits for a looplock that ends by itself (its stdin left open) and
    returns its stderr."""
    p.wait(timeout=timeout)
    return p.stderr.read()


def release(p, timeout=TIMEOUT):
    """Ends the command of a looplock holding the lock (history_hold.py: its
    stdin closes) and returns (status, stderr)."""
    p.stdin.close()
    return p.wait(timeout=timeout), p.stderr.read()


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            pass


_names = iter(range(1_000_000))


def fresh_name():
    return f"t{os.getpid()}-{next(_names)}"
