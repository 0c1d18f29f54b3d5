"""Deadline behaviour: -w and the policies' default deadlines end the wait
on time (monotonic clock), whatever signal state looplock inherits, and even
when the lock is released and retaken meanwhile; a waiter gets the lock as
soon as it is released. Bounds are behavioural with generous slack, never
speed claims."""
import os
import signal
import subprocess
import time

import pytest

from conftest import (EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, blocked_waiters, expect_line, expect_stderr, helper,
                      incident_rows, run, start, wait_until, proc_state)

LOCK = ".state.lock"


def timed(args, prefix=(), **kw):
    """Runs looplock (optionally through a launcher prefix); returns
    (CompletedProcess, elapsed seconds)."""
    t0 = time.monotonic()
    if prefix:
        r = subprocess.run([*prefix, LOOPLOCK, *[str(a) for a in args]], capture_output=True, text=True,
                           timeout=TIMEOUT, **kw)
    else:
        r = run(args, **kw)
    return r, time.monotonic() - t0


def assert_timed_out(r, marker=None):
    assert r.returncode == EX_TEMPFAIL, (r.returncode, r.stderr)
    assert "lock_acquire_timeout" in r.stderr
    if marker is not None:
        assert not marker.exists(), "the command ran without the lock"


def expect_blocked(proc, loop_dir):
    """Handshake: proc is blocked in flock(2) on DIR/.state.lock."""
    wait_until(lambda: proc.pid in blocked_waiters(loop_dir / LOCK), f"pid {proc.pid} to block in flock(2)")


# --- deadlines against a held lock ---------------------------------------------

@pytest.mark.parametrize("tool", ["looplock", "flock", "python"])
def test_timeout_0_3(loop_dir, holders, tool):
    holders(loop_dir, tool=tool)
    marker = loop_dir / "ran"
    r, took = timed(["-w", "0.3", loop_dir, "--", "touch", marker])
    assert_timed_out(r, marker)
    assert 0.25 <= took < 2.0, took


def test_timeout_0_is_one_attempt(loop_dir, holders):
    holders(loop_dir)
    marker = loop_dir / "ran"
    r, took = timed(["-w", "0", loop_dir, "--", "touch", marker])
    assert_timed_out(r, marker)
    assert incident_rows(loop_dir)[-1]["deadline_ms"] == 0
    # It did not wait: not for mutation's default 5 s, nor for the holder.
    assert took < 2.5, took


def test_mutation_default_deadline_is_5s(loop_dir, holders):
    holders(loop_dir)
    r, took = timed([loop_dir, "--", "true"])
    assert_timed_out(r)
    assert 4.9 <= took < 8.0, took
    row = incident_rows(loop_dir)[-1]
    assert row["policy"] == "mutation"
    assert row["deadline_ms"] == 5000


def test_monitor_default_deadline_is_1s(loop_dir, holders):
    holders(loop_dir)
    r, took = timed(["-p", "monitor", loop_dir, "--", "true"])
    assert_timed_out(r)
    assert 0.95 <= took < 3.0, took
    row = incident_rows(loop_dir)[-1]
    assert row["policy"] == "monitor"
    assert row["deadline_ms"] == 1000


def test_explicit_timeout_replaces_monitor_default(loop_dir, holders):
    holders(loop_dir)
    r, took = timed(["-p", "monitor", "-w", "2", loop_dir, "--", "true"])
    assert_timed_out(r)
    assert 1.95 <= took < 4.0, took


# --- the inherited signal state does not matter ---------------------------------

SIGSTATES = {
    "ALRM blocked": ["--block", "ALRM"],
    "ALRM ignored": ["--ignore", "ALRM"],
    "ALRM blocked and ignored": ["--block", "ALRM", "--ignore", "ALRM"],
    "CHLD ignored": ["--ignore", "CHLD"],
    "all of them": ["--block", "ALRM", "--ignore", "ALRM", "--ignore", "CHLD"],
}


def launcher(state):
    return [PY, helper("sigstate_exec.py"), *SIGSTATES[state], "--"]


def sigmask_bits(field, text):
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in {text!r}")


def test_launcher_sets_the_signal_state():
    # The launcher really hands the state over (else the tests below prove nothing).
    r = subprocess.run([*launcher("all of them"), "cat", "/proc/self/status"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert sigmask_bits("SigBlk", r.stdout) & (1 << (signal.SIGALRM - 1))
    ign = sigmask_bits("SigIgn", r.stdout)
    assert ign & (1 << (signal.SIGALRM - 1)) and ign & (1 << (signal.SIGCHLD - 1))


@pytest.mark.parametrize("state", list(SIGSTATES))
def test_deadline_holds_whatever_signal_state(loop_dir, holders, state):
    holders(loop_dir)
    marker = loop_dir / "ran"
    r, took = timed(["-w", "0.3", loop_dir, "--", "touch", marker], prefix=launcher(state))
    assert_timed_out(r, marker)
    assert 0.25 <= took < 2.0, took


@pytest.mark.parametrize("state", list(SIGSTATES))
def test_monitor_default_holds_whatever_signal_state(loop_dir, holders, state):
    holders(loop_dir)
    r, took = timed(["-p", "monitor", loop_dir, "--", "true"], prefix=launcher(state))
    assert_timed_out(r)
    assert 0.95 <= took < 3.0, took


@pytest.mark.parametrize("state", list(SIGSTATES))
def test_free_lock_runs_whatever_signal_state(loop_dir, state):
    # And once the wait is over, the command runs and its status passes through.
    r, _ = timed(["-w", "0.3", loop_dir, "--", "sh", "-c", "echo ran; exit 7"], prefix=launcher(state))
    assert r.returncode == 7, r.stderr
    assert r.stdout == "ran\n"


REPORT_STATUS = "print(open('/proc/self/status').read(), flush=True); print('acquired')"


@pytest.mark.parametrize("state", ["ALRM blocked", "ALRM ignored", "CHLD ignored"])
def test_waiter_with_odd_signal_state_gets_lock_on_release(loop_dir, holders, state):
    # A timed wait (armed deadline) that ends by a release: the command runs
    # at once, and starts with the signal state looplock inherited.
    h = holders(loop_dir)
    w = subprocess.Popen([*launcher(state), LOOPLOCK, "-v", "-w", "20", str(loop_dir), "--", PY, "-c",
                          REPORT_STATUS], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        expect_stderr(w, "waiting for")
        expect_blocked(w, loop_dir)
        h.release()
        status = "".join(expect_line(w, "acquired", timeout=5))
        w.communicate(timeout=TIMEOUT)
        assert w.returncode == 0
        blocked = bool(sigmask_bits("SigBlk", status) & (1 << (signal.SIGALRM - 1)))
        ignored = sigmask_bits("SigIgn", status)
        assert blocked == (state == "ALRM blocked")
        assert bool(ignored & (1 << (signal.SIGALRM - 1))) == (state == "ALRM ignored")
        assert bool(ignored & (1 << (signal.SIGCHLD - 1))) == (state == "CHLD ignored")
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


# --- a waiter gets the lock promptly after release ---------------------------------

@pytest.mark.parametrize("tool", ["looplock", "flock", "python"])
@pytest.mark.parametrize("wait", [["-p", "blocking"], ["-w", "20"]], ids=["blocking", "mutation-w20"])
def test_waiter_gets_lock_promptly_after_release(loop_dir, holders, tool, wait):
    h = holders(loop_dir, tool=tool)
    w = start(["-v", *wait, loop_dir, "--", "echo", "acquired"])
    try:
        expect_stderr(w, "waiting for")
        expect_blocked(w, loop_dir)
        released = time.monotonic()
        h.proc.stdin.close()
        expect_line(w, "acquired", timeout=10)
        took = time.monotonic() - released
        # Woken by the release, not by its deadline (20 s) or never
        # (blocking); how soon is scripts/bench's hand-off latency.
        assert took < 3.0, took
        w.communicate(timeout=TIMEOUT)
        assert w.returncode == 0
        h.release()
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


# --- released and retaken meanwhile: the deadline still holds ----------------------

def test_deadline_holds_through_release_and_retake_by_another(loop_dir, holders):
    # H1 holds; H2 queues behind it. The waiter is paused (SIGSTOP) while H1
    # releases and H2 takes the lock, so H2 surely wins; resumed, the waiter
    # must go on waiting and still give up at its original deadline.
    lock = loop_dir / LOCK
    h1 = holders(loop_dir, tool="python")
    h2 = subprocess.Popen([PY, helper("hold.py"), str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    w = start(["-v", "-w", "1.5", loop_dir, "--", "touch", loop_dir / "ran"])
    try:
        expect_stderr(w, "waiting for")
        expect_blocked(w, loop_dir)
        os.kill(w.pid, signal.SIGSTOP)
        wait_until(lambda: proc_state(w.pid) == "T", "the waiter to stop")
        h1.release()
        expect_line(h2, "ready")  # H2 holds the lock now
        os.kill(w.pid, signal.SIGCONT)
        out, err = w.communicate(timeout=TIMEOUT)
        took = time.monotonic() - t0
        assert w.returncode == EX_TEMPFAIL, err
        assert "lock_acquire_timeout" in err
        assert not (loop_dir / "ran").exists()
        assert 1.45 <= took < 4.0, took
    finally:
        for p in (w, h2):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_deadline_holds_while_holder_keeps_retaking(loop_dir):
    # The holder drops its exclusive lock and retakes it in a loop, waking
    # the waiter every few milliseconds; the deadline must not restart.
    h = subprocess.Popen([PY, helper("churn_hold.py"), str(loop_dir / LOCK)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(h, "ready")
        marker = loop_dir / "ran"
        r, took = timed(["-w", "0.5", loop_dir, "--", "touch", marker])
        assert_timed_out(r, marker)
        assert 0.45 <= took < 2.5, took
    finally:
        if h.poll() is None:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)


def test_deadline_holds_when_lock_file_is_replaced_and_relocked(loop_dir):
    # The waiter wakes up holding the old, replaced file, must not run on it,
    # retries on the new file (held too), and still stops at the deadline.
    h = subprocess.Popen([PY, helper("swap_hold.py"), str(loop_dir / LOCK)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    w = None
    try:
        expect_line(h, "ready")
        marker = loop_dir / "ran"
        t0 = time.monotonic()
        w = start(["-v", "-w", "1", loop_dir, "--", "touch", marker])
        expect_stderr(w, "waiting for")
        expect_blocked(w, loop_dir)
        h.stdin.write("swap\n")
        h.stdin.flush()
        expect_line(h, "swapped")
        out, err = w.communicate(timeout=TIMEOUT)
        took = time.monotonic() - t0
        assert w.returncode == EX_TEMPFAIL, err
        assert "replaced" in err  # it did wake on the old file and retried
        assert "lock_acquire_timeout" in err
        assert not marker.exists()
        assert 0.95 <= took < 3.0, took
    finally:
        for p in (w, h):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
