"""A hold across steps with --etcd (looplock-sharing(7), HOLD ACROSS STEPS): the
holder takes the cluster lock too and renews its lease; another host waits
for it, a later step with the value runs inside it on both locks, and a
lost lease ends it with its row (--release then exits 76). Loop dirs stand
in for hosts on one cluster lock name; every process is stopped by its pid
and every wait is bounded. The local half is test_hold.py."""
import os
import signal
import subprocess
import time

import pytest

from conftest import LOOPLOCK as LOOPLOCK_BIN
from conftest import EX_TEMPFAIL, PY, TIMEOUT, incident_rows, lock_is_free, run, running, start, wait_until
from etcdtest import etcd, EX_LEASE_LOST, needs_etcd, start_member
from test_hold import holder_pid, value_of

pytestmark = needs_etcd

_names = iter(range(1_000_000))


@pytest.fixture
def held():
    """Hold pids to kill (by pid) after the test."""
    pids = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def hosts_of(tmp_path):
    out = []
    for h in ("a", "b"):
        (tmp_path / h).mkdir()
        out.append(tmp_path / h)
    return out


def test_a_hold_holds_the_cluster_lock_across_steps_and_hosts(etcd, held, tmp_path):
    a, b = hosts_of(tmp_path)
    history = tmp_path / "history"
    cluster = ["--etcd", etcd.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
    r = run([*cluster, "--hold", "--max-time", "2m", a])
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    held.append(holder_pid(value))
    assert value.count(":") == 5  # the cluster key is in the value
    write = lambda tag: [PY, "-c", f"open({str(history)!r}, 'a').write('{tag}\\n')"]
    # Another host waits for the hold and gives up.
    s = run([*cluster, "-w", "0.5", b, "--", *write("b")], env={"LOOPLOCK_HOLD": ""})
    assert s.returncode == EX_TEMPFAIL, s.stderr
    assert "operation hold" in s.stderr
    # A later step on the hold's host runs inside it, on both locks.
    s = run([*cluster, "-v", a, "--", *write("step")], env={"LOOPLOCK_HOLD": value})
    assert s.returncode == 0, s.stderr
    assert "already held by the hold" in s.stderr
    rel = run(["--release", value])
    assert (rel.returncode, rel.stderr) == (0, "")
    assert lock_is_free(a)
    # Let go of the cluster lock too: the other host takes it at once.
    s = run([*cluster, "-w", "5", b, "--", *write("b-after")], env={"LOOPLOCK_HOLD": ""})
    assert s.returncode == 0, s.stderr
    assert history.read_text() == "step\nb-after\n"


def test_a_step_on_another_host_with_the_value_still_waits(etcd, held, tmp_path):
    """The value names a's lock file: on b there is nothing to confirm."""
    a, b = hosts_of(tmp_path)
    cluster = ["--etcd", etcd.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
    value = value_of(run([*cluster, "--hold", "--max-time", "2m", a]).stdout)
    held.append(holder_pid(value))
    s = run([*cluster, "-w", "0.5", b, "--", "true"], env={"LOOPLOCK_HOLD": value})
    assert s.returncode == EX_TEMPFAIL, s.stderr
    assert run(["--release", value]).returncode == 0


def test_a_lost_lease_ends_the_hold_and_release_says_76(held, tmp_path):
    """etcd stops answering (SIGSTOP) for longer than the TTL: the holder
    ends its sentinel before the lease can expire, writes its lease_lost
    row and lets go; --release reads that row."""
    own = start_member()
    try:
        (tmp_path / "a").mkdir()
        r = run(["--etcd", own.url, "--ttl", "2", "--hold", "--max-time", "2m", tmp_path / "a"])
        assert r.returncode == 0, r.stderr
        value = value_of(r.stdout)
        pid = holder_pid(value)
        held.append(pid)
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not running(pid), "the hold to end on its lost lease", timeout=TIMEOUT)
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)
        row = incident_rows(tmp_path / "a")[-1]
        assert (row["error_code"], row["holder"]["pid"]) == ("lease_lost", pid)
        rel = run(["--release", value])
        assert rel.returncode == EX_LEASE_LOST, rel.stderr
        assert "its etcd lease was lost" in rel.stderr
    finally:
        own.remove()


def test_a_steps_command_gets_the_holds_cluster_facts_and_nests_on_both_locks(etcd, held, tmp_path):
    (tmp_path / "a").mkdir()
    a = tmp_path / "a"
    cluster = ["--etcd", etcd.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
    value = value_of(run([*cluster, "--hold", "--max-time", "2m", a]).stdout)
    held.append(holder_pid(value))
    key = value.split(":")[5]
    s = run([*cluster, a, "--", "sh", "-c",
             'echo "$LOOPLOCK_ETCD_KEY $LOOPLOCK_ETCD_LEASE $LOOPLOCK_FENCING_TOKEN"; exec "$0" "$@"',
             LOOPLOCK_BIN, *cluster, "-v", a, "--", "echo", "nested"], env={"LOOPLOCK_HOLD": value})
    assert s.returncode == 0, s.stderr
    etcd_key, lease, token = s.stdout.splitlines()[0].split()
    assert etcd_key == key  # the name has no byte to percent-encode
    assert lease and int(token) > 0
    assert s.stdout.splitlines()[1] == "nested"
    assert run(["--release", value]).returncode == 0


def test_tied_to_max_time_and_force_end_an_etcd_hold_and_free_the_cluster_lock(etcd, held, tmp_path):
    """Each end lets another host take the cluster lock at once."""
    a, b = hosts_of(tmp_path)
    cluster = ["--etcd", etcd.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]

    def other_host_gets_it():
        return run([*cluster, "-w", "5", b, "--", "true"], env={"LOOPLOCK_HOLD": ""}).returncode == 0

    # --tied-to: the tied process is KILLed.
    tie = subprocess.Popen(["sleep", "300"])
    try:
        value = value_of(run([*cluster, "--hold", "--max-time", "2m", "--tied-to", tie.pid, a]).stdout)
        held.append(holder_pid(value))
        tie.kill()
        tie.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(holder_pid(value)), "the tied hold to end")
    finally:
        if tie.poll() is None:
            tie.kill()
            tie.wait(timeout=TIMEOUT)
    assert other_host_gets_it()
    assert run(["--release", value]).returncode == 1
    # --max-time.
    value = value_of(run([*cluster, "--hold", "--max-time", "1s", a]).stdout)
    held.append(holder_pid(value))
    wait_until(lambda: not running(holder_pid(value)), "--max-time to end the hold", timeout=TIMEOUT)
    assert other_host_gets_it()
    assert run(["--release", value]).returncode == 124
    # --release --force, without the value.
    value = value_of(run([*cluster, "--hold", "--max-time", "2m", a]).stdout)
    held.append(holder_pid(value))
    r = run(["--release", "--force", a], env={"LOOPLOCK_HOLD": ""})
    assert r.returncode == 0, r.stderr
    assert not running(holder_pid(value))
    assert other_host_gets_it()


# -- a step never runs without the hold's cluster lease ---------------------------

STEP_JOB = """
import signal, sys, time
history, seconds = sys.argv[1], float(sys.argv[2])
def note(tag):
    with open(history, "a") as f:
        f.write(f"{tag} {time.time()}\\n")
def term(*_):
    note("step-end")
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
note("step-start")
print("ready", flush=True)
time.sleep(seconds)
note("step-end")
"""


def notes(history):
    out = {}
    for line in history.read_text().splitlines():
        tag, at = line.split()
        out.setdefault(tag, float(at))
    return out


class TwoHosts:
    """A hold on host a (etcd at `url`, `hold_args` such as --ttl and
    --max-time), a step inside it whose job notes its start and end in
    `history` and runs `step_seconds`, and, once the step runs, a run on
    host b that waits for the cluster lock and notes when it starts."""

    def __init__(self, url, tmp_path, held, hold_args, step_seconds):
        a, b = hosts_of(tmp_path)
        self.history = tmp_path / "history"
        cluster = ["--etcd", url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
        self.cluster, self.a = cluster, a
        r = run([*cluster, *hold_args, "--hold", a])
        assert r.returncode == 0, r.stderr
        self.value = value_of(r.stdout)
        self.holder = holder_pid(self.value)
        held.append(self.holder)
        self.step = start([*cluster, a, "--", PY, "-c", STEP_JOB, str(self.history), str(step_seconds)],
                          env={"LOOPLOCK_HOLD": self.value})
        assert self.step.stdout.readline() == "ready\n", self.step.stderr.read()
        self.other = start([*cluster, "-w", "120", b, "--", PY, "-c",
                            f"import time; open({str(self.history)!r}, 'a').write(f'b-start {{time.time()}}\\n')"],
                           env={"LOOPLOCK_HOLD": ""}, stdin=subprocess.DEVNULL)

    def other_started_after_the_step_ended(self):
        assert self.other.wait(timeout=TIMEOUT) == 0, self.other.stderr.read()
        got = notes(self.history)
        assert got["step-end"] < got["b-start"], got


def test_a_step_renews_the_holds_lease_and_a_lost_lease_ends_its_job_before_another_host_runs(held, tmp_path):
    """etcd stops answering (SIGSTOP) for longer than the hold's TTL while a
    step runs: the step ends its job before the lease can expire (76,
    lease_lost), as any holder does, and the other host runs only after
    that job has ended. Before, the step's job ran on while the other host
    held the cluster lock."""
    own = start_member()
    try:
        t = TwoHosts(own.url, tmp_path, held, ["--ttl", "2", "--max-time", "2m"], 60)
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            assert t.step.wait(timeout=TIMEOUT) == EX_LEASE_LOST, t.step.stderr.read()
            # The hold's holder loses the lease too (the 5 s outage).
            wait_until(lambda: not running(t.holder), "the hold to end on its lost lease", timeout=TIMEOUT)
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)
        assert "lease_lost" in t.step.stderr.read()
        t.other_started_after_the_step_ended()
    finally:
        own.remove()


@pytest.mark.parametrize("how", ["max_time", "release"])
def test_a_hold_that_ends_while_a_step_runs_never_lets_another_host_in_before_the_step_ends(etcd, held, tmp_path,
                                                                                             how):
    """--max-time 3 s ends the hold while a step runs: the step's job is
    ended at the hold's end as by its own --max-time (124); --release while
    a step runs answers at once and says that steps still hold the lock,
    which they keep (exit 0). Either way the other host's run starts only
    after the step's job has ended."""
    t = TwoHosts(etcd.url, tmp_path, held, ["--max-time", "3" if how == "max_time" else "2m"],
                 8 if how == "max_time" else 4)
    if how == "release":
        rel = run(["--release", t.value])
        assert rel.returncode == 0, rel.stderr
        assert "steps that run inside it (pid " in rel.stderr, rel.stderr
        assert ") still hold the lock until they end" in rel.stderr, rel.stderr
        # The hold's looplock is gone, its key stays: --inspect says why (a
        # hold's steps renew its lease), not that it goes within the TTL.
        wait_until(lambda: not os.path.exists(f"/proc/{t.holder}"), "the hold's looplock to end")
        seen = run([*t.cluster, "--inspect", t.a])
        if t.step.poll() is None:
            assert "operation hold, since " in seen.stdout and ", a --hold); its looplock has ended" in seen.stdout, seen.stdout
            assert ("its looplock has ended (this host), but it took a --hold: its key stays while any step of the hold "
                    "runs (each renews its lease)") in seen.stdout, seen.stdout
        assert t.step.wait(timeout=TIMEOUT) == 0, t.step.stderr.read()
    else:
        assert t.step.wait(timeout=TIMEOUT) == 124, t.step.stderr.read()
        assert "max_time_exceeded" in t.step.stderr.read()
    t.other_started_after_the_step_ended()


def test_a_step_inside_an_etcd_hold_without_etcd_is_refused_and_never_runs(etcd, held, tmp_path):
    """Only a step's own renewals keep the hold's lease alive while it runs:
    a step without --etcd could outlive the lease, so it is refused (64)
    and its command does not run; one of another --lock-name is told the
    right fix."""
    a, _ = hosts_of(tmp_path)
    cluster = ["--etcd", etcd.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
    value = value_of(run([*cluster, "--hold", "--max-time", "2m", a]).stdout)
    held.append(holder_pid(value))
    ran = tmp_path / "ran"
    s = run([a, "--", "touch", ran], env={"LOOPLOCK_HOLD": value, "LOOPLOCK_ETCD": ""})
    assert s.returncode == 64, s.stderr
    assert "holds a cluster lock on etcd" in s.stderr and "was given no --etcd" in s.stderr, s.stderr
    assert "--lock-name the hold was taken with" in s.stderr
    s = run(["--etcd", etcd.url, a, "--", "touch", ran], env={"LOOPLOCK_HOLD": value})
    assert s.returncode == 64, s.stderr
    assert "of another cluster lock" in s.stderr and "Give the step the --lock-name the hold was taken with" in s.stderr
    assert not ran.exists()
    assert run(["--release", value]).returncode == 0


def test_a_holder_whose_renewals_fail_still_leaves_the_lease_to_its_steps(held, tmp_path):
    """The holder alone is stopped (SIGSTOP) for longer than the TTL while a
    step runs and renews the lease: the holder, resumed, counts its lease
    lost and lets go, but never revokes the lease the step keeps alive, so
    the other host starts only after the step's command has ended."""
    own = start_member()
    try:
        t = TwoHosts(own.url, tmp_path, held, ["--ttl", "3", "--max-time", "2m"], 8)
        os.kill(t.holder, signal.SIGSTOP)
        try:
            time.sleep(5)  # the fault: longer than the TTL, so the holder's own renewals fail
        finally:
            os.kill(t.holder, signal.SIGCONT)
        assert t.step.wait(timeout=TIMEOUT) == 0, t.step.stderr.read()
        t.other_started_after_the_step_ended()
    finally:
        own.remove()


def test_a_step_with_etcd_inside_a_hold_taken_without_it_is_told_so(etcd, held, tmp_path):
    a, _ = hosts_of(tmp_path)
    value = value_of(run(["--hold", "--max-time", "2m", a]).stdout)
    held.append(holder_pid(value))
    s = run(["--etcd", etcd.url, a, "--", "true"], env={"LOOPLOCK_HOLD": value})
    assert s.returncode == 64, s.stderr
    assert "holds no cluster lock (it was taken without --etcd)" in s.stderr, s.stderr
    assert run(["--release", value]).returncode == 0


def test_a_step_inside_a_hold_whose_lease_expired_is_told_so_and_exits_76(held, tmp_path):
    """The holder stopped (SIGSTOP) past its TTL, no step running: its lease
    expires. A step then is told that the hold no longer holds the cluster
    lock (76, lease_lost), and never runs. Before, it was told to give
    --etcd to the outer looplock, which had it (64)."""
    own = start_member()
    try:
        a, _ = hosts_of(tmp_path)
        cluster = ["--etcd", own.url, "--lock-name", f"hold{os.getpid()}-{next(_names)}"]
        r = run([*cluster, "--ttl", "2", "--hold", "--max-time", "2m", a])
        assert r.returncode == 0, r.stderr
        value = value_of(r.stdout)
        pid = holder_pid(value)
        held.append(pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: "held by" not in run([*cluster, "--inspect", a], env={"LOOPLOCK_HOLD": ""}).stdout,
                       "the hold's lease to expire", timeout=TIMEOUT)
            ran = tmp_path / "ran"
            s = run([*cluster, a, "--", "touch", ran], env={"LOOPLOCK_HOLD": value})
            assert s.returncode == EX_LEASE_LOST, s.stderr
            assert f"the hold this step runs inside (looplock pid {pid}) no longer holds cluster lock" in s.stderr, s.stderr
            assert "Give --etcd" not in s.stderr
            assert not ran.exists()
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until(lambda: not running(pid), "the hold to end on its lost lease", timeout=TIMEOUT)
    finally:
        own.remove()
