"""-p coalesce (looplock-schedules(7)): a tick that finds the loop busy is
not lost, and a burst of ticks does not pile up: one run of an operation
waits for the lock, every later run of it that comes while that one waits
skips (noop-coalesced). Real looplock processes, a real holder, and a
history of who ran, checked afterwards, locally and with --etcd."""
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import expect_stderr, fill_disk
from conftest import (EX_CANTCREAT, EX_TEMPFAIL, EX_USAGE, PY, TIMEOUT, blocked_waiters, expect_line, helper, incident_rows,
                      kill_and_wait_gone, run, start, wait_until)

TICK = helper("slot_tick.py")
BURST = 10


def ticks(history):
    p = Path(history)
    return [line.split()[0] for line in p.read_text().splitlines()] if p.exists() else []


def tick(history, label, how="0"):
    return [PY, TICK, str(history), label, how]


def coalesce(loop_dir, op="tick", *extra):
    return ["-p", "coalesce", "--operation", op, *extra, str(loop_dir), "--"]


def seats(loop_dir):
    return sorted(p.name for p in Path(loop_dir).glob(".state.lock.coalesce.*"))


def hold_tick(loop_dir, history):
    """A tick (looplock, -p mutation) that holds the lock until its stdin ends."""
    holder = start(["--operation", "tick", str(loop_dir), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    return holder


def waiting(loop_dir, args):
    """A run started with `args` once it is blocked on the lock."""
    p = start(args, stdin=None)
    wait_until(lambda: p.pid in blocked_waiters(Path(loop_dir) / ".state.lock"), "a run to wait")
    return p


def fire(args_of, n=BURST):
    """Starts n runs at once (a burst of ticks); returns them."""
    return [start(args_of(i), stdin=None) for i in range(n)]


def settle(procs, waiting=1):
    """Waits until all but `waiting` of the burst have ended; returns the
    ones still running (the burst's waiters)."""
    wait_until(lambda: sum(p.poll() is None for p in procs) <= waiting, "the burst's skips to end")
    left = [p for p in procs if p.poll() is None]
    assert len(left) == waiting, [p.communicate(timeout=TIMEOUT) for p in procs if p.poll() is not None]
    return left


def finish(procs):
    return [(p.wait(timeout=TIMEOUT), p.stderr.read()) for p in procs]


def test_ten_ticks_fired_while_the_holder_runs_end_as_one_more_run_and_nine_skips(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    burst = fire(lambda i: [*coalesce(loop_dir), *tick(history, f"r{i}")])
    [waiter] = settle(burst)
    wait_until(lambda: waiter.pid in blocked_waiters(loop_dir / ".state.lock"), "the waiter to block on the lock")
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    ends = finish(burst)
    assert [status for status, _ in ends] == [0] * BURST
    ran = ticks(history)
    assert ran[0] == "holder" and len(ran) == 2, ran
    assert ran[1] == f"r{burst.index(waiter)}"
    skips = [err for p, (_, err) in zip(burst, ends) if p is not waiter]
    for err in skips:
        assert "noop-coalesced: " in err, err
        assert f"pid {waiter.pid} (agent " in err and "already waits to run tick" in err
        assert f"held by pid {holder.pid} (" in err
    assert incident_rows(loop_dir) == []  # a skip writes no incident row
    assert seats(loop_dir) and (loop_dir / seats(loop_dir)[0]).stat().st_size == 0  # left empty


def test_control_without_coalesce_the_ten_ticks_all_run_after_the_holder(loop_dir, tmp_path):
    """The same burst under -p blocking: every tick waits and runs (what the
    test above shows -p coalesce prevents)."""
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    burst = fire(lambda i: ["-p", "blocking", "--operation", "tick", str(loop_dir), "--", *tick(history, f"r{i}")])
    wait_until(lambda: len(blocked_waiters(loop_dir / ".state.lock")) == BURST, "the burst to wait")
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    assert [status for status, _ in finish(burst)] == [0] * BURST
    assert len(ticks(history)) == 1 + BURST


def test_a_free_lock_runs_at_once_and_leaves_no_seat(loop_dir, tmp_path):
    history = tmp_path / "history"
    r = run([*coalesce(loop_dir), *tick(history, "a")])
    assert r.returncode == 0, r.stderr
    assert ticks(history) == ["a"] and seats(loop_dir) == []


def test_only_runs_of_the_same_operation_coalesce_other_operations_and_policies_wait(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    lock = loop_dir / ".state.lock"
    tick_waiter = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "tick")])
    gate = start([*coalesce(loop_dir, "check-gate"), *tick(history, "gate")], stdin=None)
    plain = start(["-p", "blocking", "--operation", "tick", str(loop_dir), "--", *tick(history, "plain")], stdin=None)
    wait_until(lambda: {gate.pid, plain.pid} <= blocked_waiters(lock), "the other operation and policy to wait")
    skipped = run([*coalesce(loop_dir), *tick(history, "skipped")])
    assert skipped.returncode == 0 and "noop-coalesced" in skipped.stderr
    assert f"pid {tick_waiter.pid} " in skipped.stderr
    holder.stdin.close()
    assert [status for status, _ in finish([holder, tick_waiter, gate, plain])] == [0] * 4
    assert sorted(ticks(history)) == ["gate", "holder", "plain", "tick"]


def test_a_killed_waiter_lets_the_next_tick_wait_in_its_place(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    lock = loop_dir / ".state.lock"
    first = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "first")])
    kill_and_wait_gone(first.pid)
    first.wait(timeout=TIMEOUT)
    second = start([*coalesce(loop_dir), *tick(history, "second")], stdin=None)
    wait_until(lambda: second.pid in blocked_waiters(lock) or second.poll() is not None, "the second tick")
    assert second.poll() is None, second.stderr.read()  # it waits: the seat was freed by the kill
    third = run([*coalesce(loop_dir), *tick(history, "third")])
    assert f"pid {second.pid} " in third.stderr and "noop-coalesced" in third.stderr
    holder.stdin.close()
    assert [status for status, _ in finish([holder, second])] == [0, 0]
    assert ticks(history) == ["holder", "second"]


def test_w_bounds_the_wait_and_its_timeout_row_counts_the_ticks_it_absorbed(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    deadline = 1.5
    t0 = time.monotonic()
    waiter = waiting(loop_dir, [*coalesce(loop_dir, "tick", "-w", str(deadline)), *tick(history, "w")])
    for label in ("a", "b"):
        r = run([*coalesce(loop_dir), *tick(history, label)])
        assert "noop-coalesced" in r.stderr, r.stderr
    assert time.monotonic() - t0 < deadline, "the machine was too slow to absorb both in time"
    assert waiter.wait(timeout=TIMEOUT) == EX_TEMPFAIL
    err = waiter.stderr.read()
    assert "lock_acquire_timeout" in err and "gave up tick and the 2 later runs of it that it absorbed" in err
    [row] = incident_rows(loop_dir)
    assert row["error_code"] == "lock_acquire_timeout" and row["policy"] == "coalesce" and row["coalesced"] == 2
    # The seat is free again: the next tick waits instead of skipping.
    nxt = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "next")])
    holder.stdin.close()
    assert [status for status, _ in finish([holder, nxt])] == [0, 0]
    assert ticks(history) == ["holder", "next"]


def test_the_skip_is_quiet_with_q_takes_skip_exit_code_and_counts_as_skipped(loop_dir, tmp_path):
    history = tmp_path / "history"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    holder = hold_tick(loop_dir, history)
    waiter = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "w")])
    r = run(["-q", "--metrics-dir", metrics, *coalesce(loop_dir), *tick(history, "q")])
    assert r.returncode == 0 and r.stderr == ""
    r = run(["--skip-exit-code", "3", *coalesce(loop_dir), *tick(history, "e")])
    assert r.returncode == 3
    r = run(["--log-format", "json", *coalesce(loop_dir), *tick(history, "j")])
    line = json.loads(r.stderr.splitlines()[-1])
    assert line["event"] == "noop-coalesced" and line["coalesce"]["waiter"]["pid"] == waiter.pid
    assert line["holder_pids"] == [holder.pid] or line["holder"]["pid"] == holder.pid
    prom = next(metrics.glob("*.prom")).read_text()
    assert 'outcome="skipped"} 1' in prom
    holder.stdin.close()
    finish([holder, waiter])
    assert ticks(history) == ["holder", "w"]


def test_once_per_decides_first_a_slot_already_run_is_noop_already_run(loop_dir, tmp_path):
    history = tmp_path / "history"
    assert run(["--once-per", "60s", *coalesce(loop_dir), *tick(history, "a")]).returncode == 0
    holder = start(["--operation", "other", str(loop_dir), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    r = run(["--once-per", "60s", *coalesce(loop_dir), *tick(history, "b")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr and "noop-coalesced" not in r.stderr
    holder.stdin.close()
    finish([holder])
    assert ticks(history) == ["a", "holder"]


def test_with_once_per_a_tick_absorbed_after_its_slot_came_due_runs(loop_dir, tmp_path):
    """Tick 0 runs (--once-per 2s); tick A comes and waits in the seat; tick
    B comes once 2 s have passed since tick 0 started (its slot is due) and
    is absorbed by A. A is judged by the newest start it absorbed, B's: it
    runs, and records that instant. Judged by its own start, within tick
    0's slot, it would skip, and nothing would run for B."""
    history = tmp_path / "history"
    args = ["--once-per", "2s", *coalesce(loop_dir)]
    first = start([*args, *tick(history, "tick0", "hold")])
    expect_line(first)
    a = waiting(loop_dir, [*args, *tick(history, "A")])
    started_ms = int(Path(history).read_text().split()[2])
    wait_until(lambda: time.time() * 1000 - started_ms > 2300, "tick 0's slot to be over", timeout=TIMEOUT)
    b = run([*args, *tick(history, "B")])
    assert b.returncode == 0 and "noop-coalesced" in b.stderr, b.stderr
    first.stdin.close()
    assert [status for status, _ in finish([first, a])] == [0, 0]
    assert ticks(history) == ["tick0", "A"]
    # The slot A ran is B's: a tick right after it skips.
    c = run([*args, *tick(history, "C")])
    assert c.returncode == 0 and "noop-already-run" in c.stderr, c.stderr


def test_with_once_per_a_tick_absorbed_inside_the_slot_still_skips(loop_dir, tmp_path):
    """The control: the same, but B comes inside tick 0's slot (--once-per
    60s): A, judged by B's start, skips as B would have."""
    history = tmp_path / "history"
    args = ["--once-per", "60s", *coalesce(loop_dir)]
    first = start([*args, *tick(history, "tick0", "hold")])
    expect_line(first)
    a = waiting(loop_dir, [*args, *tick(history, "A")])
    b = run([*args, *tick(history, "B")])
    assert b.returncode == 0 and "noop-coalesced" in b.stderr, b.stderr
    first.stdin.close()
    ends = finish([first, a])
    assert [status for status, _ in ends] == [0, 0]
    assert "noop-already-run" in ends[1][1]
    assert ticks(history) == ["tick0"]


def test_a_waiter_killed_after_it_absorbed_a_tick_is_named_by_the_next_run_that_takes_the_seat(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    first = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "first")])
    absorbed = run([*coalesce(loop_dir), *tick(history, "absorbed")])
    assert "noop-coalesced" in absorbed.stderr
    kill_and_wait_gone(first.pid)
    first.wait(timeout=TIMEOUT)
    i = run(["--inspect", "--check", loop_dir])
    assert i.returncode == 1, i.stdout
    assert (f"its waiter, pid {first.pid} (operation tick), died while it waited, after it absorbed 1 later run "
            "of it, which did not run then") in i.stdout, i.stdout
    second = start([*coalesce(loop_dir), *tick(history, "second")], stdin=None)
    wait_until(lambda: second.pid in blocked_waiters(loop_dir / ".state.lock") or second.poll() is not None,
               "the second tick")
    holder.stdin.close()
    ends = finish([holder, second])
    assert "died while it waited" not in run(["--inspect", loop_dir]).stdout  # the seat was cleared
    assert [status for status, _ in ends] == [0, 0]
    assert (f"pid {first.pid} died in the seat of tick (KILLed while it waited) after it absorbed 1 later run, "
            "which never ran: this run runs for them") in ends[1][1], ends[1][1]
    assert ticks(history) == ["holder", "second"]


def test_with_once_per_a_killed_waiters_tick_inside_a_slot_that_ran_is_not_called_lost(loop_dir, tmp_path):
    """--once-per 1h: the holder's run counts for the slot; the waiter
    absorbs a tick inside it and is KILLed. The ledger shows the slot's run
    did that tick's work (it would have skipped): --inspect --check does not
    warn. Before, it warned until a coalescing run had to wait."""
    history = tmp_path / "history"
    args = ["--once-per", "1h"]
    holder = start([*args, *coalesce(loop_dir), *tick(history, "holder", "hold")])
    expect_line(holder)
    first = waiting(loop_dir, [*args, *coalesce(loop_dir), *tick(history, "first")])
    assert "noop-coalesced" in run([*args, *coalesce(loop_dir), *tick(history, "absorbed")]).stderr
    kill_and_wait_gone(first.pid)
    first.wait(timeout=TIMEOUT)
    assert run(["--inspect", "--check", loop_dir]).returncode == 1  # the slot's run has not ended yet
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    i = run(["--inspect", "--check", loop_dir])
    assert i.returncode == 0 and "died while it waited" not in i.stdout, i.stdout
    assert ticks(history) == ["holder"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_waiter_ended_by_a_signal_says_what_it_absorbed_and_dies_of_it(loop_dir, tmp_path, sig):
    """As a -w deadline does: its line and incident row count the runs it
    absorbed ("coalesced": N) and say that none of them ran; then it ends of
    the signal, as any waiter does."""
    history = tmp_path / "history"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    holder = hold_tick(loop_dir, history)
    first = waiting(loop_dir, [*coalesce(loop_dir, "tick", "--metrics-dir", metrics), *tick(history, "first")])
    for label in ("a", "b"):
        r = run([*coalesce(loop_dir), *tick(history, label)])
        assert "noop-coalesced" in r.stderr, r.stderr
    os.kill(first.pid, sig)
    assert first.wait(timeout=TIMEOUT) == -sig
    err = first.stderr.read()
    assert (f"signal {sig.name[3:]} ended the wait for {loop_dir}/.state.lock" in err
            and "and the 2 later runs of it that it absorbed, none of which ran" in err), err
    row = incident_rows(loop_dir)[-1]
    assert row["error_code"] == "lock_acquire_timeout" and row["coalesced"] == 2, row
    assert row["signal"] == sig.name[3:], row
    assert list(metrics.glob("looplock_*.prom")), "no metrics: the run did not finish before the signal ended it"
    holder.stdin.close()
    finish([holder])
    assert ticks(history) == ["holder"]


def test_with_holders_a_waiter_for_an_index_ended_by_a_signal_says_what_it_absorbed_and_dies_of_it(loop_dir, tmp_path):
    """--holders 2 with both indexes held: the coalescing waiter waits for
    an index, not for the lock file. TERM then ends it as at a -w deadline
    (its line and row count the run it absorbed), then it dies of TERM.
    Before, it died at once, silently, and the next waiter said it was
    KILLed."""
    history = tmp_path / "history"
    holders = []
    for label in ("h1", "h2"):
        h = start(["--holders", "2", "--operation", label, str(loop_dir), "--", *tick(history, label, "hold")])
        expect_line(h)
        holders.append(h)
    first = start(["-v", "--holders", "2", *coalesce(loop_dir), *tick(history, "first")], stdin=None)
    try:
        expect_stderr(first, "waiting for one of the 2 holders")
        r = run(["--holders", "2", *coalesce(loop_dir), *tick(history, "a")])
        assert "noop-coalesced" in r.stderr, r.stderr
        # The waiter gets in when any index is free (before: "once every holder index ... is free").
        assert "once one of the holder indexes of " in r.stderr and "every holder index" not in r.stderr, r.stderr
        os.kill(first.pid, signal.SIGTERM)
        assert first.wait(timeout=TIMEOUT) == -signal.SIGTERM
        err = first.stderr.read()
        assert "signal TERM ended the wait" in err and "the 1 later run of it that it absorbed" in err, err
        row = incident_rows(loop_dir)[-1]
        assert row["error_code"] == "lock_acquire_timeout" and row["coalesced"] == 1, row
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=TIMEOUT)
        for h in holders:
            h.stdin.close()
        finish(holders)
    assert len(ticks(history)) == 2  # the holders alone: neither the waiter nor the tick it absorbed ran


def test_a_shared_and_an_exclusive_tick_of_one_operation_never_absorb_each_other(loop_dir, tmp_path):
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    exclusive = waiting(loop_dir, [*coalesce(loop_dir), *tick(history, "exclusive")])
    shared = start(["-s", *coalesce(loop_dir), *tick(history, "shared")], stdin=None)
    wait_until(lambda: shared.pid in blocked_waiters(loop_dir / ".state.lock") or shared.poll() is not None,
               "the shared tick to wait")
    assert shared.poll() is None, shared.stderr.read()  # it waits in a seat of its own
    holder.stdin.close()
    assert [status for status, _ in finish([holder, exclusive, shared])] == [0, 0, 0]
    assert sorted(ticks(history)) == ["exclusive", "holder", "shared"]


def test_on_a_full_disk_a_burst_still_gives_one_run_and_says_what_it_could_not_record(tmp_path, tmpfs):
    """The seat's record and the absorbed runs' lines cannot be written: the
    first run still waits in the seat, the rest of the burst skip at once
    (never one that takes the seat once it is free again), and each says
    what it could not record."""
    mnt = tmpfs(size="256k")
    d = mnt / "loop"
    d.mkdir()
    history = tmp_path / "history"
    holder = hold_tick(d, history)
    fill_disk(mnt)
    first = waiting(d, [*coalesce(d), *tick(history, "first")])
    burst = fire(lambda i: [*coalesce(d), *tick(history, f"r{i}")], n=4)
    # Each looks for the seat's record for a second, finds none, and is
    # absorbed all the same (a run that finds the seat taken never takes it
    # later, even once the waiter has left it for the lock).
    skipped = finish(burst)
    holder.stdin.close()
    ends = finish([holder, first])
    assert [status for status, _ in ends + skipped] == [0] * 6, ends + skipped
    assert "cannot write this run's record into -p coalesce's seat" in ends[1][1], ends[1][1]
    for _, err in skipped:
        assert "noop-coalesced: a run whose record cannot be read already waits" in err, err
    assert ticks(history) == ["holder", "first"]


def test_coalesce_needs_an_explicit_operation(loop_dir):
    r = run(["-p", "coalesce", str(loop_dir), "--", "true"])
    assert r.returncode == EX_USAGE and "-p coalesce needs --operation NAME" in r.stderr


def test_an_unsafe_seat_is_refused_with_73_as_every_file_beside_the_lock_file(loop_dir, tmp_path, holders):
    holders(loop_dir, "flock")
    other = loop_dir / "other"
    other.write_text("")
    seat = loop_dir / (".state.lock.coalesce." + hashlib.sha256(b"tick").hexdigest()[:16])
    os.link(other, seat)
    r = run([*coalesce(loop_dir), "true"])
    assert r.returncode == EX_CANTCREAT, r.stderr
    assert "unsafe coalesce seat" in r.stderr and "hard links" in r.stderr


def test_inspect_marks_the_coalescing_waiter_whatever_its_operations_name(loop_dir, tmp_path):
    """--inspect finds the waiter's seat by its whole name (over 256 bytes,
    not UTF-8), though its records hold the name clipped and as UTF-8."""
    history = tmp_path / "history"
    holder = hold_tick(loop_dir, history)
    name = "x" * 300 + "\udcff"  # a byte that is not UTF-8 (surrogateescape)
    waiter = waiting(loop_dir, ["-p", "coalesce", "--operation", name, str(loop_dir), "--", *tick(history, "w")])
    report = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    [w] = [w for w in report["waiters"] if w["pid"] == waiter.pid]
    assert w["coalescing"] is True
    assert "coalescing: later -p coalesce runs of" in run(["--inspect", loop_dir]).stdout
    holder.stdin.close()
    assert [status for status, _ in finish([holder, waiter])] == [0, 0]
