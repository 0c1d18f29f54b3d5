"""What looplock tells an operator is true: one verdict on a lock, rendered by
every line that names the holder (the timeout, skip and wait lines, the JSON
log, the incident row, --inspect), never naming the wrong process.

Each test is a case that was observed wrong: a crashed looplock's record
pinned on the next holder, a lock_leaked warning when looplock itself had
ended the job.
"""
import json
import os
import signal
import subprocess

import pytest

from conftest import (EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, expect_line, flock_holder, helper, incident_rows,
                      lock_is_free, proc_state, release, run, start, wait_until)


def crashed_record(loop_dir):
    """A looplock holder killed with KILL: its record stays, unreleased, and
    the lock is free. Returns the dead looplock's pid."""
    p = start(["--agent", "cron", loop_dir, "--", PY, helper("wait_stdin.py")])
    expect_line(p, "ready")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=TIMEOUT)
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")
    return p.pid


def test_a_crashed_looplocks_record_is_not_pinned_on_the_next_holder(loop_dir):
    dead = crashed_record(loop_dir)
    f = flock_holder(loop_dir / ".state.lock")
    try:
        r = run(["-w", "0.2", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        first = r.stderr.splitlines()[0]
        assert f"still held after" in first and f"by pid {f.pid} (flock): no looplock record;" in first, first
        assert str(dead) not in r.stderr and "left holding" not in r.stderr, r.stderr
        row = incident_rows(loop_dir)[-1]
        assert row["holder"] is None and row["holder_alive"] is None
        assert row["holder_pids"] == [f.pid]
        assert row["record_status"] == "stale" and row["record"]["pid"] == dead
        assert f"inspect pid {f.pid} " in row["operator_action"]
        # The skip line and the JSON log say the same.
        r = run(["-p", "single_flight", "--log-format", "json", loop_dir, "--", "true"])
        line = json.loads(r.stderr)
        assert f"held by pid {f.pid} (flock): no looplock record;" in line["message"]
        assert line["holder"] is None and line["holder_pids"] == [f.pid] and line["record_status"] == "stale"
        # --inspect names the same holder, and the record as stale.
        obj = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
        assert obj["holder"] == f"pid {f.pid} (flock): no looplock record"
        assert obj["record"]["status"] == "stale"
        assert f"pid {f.pid} is alive" in obj["operator_action"] and str(dead) not in obj["operator_action"]
    finally:
        release(f)


def test_a_killed_holder_not_yet_reaped_is_dead_not_alive(loop_dir):
    """A looplock killed with KILL whose parent has not read its status yet
    (a zombie) has ended: --inspect says its record was left behind by a dead
    process, not that the process lives."""
    p = start(["--agent", "cron", loop_dir, "--", PY, helper("wait_stdin.py")])
    try:
        expect_line(p, "ready")
        os.kill(p.pid, signal.SIGKILL)
        wait_until(lambda: proc_state(p.pid) == "Z", "the killed looplock to be a zombie")
        wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")
        assert proc_state(p.pid) == "Z"  # not reaped: the pid still exists
        obj = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
        assert obj["record"]["pid_alive"] is False, obj["record"]
        assert obj["record"]["status"] == "crashed", obj["record"]
        text = run(["--inspect", loop_dir]).stdout
        assert "dead" in text and "alive, same process" not in text, text
    finally:
        p.wait(timeout=TIMEOUT)


def test_the_control_a_live_looplock_holder_is_named_by_its_record(loop_dir):
    """The rule cuts only stale records: a live looplock is named from its
    record, everywhere."""
    h = start(["--agent", "cron", loop_dir, "--", PY, helper("wait_stdin.py")])
    expect_line(h, "ready")
    try:
        r = run(["-w", "0.1", loop_dir, "--", "true"])
        assert f"by pid {h.pid} (agent cron, operation wait_stdin.py, policy mutation, since " in r.stderr, r.stderr
        row = incident_rows(loop_dir)[-1]
        assert row["holder"]["pid"] == h.pid and row["holder_alive"] is True and row["record_status"] == "current"
        assert "record" not in row
    finally:
        h.stdin.close()
        h.wait(timeout=TIMEOUT)


def test_no_false_lock_leaked_when_looplock_ended_the_job(loop_dir):
    """`timeout 0.5 looplock -q D -c 'sleep 32 & sleep 33'` said the lock
    stays held by the sleeps in some runs: they had the forwarded TERM and were
    still dying. -q does not hide lock_leaked, so cron mailed it."""
    for _ in range(8):
        r = subprocess.run(["timeout", "0.5", LOOPLOCK, "-q", str(loop_dir), "-c", "sleep 32 & sleep 33"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 124, r.stderr
        assert "lock_leaked" not in r.stderr and "still holds" not in r.stderr, r.stderr
        assert r.stderr == ""
        wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")


def test_a_true_leak_is_named_every_time_also_with_quiet(loop_dir):
    """A setsid child that keeps the descriptor is not in the job's group and
    not exiting: it is named at once, every time."""
    for _ in range(3):
        r = run(["-q", loop_dir, "--", "sh", "-c", "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!"])
        pid = int(r.stdout)
        try:
            assert r.returncode == 0
            assert f"the command exited, but pid {pid} that it started still holds" in r.stderr, r.stderr
        finally:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")


def test_leaks_of_several_processes_read_in_the_plural(loop_dir):
    r = run([loop_dir, "--", "sh", "-c",
             "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!; setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!"])
    pids = [int(x) for x in r.stdout.split()]
    try:
        assert "pids " in r.stderr and "that it started still hold " in r.stderr, r.stderr
        assert "until they exit" in r.stderr
        r = run(["-w", "0.1", loop_dir, "--", "true"])
        row = incident_rows(loop_dir)[-1]
        assert sorted(row["holder_pids"]) == sorted(pids)
        assert "confirm they are still running" in row["operator_action"]
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)
