"""Deadlines with --etcd when etcd stops answering. --warn-before, the outage it exists
for (looplock-jobs(7), --warn-before; looplock-cluster(7)): the warning comes
--warn-before before the TERM it warns of, whatever etcd does. At --ttl 10 the lease's
TERM is due 8.03 s after the last answered keepalive; a renewal that gets
no answer must not hold the job loop past the warning (5.03 s) or past
--max-time's own warning.

Three members, one fault each, applied at once: SIGSTOP (a frozen member),
SIGKILL (a dead one), and a blackhole (a relay that drops every packet both
ways). Against each, two runs: without --max-time (the lease's TERM, exit
76) and with --max-time 7s (its TERM comes first, exit 124). The command
records when USR1 and TERM reached it; the assertions are on those times,
with 300 ms of tolerance."""
import os
import signal
import time

import pytest

from conftest import PY, TIMEOUT, expect_line, expect_stderr, helper, incident_rows, read_until
from etcdtest import EX_LEASE_LOST, Relay, fresh_name, kill_all, needs_etcd, start_looplock, start_member

pytestmark = needs_etcd

WARN_TIMES = helper("warn_times.py")
EX_MAX_TIME = 124
TOLERANCE_S = 0.3


@pytest.fixture
def members():
    made = []

    def make():
        m = start_member()
        made.append(m)
        return m

    yield make
    for m in made:
        m.remove()


def times(out):
    """{"usr1": [ms...], "term": [ms...]} from warn_times.py's lines."""
    seen = {"usr1": [], "term": []}
    for line in out.splitlines():
        what, _, ms = line.partition(" ")
        if what in seen:
            seen[what].append(int(ms))
    return seen


def test_the_warning_comes_warn_before_ahead_of_term_when_etcd_is_stopped_killed_or_blackholed(tmp_path, members):
    frozen, dead, behind = members(), members(), members()
    relay = Relay(behind.url)
    runs = []
    try:
        for fault, url in (("sigstop", frozen.url), ("sigkill", dead.url), ("blackhole", relay.url)):
            for max_time in (None, "7s"):
                d = tmp_path / f"{fault}-{max_time or 'lease'}"
                d.mkdir()
                extra = ["--max-time", max_time] if max_time else []
                p = start_looplock(["--etcd", url, "--lock-name", fresh_name(), "--ttl", "10", "--warn-before", "3s",
                                    *extra, d, "--", PY, WARN_TIMES])
                runs.append((fault, max_time, d, p))
        for _, _, _, p in runs:
            expect_line(p)
        # Every run holds its lease now, renewed just before its command started.
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        dead.kill()
        relay.set("blackhole")
        results = []
        for fault, max_time, d, p in runs:
            out, err = p.communicate(timeout=TIMEOUT)
            results.append((fault, max_time, d, p.returncode, times(out), err))
    finally:
        frozen.kill(signal.SIGCONT)
        kill_all([p for _, _, _, p in runs])
        relay.stop()
    for fault, max_time, d, status, seen, err in results:
        what = f"{fault}, {'--max-time ' + max_time if max_time else 'no --max-time'}"
        assert status == (EX_MAX_TIME if max_time else EX_LEASE_LOST), (what, err)
        assert len(seen["usr1"]) == 1 and len(seen["term"]) == 1, (what, seen, err)
        gap = (seen["term"][0] - seen["usr1"][0]) / 1000
        assert 3.0 - TOLERANCE_S <= gap <= 3.0 + 1.0, (what, gap, err)
        warned = [line for line in err.splitlines() if "(--warn-before)" in line]
        assert len(warned) == 1, (what, err)
        if max_time:
            assert "--max-time's TERM comes in 3.0s" in warned[0], (what, warned)
        else:
            assert "the lease's renewals are failing, and its TERM comes in 3.0s" in warned[0], (what, warned)
        row = incident_rows(d)[-1]
        assert row["error_code"] == ("max_time_exceeded" if max_time else "lease_lost"), (what, row)
        assert row["warned"]["signal"] == "USR1" and row["warned"]["before_end_ms"] >= 2700, (what, row)


@pytest.mark.parametrize("fault", ["sigstop", "sigkill"])
def test_a_waiter_keeps_its_deadline_when_etcd_stops_answering_during_the_wait(tmp_path, members, fault):
    """-w covers the cluster lock's wait: a waiter whose etcd stops answering
    (frozen or dead) in the middle of its wait gives up at its deadline, not
    after another round of looks and a revoke that etcd never answers."""
    m = members()
    name = fresh_name()
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = start_looplock(["--etcd", m.url, "--lock-name", name, a_dir, "--", PY, WARN_TIMES])
    b = None
    try:
        expect_line(a)
        t0 = time.monotonic()
        b = start_looplock(["-v", "--etcd", m.url, "--lock-name", name, "-w", "2", b_dir, "--", "true"])
        expect_stderr(b, "waiting for cluster lock")
        if fault == "sigstop":
            os.kill(m.proc.pid, signal.SIGSTOP)
        else:
            m.kill()
        _, err = b.communicate(timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        m.kill(signal.SIGCONT)
        kill_all([p for p in (a, b) if p])
    assert b.returncode == 75, (b.returncode, err)
    assert "lock_acquire_timeout: cluster lock" in err and "still held after 2." in err, err
    assert elapsed < 2.0 + 0.7, elapsed  # the deadline, and a brief revoke at most


def test_a_holder_whose_lease_is_lost_exits_soon_after_its_job_ends(tmp_path, members):
    """etcd stopped: the lease's TERM ends the job, and looplock then tries
    the revoke once, briefly (etcd does not answer; the lease expires
    anyway), rather than wait seconds for it."""
    m = members()
    d = tmp_path / "d"
    d.mkdir()
    p = start_looplock(["--etcd", m.url, "--lock-name", fresh_name(), "--ttl", "4", "--kill-after", "1", d, "--", PY,
                        WARN_TIMES])
    try:
        expect_line(p)
        os.kill(m.proc.pid, signal.SIGSTOP)
        found, _ = read_until(p, p.stdout, lambda line: line.startswith("term "), timeout=TIMEOUT)
        assert found
        t_term = time.monotonic()
        p.wait(timeout=TIMEOUT)
        lingered = time.monotonic() - t_term
    finally:
        m.kill(signal.SIGCONT)
        kill_all([p])
    assert p.returncode == EX_LEASE_LOST, p.stderr.read()
    assert lingered < 0.7, lingered
