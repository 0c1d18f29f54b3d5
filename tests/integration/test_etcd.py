"""The cluster lock (--etcd) against a real etcd on loopback: several loop
dirs standing in for several hosts, serialised by one lock name; deadlines,
single_flight, lease loss (revoked, etcd frozen), unreachable endpoints,
fencing tokens, and a small multi-host simulation with a fenced counter.

looplock itself is static and has no HTTP client: it execs looplock-etcd (the
same program with libcurl, built beside it) for these runs; the hand-over is
tested here too."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, EX_USAGE, LOOPLOCK, PY, TIMEOUT, expect_line, expect_stderr, helper, incident_rows,
                      run, start, wait_until)
from etcdtest import etcd, EX_LEASE_LOST, EX_UNAVAILABLE, HELPER, Relay, needs_etcd

pytestmark = needs_etcd


@pytest.fixture
def hosts(tmp_path):
    """Three loop dirs: three 'hosts' that share one cluster lock name."""
    dirs = []
    for i in range(3):
        d = tmp_path / f"host{i}"
        d.mkdir()
        dirs.append(d)
    return dirs


_names = iter(range(1_000_000))


@pytest.fixture
def name(request):
    return f"t{os.getpid()}-{next(_names)}"


def cluster(etcd, name, *extra):
    return ["--etcd", etcd.url, "--lock-name", name, *extra]


class ClusterHolder:
    """looplock holding the cluster lock (and its dir's local lock) with a
    command that prints ready and waits for its stdin to close."""

    def __init__(self, etcd, name, loop_dir, *extra):
        self.proc = start([*cluster(etcd, name, *extra), "-p", "blocking", loop_dir, "--", PY, helper("wait_stdin.py")])
        expect_line(self.proc, "ready")

    def release(self):
        self.proc.stdin.close()
        return self.proc.wait(timeout=TIMEOUT)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT)


@pytest.fixture
def cluster_holders():
    made = []

    def make(*a):
        h = ClusterHolder(*a)
        made.append(h)
        return h

    yield make
    for h in made:
        h.kill()


def test_same_name_from_different_dirs_serialises_and_status_passes_through(etcd, name, hosts, cluster_holders):
    a = cluster_holders(etcd, name, hosts[0])
    b = start(["-v", *cluster(etcd, name), "-w", "20", hosts[1], "--", "sh", "-c", "echo ran; exit 7"])
    try:
        # B names A (another loop dir, the same cluster lock) as the holder and waits.
        line = b.stderr.readline()
        assert "waiting for cluster lock" in line and f"pid {a.proc.pid}" in line, line
        assert b.poll() is None
        assert a.release() == 0
        out, err = b.communicate(timeout=TIMEOUT)
    finally:
        if b.poll() is None:
            b.kill()
    assert b.returncode == 7, err
    assert out == "ran\n"
    # Without the cluster lock the two dirs would not exclude each other.
    r = run([hosts[1], "--", "true"])
    assert r.returncode == 0


def test_deadline_and_single_flight_while_another_host_holds(etcd, name, hosts, cluster_holders):
    a = cluster_holders(etcd, name, hosts[0])
    t0 = time.monotonic()
    r = run([*cluster(etcd, name), "-w", "0.5", hosts[1], "--", "echo", "must not run"])
    elapsed = time.monotonic() - t0
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert r.stdout == ""
    assert 0.4 <= elapsed < 3, elapsed
    assert "lock_acquire_timeout" in r.stderr and f"pid {a.proc.pid}" in r.stderr
    rows = incident_rows(hosts[1])
    assert len(rows) == 1
    assert rows[0]["error_code"] == "lock_acquire_timeout"
    assert rows[0]["deadline_ms"] == 500
    assert rows[0]["cluster"]["lock_name"] == name
    assert rows[0]["cluster"]["holder"]["pid"] == a.proc.pid
    # The holder is on this host, and the hints name the endpoints in use
    # (they said "held on another host" and "--etcd ENDPOINTS").
    action = rows[0]["operator_action"]
    assert action.startswith(f"inspect pid {a.proc.pid} ") and "held by another looplock on this host" in action, action
    assert "another host" not in action and "ENDPOINTS" not in action + r.stderr, action + r.stderr
    assert f"looplock --inspect --etcd {etcd.url} --lock-name {name} {hosts[1]}" in r.stderr, r.stderr

    assert run([*cluster(etcd, name), "-w", "0", "-E", "9", hosts[1], "--", "true"]).returncode == 9

    r = run([*cluster(etcd, name), "-p", "single_flight", hosts[2], "--", "echo", "must not run"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "noop-locked" in r.stderr and f"pid {a.proc.pid}" in r.stderr
    r = run([*cluster(etcd, name), "-p", "single_flight", "--skip-exit-code", "5", hosts[2], "--", "true"])
    assert r.returncode == 5
    assert incident_rows(hosts[2]) == []  # a skip writes no row

    assert a.release() == 0
    # Free again: single_flight runs.
    r = run([*cluster(etcd, name), "-p", "single_flight", hosts[2], "--", "echo", "ran"])
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr


# TERM is blocked and waited for (a handler could miss one that came just
# before a blocking call).
LEASED = r"""
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
with open(sys.argv[1], "w") as f:
    f.write(os.environ["LOOPLOCK_ETCD_LEASE"])
print("ready", flush=True)
if signal.sigtimedwait([signal.SIGTERM], 60) is not None:
    print("term", flush=True)
"""


def test_revoked_lease_terminates_the_command_and_exits_76(etcd, name, hosts):
    lease_file = hosts[0] / "lease"
    p = start([*cluster(etcd, name), hosts[0], "--", PY, "-c", LEASED, lease_file])
    try:
        expect_line(p, "ready")
        lease = lease_file.read_text()
        r = etcd.ctl("lease", "revoke", lease)
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        out, err = p.communicate(timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    # The command exited 0 after TERM, but the lock was lost: 76, not 0.
    assert p.returncode == EX_LEASE_LOST, err
    assert out == "term\n"
    assert "looplock: lease_lost:" in err
    # Noticed at the holder's next keepalive: every third of the TTL (3.3 s at
    # the default 10 s; the man page's table), with slack for a busy machine.
    assert elapsed < 3.34 + 2.5
    rows = incident_rows(hosts[0])
    assert [row["error_code"] for row in rows] == ["lease_lost"]
    assert rows[0]["cluster"]["lease"] == lease
    # Both locks are free afterwards.
    assert run([*cluster(etcd, name), "-w", "2", hosts[1], "--", "true"]).returncode == 0


def test_frozen_etcd_is_detected_within_ttl(etcd, name, hosts):
    p = start([*cluster(etcd, name, "--ttl", "2", "--kill-after", "1"), hosts[0], "--", PY, "-c", LEASED,
               hosts[0] / "lease"])
    stopped = False
    try:
        expect_line(p, "ready")
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        stopped = True
        t0 = time.monotonic()
        out, err = p.communicate(timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        if stopped:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
    assert p.returncode == EX_LEASE_LOST, err
    assert out == "term\n"
    assert "lease_lost" in err and "TTL" in err
    # Lost no later than the TTL (2 s) after the last answered keepalive,
    # plus the revoke attempt's bound (1 s) and slack.
    assert elapsed < 6, elapsed
    assert incident_rows(hosts[0])[-1]["error_code"] == "lease_lost"


def test_unreachable_endpoint_fails_on_time_with_69(hosts):
    t0 = time.monotonic()
    r = run(["--etcd", "http://127.0.0.1:1", "-w", "0.5", hosts[0], "--", "echo", "must not run"])
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    # Its -w, not mutation's default 5 s (the ASan build under CPU hogs takes
    # some 1.5 s to start both binaries and give up).
    assert time.monotonic() - t0 < 4
    assert r.stdout == ""
    assert "etcd unavailable" in r.stderr
    # The next endpoint is tried when the first refuses.


def test_https_to_a_plain_http_port_says_to_use_http(etcd, name, hosts):
    tls = etcd.url.replace("http://", "https://")
    r = run(["--etcd", tls, "--lock-name", name, "-w", "1", hosts[0], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (EX_UNAVAILABLE, ""), r.stderr
    assert "the endpoint speaks plain HTTP" in r.stderr, r.stderr
    assert f"Use {etcd.url} for this endpoint" in r.stderr, r.stderr
    assert "Check --etcd-cacert" not in r.stderr  # not a certificate problem
    r = subprocess.run([LOOPLOCK, "--inspect", "--etcd", tls, hosts[0]], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == EX_UNAVAILABLE and "speaks plain HTTP" in r.stdout + r.stderr, r.stdout + r.stderr


def test_endpoints_are_tried_in_order(etcd, name, hosts):
    r = run(["--etcd", f"http://127.0.0.1:1,{etcd.url}", "--lock-name", name, hosts[0], "--", "echo", "ok"])
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr


def test_fencing_tokens_increase_across_holders(etcd, name, hosts):
    tokens = []
    for i in range(4):
        r = run([*cluster(etcd, name), hosts[i % 3], "--", "sh", "-c", 'echo "$LOOPLOCK_FENCING_TOKEN $LOOPLOCK_ETCD_KEY"'])
        assert r.returncode == 0, r.stderr
        token, key = r.stdout.split()
        assert key.startswith(f"looplock/{name}/lock/")
        tokens.append(int(token))
    assert tokens == sorted(set(tokens)), tokens


def test_cluster_options_usage_errors(etcd, hosts):
    for extra in (["-s"], ["-F"], ["--ttl", "1"], ["--etcd", "etcd.invalid:2379"]):
        r = run(["--etcd", etcd.url, *extra, hosts[0], "--", "true"])
        assert r.returncode == EX_USAGE, (extra, r.stderr)
    assert run(["--lock-name", "x", hosts[0], "--", "true"]).returncode == EX_USAGE
    assert "shared cluster locks are not supported" in run(["--etcd", etcd.url, "-s", hosts[0], "--", "true"]).stderr


# A tick on a shared resource that refuses a holder whose fencing token is
# lower than the last one it saw, and detects overlap with a marker.
FENCED = r"""
import json, os, sys, time
shared = sys.argv[1]
state, marker = os.path.join(shared, "state.json"), os.path.join(shared, "occupied")
token = int(os.environ.get("LOOPLOCK_FENCING_TOKEN", "0"))
try:
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    owned = True
except FileExistsError:
    owned = False
try:
    try:
        with open(state) as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {"count": 0, "token": 0}
    if token < data["token"]:
        sys.exit(4)  # a stale holder: refused
    time.sleep(0.02)
    data["count"] += 1
    data["token"] = token
    tmp = state + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, state)
finally:
    if owned:
        os.unlink(marker)
sys.exit(0 if owned else 3)
"""


def simulate(hosts, shared, prefix, iterations=5, per_host=3):
    script = shared / "fenced.py"
    script.write_text(FENCED)
    loop = (f"for i in $(seq {iterations}); do {' '.join(prefix)} \"$1\" -- {PY} {script} {shared} || echo \"fail $?\"; "
            "done")
    procs = [subprocess.Popen(["sh", "-c", loop, "sh", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for d in hosts for _ in range(per_host)]
    failures = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        failures += [line for line in out.splitlines() if line.startswith("fail")]
    data = json.loads((shared / "state.json").read_text())
    return data["count"], failures


def test_multi_host_simulation_loses_no_update(etcd, name, hosts, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    count, failures = simulate(hosts, shared, [LOOPLOCK, "--etcd", etcd.url, "--lock-name", name, "-w", "60", "-q"])
    assert failures == []
    assert count == 3 * 3 * 5

    # Control: each "host" with only its own local lock loses updates.
    control = tmp_path / "control"
    control.mkdir()
    count, failures = simulate(hosts, control, [LOOPLOCK, "-w", "60", "-q"])
    assert count < 45 or failures, (count, failures)


def test_inspect_names_the_cluster_holder(etcd, name, hosts, cluster_holders):
    r = subprocess.run([LOOPLOCK, "--inspect", "--json", *cluster(etcd, name), hosts[1]], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cluster"]["held"] is False
    a = cluster_holders(etcd, name, hosts[0])
    r = subprocess.run([LOOPLOCK, "--inspect", "--json", *cluster(etcd, name), hosts[1]], capture_output=True, text=True,
                       timeout=TIMEOUT)
    c = json.loads(r.stdout)["cluster"]
    assert c["held"] is True and c["holder"]["pid"] == a.proc.pid
    assert c["holder"]["fencing_token"] > 0
    w = start(["-v", *cluster(etcd, name), "-p", "blocking", hosts[2], "--", "true"])
    try:
        expect_stderr(w, "waiting for cluster lock")
        r = subprocess.run([LOOPLOCK, "--inspect", *cluster(etcd, name), hosts[1]], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert f"cluster   held by host {socket.gethostname()} pid {a.proc.pid}" in r.stdout
        assert f"cluster   waiting 1: host {socket.gethostname()} pid {w.pid} " in r.stdout
        r = subprocess.run([LOOPLOCK, "--inspect", "--json", *cluster(etcd, name), hosts[1]], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert [x["pid"] for x in json.loads(r.stdout)["cluster"]["waiting"]] == [w.pid]
        a.release()
        assert w.wait(timeout=TIMEOUT) == 0
    finally:
        if w.poll() is None:
            w.kill()
        w.wait(timeout=TIMEOUT)
    r = subprocess.run([LOOPLOCK, "--inspect", "--etcd", "http://127.0.0.1:1", hosts[1]], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == EX_UNAVAILABLE


TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def test_inspect_shows_the_fencing_token_and_every_waiter_in_queue_order(etcd, name, hosts, cluster_holders, tmp_path):
    a = cluster_holders(etcd, name, hosts[0], "--agent", "cron", "--operation", "tick")
    host = socket.gethostname()
    waiters = []
    try:
        for i, d in enumerate((hosts[1], hosts[2])):
            w = start(["-v", *cluster(etcd, name), "--agent", f"ci{i}", "--operation", f"deploy{i}", "-p", "blocking", d,
                       "--", "true"])
            waiters.append(w)
            expect_stderr(w, "waiting for cluster lock")  # queued: the next one queues behind it
        r = subprocess.run([LOOPLOCK, "--inspect", "--json", *cluster(etcd, name), tmp_path], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        c = json.loads(r.stdout)["cluster"]
        token = c["holder"]["fencing_token"]
        assert c["held"] is True and c["contenders"] == 3
        assert c["holder"]["pid"] == a.proc.pid and token > 0 and re.fullmatch(TS, c["holder"]["acquired_at"])
        assert [w["pid"] for w in c["waiting"]] == [w.pid for w in waiters]
        for i, w in enumerate(c["waiting"]):
            # A waiter's time is when it queued, not an acquisition.
            assert "acquired_at" not in w and re.fullmatch(TS, w["queued_at"]), w
            assert (w["host"], w["agent_id"], w["operation"]) == (host, f"ci{i}", f"deploy{i}")
        assert c["waiting"][0]["queued_at"] <= c["waiting"][1]["queued_at"]
        r = subprocess.run([LOOPLOCK, "--inspect", *cluster(etcd, name), tmp_path], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr
        lines = [line for line in r.stdout.splitlines() if line.startswith("cluster")]
        assert len(lines) == 3, r.stdout
        assert re.fullmatch(rf"cluster   held by host {re.escape(host)} pid {a.proc.pid} \(agent cron, operation tick, "
                            rf"since {TS}\), fencing token {token} \(lock name {name}\)", lines[0]), lines[0]
        for i, (line, w) in enumerate(zip(lines[1:], waiters)):
            assert re.fullmatch(rf"cluster   waiting {i + 1}: host {re.escape(host)} pid {w.pid} \(agent ci{i}, "
                                rf"operation deploy{i}, queued {TS}\)", line), line
        a.release()
        for w in waiters:
            assert w.wait(timeout=TIMEOUT) == 0, w.stderr.read()
    finally:
        for w in waiters:
            if w.poll() is None:
                w.kill()
            w.wait(timeout=TIMEOUT)
    # A holder without waiters says so.
    a = cluster_holders(etcd, name, hosts[0])
    r = subprocess.run([LOOPLOCK, "--inspect", *cluster(etcd, name), tmp_path], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert [line for line in r.stdout.splitlines() if line.startswith("cluster")][1] == "cluster   waiting none"


def test_a_run_and_inspect_name_the_root_directorys_cluster_lock_alike(etcd, hosts, cluster_holders):
    """DIR=/ is cluster lock "/" for a run and for --inspect (one rule)."""
    r = subprocess.run([LOOPLOCK, "--inspect", "--json", "--etcd", etcd.url, "/"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cluster"]["lock_name"] == "/"
    # What a run on / takes (a run there would create /.state.lock: --lock-name / elsewhere stands in for it).
    a = cluster_holders(etcd, "/", hosts[0])
    r = subprocess.run([LOOPLOCK, "--inspect", "--json", "--etcd", etcd.url, "/"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    c = json.loads(r.stdout)["cluster"]
    assert c["held"] is True and c["holder"]["pid"] == a.proc.pid
    assert c["holder"]["key"].startswith("looplock/%2F/lock/")
    a.release()


def test_inspect_reads_a_holder_of_the_old_layout(etcd, name, hosts):
    """An earlier looplock (etcd's lock service) left the lock key's value
    empty and wrote its holder beside the prefix: --inspect still names it."""
    lease = etcd.post("/v3/lease/grant", {"TTL": 30})["ID"]
    b64 = lambda t: __import__("base64").b64encode(t.encode()).decode()
    etcd.post("/v3/kv/put", {"key": b64(f"looplock/{name}/lock/{int(lease):x}"), "value": "", "lease": lease})
    old = {"host": "oldhost", "pid": 4242, "agent_id": "cron", "operation": "tick.py", "acquired_at": "T", "lease": "x",
           "fencing_token": 3}
    etcd.post("/v3/kv/put", {"key": b64(f"looplock/{name}/holder"), "value": b64(json.dumps(old)), "lease": lease})
    try:
        r = subprocess.run([LOOPLOCK, "--inspect", *cluster(etcd, name), hosts[0]], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert "cluster   held by host oldhost pid 4242" in r.stdout, r.stdout
        r = run([*cluster(etcd, name), "-p", "single_flight", hosts[0], "--", "echo", "must not run"])
        assert r.returncode == 0 and "oldhost pid 4242" in r.stderr, r.stderr
    finally:
        etcd.post("/v3/lease/revoke", {"ID": lease})


def test_etcdctl_lock_and_looplock_exclude_each_other(etcd, name, hosts, tmp_path):
    """The same keys as etcd's own concurrency.Mutex (etcdctl lock)."""
    done = tmp_path / "done"  # etcdctl gives its command no stdin: it holds until this file exists
    ctl = subprocess.Popen(["/usr/bin/etcdctl", "--endpoints", etcd.url, "lock", f"looplock/{name}/lock", "--", "sh", "-c",
                            f"echo ready; while [ ! -e {done} ]; do sleep 0.02; done"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, ETCDCTL_API="3"))
    try:
        expect_line(ctl, "ready")
        r = run([*cluster(etcd, name), "-p", "single_flight", hosts[0], "--", "echo", "must not run"])
        assert r.returncode == 0, r.stderr
        assert "noop-locked" in r.stderr and "etcdctl lock" in r.stderr
        w = start([*cluster(etcd, name), "-w", "20", hosts[1], "--", "echo", "ran"])
        done.touch()
        assert ctl.wait(timeout=TIMEOUT) == 0
        out, err = w.communicate(timeout=TIMEOUT)
        assert (w.returncode, out) == (0, "ran\n"), err
    finally:
        done.touch()  # ends etcdctl's command even when etcdctl itself is killed
        if ctl.poll() is None:
            ctl.kill()
        ctl.wait(timeout=TIMEOUT)


# -- the hand-over from the static looplock to looplock-etcd -----------------


def ldd(path):
    r = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=TIMEOUT)
    return r.stdout + r.stderr


def test_only_the_helper_loads_libcurl():
    assert "libcurl" not in ldd(LOOPLOCK)
    assert "libcurl" in ldd(HELPER)


REPORT = ("import os\n"
          "fds = os.listdir('/proc/self/fd')\n"  # one of them was listdir's own, closed by now
          "targets = [os.readlink('/proc/self/fd/' + f) for f in fds if os.path.exists('/proc/self/fd/' + f)]\n"
          "print(os.environ['LOOPLOCK_HOLDER_PID'], os.getppid(), 'LOOPLOCK_START_NS' in os.environ)\n"
          "print(sorted(t for t in targets if t.startswith('socket:')))\n")


def test_the_helper_runs_as_looplock_itself_and_leaks_no_socket(etcd, name, hosts):
    p = start([*cluster(etcd, name), hosts[0], "--", PY, "-c", REPORT],
              env={"LOOPLOCK_START_NS": "1"}, stdin=subprocess.DEVNULL)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err
    ids, sockets = out.splitlines()
    holder, parent, start_ns_seen = ids.split()
    # The same process (exec, not a child): nesting and records name it.
    assert int(holder) == int(parent) == p.pid
    assert start_ns_seen == "False"
    # libcurl's connections and its internal socketpair stay in looplock.
    assert sockets == "[]"


def test_a_missing_helper_is_reported_with_69(tmp_path, hosts):
    installed = Path(os.environ.get("LOOPLOCK_HELPER_DIR", "/usr/local/libexec/looplock")) / "looplock-etcd"
    if installed.exists():
        pytest.skip(f"the installed {installed} would be found")
    alone = tmp_path / "bin" / "looplock"
    alone.parent.mkdir()
    shutil.copy(LOOPLOCK, alone)
    r = subprocess.run([str(alone), "--etcd", "http://127.0.0.1:1", hosts[0], "--", "echo", "must not run"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert r.stdout == ""
    assert "needs looplock-etcd, which is not installed" in r.stderr
    assert str(alone.parent / "looplock-etcd") in r.stderr
    cause, hint = r.stderr.splitlines()
    assert hint.startswith("looplock: Install the looplock-etcd package"), hint  # what to install
    # Without the cluster lock the same copy works on its own.
    r = subprocess.run([str(alone), hosts[0], "--", "echo", "ok"], capture_output=True, text=True, timeout=TIMEOUT)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr


def test_the_deadline_counts_from_looplocks_start(etcd, name, hosts, cluster_holders):
    """looplock hands its start time to looplock-etcd: a helper told that
    looplock started 3.5 s ago gives up 3.5 s early, 0.5 s into its run (and
    the control, without it, waits the whole deadline, 4 s). The bound
    between them leaves a busy machine 2.5 s for the helper's own start, its
    first attempt and its clean-up (the ASan build under CPU hogs needs
    some 2 s for them)."""
    cluster_holders(etcd, name, hosts[0])
    args = [HELPER, *cluster(etcd, name), "-w", "4", str(hosts[1]), "--", "echo", "must not run"]

    def waited(extra_env):
        t0 = time.monotonic()
        r = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, **extra_env))
        assert r.returncode == EX_TEMPFAIL, r.stderr
        return time.monotonic() - t0

    told = waited({"LOOPLOCK_START_NS": str(time.monotonic_ns() - 3_500_000_000)})
    assert told < 3.0, told
    control = waited({})
    assert control >= 3.95, control


@pytest.fixture
def slow_dns():
    so = os.environ.get("SLOW_GAI_SO", "")
    if not so or not os.path.exists(so):
        pytest.skip("the slow_getaddrinfo shim was not built ($SLOW_GAI_SO)")
    return {"LD_PRELOAD": so, "SLOW_GETADDRINFO_MS": "5000"}


def test_a_hanging_name_lookup_does_not_outlast_the_deadline(hosts, slow_dns):
    t0 = time.monotonic()
    r = run(["--etcd", "http://etcd.slow.test:2379", "-w", "0.3", hosts[0], "--", "echo", "must not run"],
            env=slow_dns)
    elapsed = time.monotonic() - t0
    assert r.returncode == EX_UNAVAILABLE, r.stderr
    assert r.stdout == ""
    assert "etcd unavailable" in r.stderr
    assert elapsed < 4, elapsed  # the lookup alone takes 5 s


def test_a_hanging_name_lookup_fails_over_to_the_next_endpoint(etcd, name, hosts, slow_dns):
    t0 = time.monotonic()
    r = run(["--etcd", f"http://etcd.slow.test:2379,{etcd.url}", "--lock-name", name, hosts[0], "--", "echo", "ok"],
            env=slow_dns)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    assert time.monotonic() - t0 < 4.5  # one connect timeout (1 s), not the 5 s lookup


def wait_until_in_request(pid):
    """Until looplock is inside a libcurl request: its main thread then has
    every signal blocked (SigBlk in /proc/PID/status), TERM included."""
    def term_blocked():
        with open(f"/proc/{pid}/status") as f:
            blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
        return bool(blocked & (1 << (signal.SIGTERM - 1)))

    wait_until(term_blocked, f"pid {pid} to enter an etcd request", TIMEOUT)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_a_cluster_wait_promptly(etcd, name, hosts, cluster_holders, sig):
    a = cluster_holders(etcd, name, hosts[0])
    w = start([*cluster(etcd, name), "-v", "-p", "blocking", hosts[1], "--", "echo", "must not run"])
    expect_stderr(w, "waiting for cluster lock")
    wait_until_in_request(w.pid)
    t0 = time.monotonic()
    w.send_signal(sig)
    out, _ = w.communicate(timeout=TIMEOUT)
    assert w.returncode == -sig
    assert time.monotonic() - t0 < 2.5  # libcurl checks about once a second
    assert out == ""
    assert a.proc.poll() is None  # the holder is untouched
    assert a.release() == 0


# -- what a run costs etcd: connections and renewals --------------------------


@pytest.fixture
def relay(etcd):
    r = Relay(etcd.url)
    yield r
    r.stop()


def test_a_waiter_keeps_one_connection_for_its_whole_wait(etcd, name, hosts, cluster_holders, relay):
    """A waiter behind a holder for several renewal rounds (--ttl 6: a round
    every 2 s, attempts of 600 ms, room for a busy machine) talks to etcd
    over one connection; the news that ends its wait ends that connection,
    and the run goes on over a second one. Before, each round of the watch
    closed its connection (the previous version: 18 for 4.5 s at --ttl 3)."""
    a = cluster_holders(etcd, name, hosts[0])
    b = start(["-v", "--etcd", relay.url, "--lock-name", name, "--ttl", "6", "-p", "blocking", hosts[1], "--", "sh",
               "-c", "echo ran"])
    try:
        line = b.stderr.readline()
        assert "waiting for cluster lock" in line, line
        time.sleep(6.5)  # three rounds or more
        waited = relay.tally()
        assert b.poll() is None
        assert a.release() == 0
        out, err = b.communicate(timeout=TIMEOUT)
    finally:
        if b.poll() is None:
            b.kill()
    assert (b.returncode, out) == (0, "ran\n"), err
    done = relay.tally()
    assert waited["connections"] == 1, waited
    assert done["connections"] == 2, done
    reqs = waited["requests"]
    # Each round: a keepalive and the same watch again (no reading of the
    # queue), every third of the TTL.
    assert 3 <= reqs["/v3/watch"] <= 6, reqs
    assert 2 <= reqs.get("/v3/lease/keepalive", 0) <= 5, reqs
    assert "/v3/kv/range" not in reqs, reqs


def test_a_holder_renews_as_the_lease_table_says(etcd, name, hosts, relay):
    """Holding for 5 s: at --ttl 10 one keepalive (every 3.33 s), at --ttl 3
    about twenty (every 250 ms), over one connection."""
    for ttl, least, most in ((10, 1, 2), (3, 14, 22)):
        before = relay.tally()
        r = run(["--etcd", relay.url, "--lock-name", f"{name}-{ttl}", "--ttl", str(ttl), hosts[0], "--", "sleep", "5"])
        assert r.returncode == 0, r.stderr
        after = relay.tally()
        keepalives = after["requests"].get("/v3/lease/keepalive", 0) - before["requests"].get("/v3/lease/keepalive", 0)
        assert least <= keepalives <= most, (ttl, keepalives)
        assert after["connections"] - before["connections"] == 1


# --- nested runs with --etcd ------------------------------------------------------

SHOW_TOKEN = "echo ran token=${LOOPLOCK_FENCING_TOKEN:-none}"


def test_a_nested_etcd_run_inside_a_local_only_one_never_runs_without_the_cluster_lock(etcd, name, hosts,
                                                                                       cluster_holders):
    """Another host holds cluster lock NAME. A looplock nested in one that
    holds only the local lock of its DIR must not run its command as if it
    held NAME too; nor take NAME now, inside the local lock (the locks'
    order reversed: it could wait forever for a run holding NAME and waiting
    for that local lock). It refuses (64) and says what to do."""
    cluster_holders(etcd, name, hosts[1])
    inner = f"{LOOPLOCK} --log-format json {' '.join(cluster(etcd, name))} -w 1 {hosts[0]} -- sh -c '{SHOW_TOKEN}'"
    r = run([hosts[0], "-c", inner])
    assert r.returncode == 64, (r.stdout, r.stderr)
    assert "ran" not in r.stdout
    (line,) = [json.loads(x) for x in r.stderr.splitlines() if '"nested_cluster_lock"' in x]
    assert f"but not cluster lock {name}" in line["message"], line
    assert "Give --etcd (and --lock-name" in line["hint"], line
    # A forged LOOPLOCK_ETCD_KEY does not stand in for the cluster lock either.
    forged = f"looplock/{name}/lock/1234"
    r = run([hosts[0], "-c", f"LOOPLOCK_ETCD_KEY={forged} {inner}"])
    assert r.returncode == 64 and "ran" not in r.stdout and "not through " + forged in r.stderr, r.stderr


def test_a_nested_etcd_run_inside_one_holding_that_cluster_lock_runs_inside_both(etcd, name, hosts):
    inner = f"{LOOPLOCK} {' '.join(cluster(etcd, name))} -w 1 {hosts[0]} -- sh -c '{SHOW_TOKEN}'"
    r = run([*cluster(etcd, name), hosts[0], "-c", f"echo outer=$LOOPLOCK_FENCING_TOKEN; {inner}"])
    assert r.returncode == 0, r.stderr
    outer, ran = r.stdout.splitlines()
    assert ran == "ran token=" + outer.split("=")[1] and outer != "outer=", r.stdout
    # Inside one that holds another cluster lock: refused, as above.
    other = name + "-other"
    inner = f"{LOOPLOCK} {' '.join(cluster(etcd, other))} -w 1 {hosts[0]} -- sh -c '{SHOW_TOKEN}'"
    r = run([*cluster(etcd, name), hosts[0], "-c", inner])
    assert r.returncode == 64 and "ran" not in r.stdout and f"but not cluster lock {other}" in r.stderr, r.stderr


def test_a_timeout_behind_a_dead_holder_of_this_host_says_it_is_dead(etcd, name, hosts):
    """A holder killed with KILL cannot revoke its lease: its key holds the
    cluster lock until the lease expires. The timeout and skip lines say
    that its looplock is dead, as --inspect does, rather than name it as a
    live holder."""
    a = start([*cluster(etcd, name, "--ttl", "5"), hosts[0], "--", PY, helper("wait_stdin.py")])
    expect_line(a, "ready")
    a.kill()
    a.wait(timeout=TIMEOUT)
    r = run([*cluster(etcd, name), "-w", "0.5", hosts[1], "--", "true"])
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert f"pid {a.pid} " in r.stderr and "its looplock is dead (this host): its key goes when its lease expires, " \
                                          "within 5s" in r.stderr, r.stderr
    r = run([*cluster(etcd, name), "-p", "single_flight", hosts[1], "--", "true"])
    assert r.returncode == 0 and "noop-locked" in r.stderr and "its looplock is dead" in r.stderr, r.stderr
