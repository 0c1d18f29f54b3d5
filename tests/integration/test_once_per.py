"""--once-per (one run per slot of a schedule), --jitter, and the job that
knows its deadline (LOOPLOCK_DEADLINE, --warn-before), on one host: real
looplock processes, a real run ledger (DIR/.state.lock.runs.json), real
signals. The cluster's half (the etcd ledger, two "hosts", clocks apart) is
in test_once_per_etcd.py."""
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import fill_disk
from conftest import (EX_CANTCREAT, EX_NOTFOUND, EX_TEMPFAIL, LOOPLOCK, NO_PROC, PY, TIMEOUT, children,
                      expect_line, expect_stderr, helper, incident_rows, kill_and_wait_gone, need_no_proc, proc_state,
                      run, running, start, wait_until)

TICK = helper("slot_tick.py")
CHECKPOINT = helper("checkpoint_tick.py")
RUNS = ".state.lock.runs.json"


def ticks(history):
    """The ticks that ran: (label, pid, wall ms, fencing token)."""
    p = Path(history)
    if not p.exists():
        return []
    return [tuple(line.split()) for line in p.read_text().splitlines()]


def copies(loop_dir):
    """The ledger's valid copies, as looplock-files(5) describes them: each
    line that ends with its check (the first 16 hex digits of the SHA-256 of
    the text before it), NUL bytes and spaces around it skipped."""
    out = []
    for line in (Path(loop_dir) / RUNS).read_bytes().split(b"\n")[:-1]:
        text = line.lstrip(b"\0 ").rstrip(b" ").decode(errors="replace")
        at = text.rfind(',"check":"')
        if at < 0 or text[at:] != ',"check":"' + hashlib.sha256(text[:at].encode()).hexdigest()[:16] + '"}':
            continue
        out.append(json.loads(text))
    return out


def ledger(loop_dir):
    """The newest valid copy: the highest generation."""
    return max(copies(loop_dir), key=lambda c: c.get("generation", 0))


def once(loop_dir, duration="60s", op="tick", *extra):
    return ["--once-per", duration, "--operation", op, *extra, str(loop_dir), "--"]


def tick(history, label, how="0"):
    return [PY, TICK, str(history), label, how]


def test_two_schedulers_fire_the_same_slot_0_3s_apart_and_it_runs_once(loop_dir, tmp_path):
    history = tmp_path / "history"
    a = start([*once(loop_dir), *tick(history, "a", "hold")])
    expect_line(a)
    time.sleep(0.3)  # the second scheduler, 0.3 s late
    b = start([*once(loop_dir), *tick(history, "b")])  # mutation: it waits for a
    a.stdin.close()
    assert a.wait(timeout=TIMEOUT) == 0
    out, err = b.communicate(timeout=TIMEOUT)
    assert b.returncode == 0, err
    assert [t[0] for t in ticks(history)] == ["a"]
    assert "noop-already-run: tick already ran in this slot" in err
    assert f"pid {a.pid} " in err and " and ended at " in err and "with status 0" in err
    entry = ledger(loop_dir)["runs"][0]
    assert entry["pid"] == a.pid and entry["exit_status"] == 0 and entry["ended_ms"] >= entry["started_ms"]


def test_control_without_once_per_the_second_scheduler_runs_the_tick_again(loop_dir, tmp_path):
    """The same two schedulers without --once-per: the lock serialises them
    and both run (what the test above shows looplock prevents)."""
    history = tmp_path / "history"
    a = start(["--operation", "tick", str(loop_dir), "--", *tick(history, "a", "hold")])
    expect_line(a)
    time.sleep(0.3)
    b = start(["--operation", "tick", str(loop_dir), "--", *tick(history, "b")])
    a.stdin.close()
    assert a.wait(timeout=TIMEOUT) == 0
    assert b.wait(timeout=TIMEOUT) == 0
    assert [t[0] for t in ticks(history)] == ["a", "b"]


def test_single_flight_finding_the_slot_running_is_the_slots_skip_not_noop_locked(loop_dir, tmp_path):
    history = tmp_path / "history"
    a = start([*once(loop_dir, "60s", "tick", "-p", "single_flight"), *tick(history, "a", "hold")])
    expect_line(a)
    r = run([*once(loop_dir, "60s", "tick", "-p", "single_flight"), *tick(history, "b")])
    assert r.returncode == 0, r.stderr
    assert "noop-already-run" in r.stderr and "noop-locked" not in r.stderr
    assert f"pid {a.pid} " in r.stderr and "holds the lock now" in r.stderr
    # Another operation is not that run's slot: a plain single_flight skip.
    r = run([*once(loop_dir, "60s", "other", "-p", "single_flight"), *tick(history, "c")])
    assert r.returncode == 0 and "noop-locked" in r.stderr, r.stderr
    a.stdin.close()
    assert a.wait(timeout=TIMEOUT) == 0
    assert [t[0] for t in ticks(history)] == ["a"]


def test_a_deadline_passing_while_the_slot_runs_waits_for_its_end_then_skips_without_an_incident_row(loop_dir,
                                                                                                      tmp_path):
    """The slot's run holds the lock past b's -w: b cannot know yet whether
    that run will end well (then the slot is done) or crash (then b must
    run it), so it waits on, and skips once the run has recorded its end."""
    history = tmp_path / "history"
    a = start([*once(loop_dir), *tick(history, "a", "hold")])
    expect_line(a)
    b = start(["-v", *once(loop_dir, "60s", "tick", "-w", "0.3"), *tick(history, "b")])
    expect_stderr(b, "waiting past the deadline for the slot's run, host ")
    a.stdin.close()
    assert a.wait(timeout=TIMEOUT) == 0
    out, err = b.communicate(timeout=TIMEOUT)
    assert b.returncode == 0, err
    assert "noop-already-run" in err and "lock_acquire_timeout" not in err
    assert [t[0] for t in ticks(history)] == ["a"]
    assert len([x for x in err.splitlines() if x.startswith("looplock: waiting for ")]) <= 1, err  # said once
    assert incident_rows(loop_dir) == []
    # Without --once-per the same wait is a timeout, with its row.
    a = start(["--operation", "tick", str(loop_dir), "--", *tick(history, "c", "hold")])
    expect_line(a)
    r = run(["--operation", "tick", "-w", "0.3", str(loop_dir), "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    assert len(incident_rows(loop_dir)) == 1
    a.stdin.close()
    a.wait(timeout=TIMEOUT)


def test_single_flight_finding_the_slots_live_run_skips_at_once(loop_dir, tmp_path):
    history = tmp_path / "history"
    a = start([*once(loop_dir), *tick(history, "a", "hold")])
    expect_line(a)
    t0 = time.monotonic()
    r = run([*once(loop_dir, "60s", "tick", "-p", "single_flight"), *tick(history, "b")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr and "its run holds the lock now" in r.stderr
    assert time.monotonic() - t0 < 20  # not the minute of --once-per
    a.stdin.close()
    assert a.wait(timeout=TIMEOUT) == 0


def test_a_slot_already_run_skips_before_waiting_without_queueing(loop_dir, tmp_path):
    history = tmp_path / "history"
    assert run([*once(loop_dir), *tick(history, "a")]).returncode == 0
    # Another operation holds the lock; this one's slot has run: skip at once
    # instead of waiting the whole -w for the lock.
    holder = start(["--operation", "other", str(loop_dir), "--", *tick(history, "other", "hold")])
    expect_line(holder)
    t0 = time.monotonic()
    r = run([*once(loop_dir, "60s", "tick", "-w", "20"), *tick(history, "b")])
    took = time.monotonic() - t0
    assert r.returncode == 0 and "noop-already-run" in r.stderr, r.stderr
    assert took < 15, took  # it did not wait out -w 20
    holder.stdin.close()
    holder.wait(timeout=TIMEOUT)
    assert [t[0] for t in ticks(history)] == ["a", "other"]


def test_after_duration_the_next_slot_runs(loop_dir, tmp_path):
    history = tmp_path / "history"
    assert run([*once(loop_dir, "0.5s"), *tick(history, "a")]).returncode == 0
    assert run([*once(loop_dir, "0.5s"), *tick(history, "b")]).returncode == 0
    first = int(ticks(history)[0][2])
    while time.time() * 1000 < first + 700:
        time.sleep(0.05)
    assert run([*once(loop_dir, "0.5s"), *tick(history, "c")]).returncode == 0
    assert [t[0] for t in ticks(history)] == ["a", "c"]


def test_another_operation_on_the_same_lock_has_its_own_slot(loop_dir, tmp_path):
    history = tmp_path / "history"
    assert run([*once(loop_dir, "60s", "tick"), *tick(history, "tick")]).returncode == 0
    assert run([*once(loop_dir, "60s", "gate"), *tick(history, "gate")]).returncode == 0
    assert run([*once(loop_dir, "60s", "tick"), *tick(history, "tick2")]).returncode == 0
    assert run([*once(loop_dir, "60s", "gate"), *tick(history, "gate2")]).returncode == 0
    assert [t[0] for t in ticks(history)] == ["tick", "gate"]
    assert sorted(e["operation"] for e in ledger(loop_dir)["runs"]) == ["gate", "tick"]
    # Runs without --once-per neither read nor write it, nor are they skipped.
    assert run(["--operation", "tick", str(loop_dir), "--", *tick(history, "plain")]).returncode == 0
    assert [t[0] for t in ticks(history)][-1] == "plain"


def test_the_skip_exits_like_single_flight_quiet_with_q_and_counts_as_skipped(loop_dir, tmp_path):
    history = tmp_path / "history"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    assert run(["--metrics-dir", metrics, *once(loop_dir), *tick(history, "a")]).returncode == 0
    r = run(["--skip-exit-code", "3", *once(loop_dir), *tick(history, "b")])
    assert r.returncode == 3
    r = run(["-q", "--metrics-dir", metrics, *once(loop_dir), *tick(history, "c")])
    assert r.returncode == 0 and r.stderr == ""
    r = run(["--log-format", "json", *once(loop_dir), *tick(history, "d")])
    line = json.loads(r.stderr.splitlines()[-1])
    assert line["event"] == "noop-already-run"
    assert line["last_run"]["exit_status"] == 0 and line["running_now"] is False
    prom = next(metrics.glob("*.prom")).read_text()
    assert 'outcome="skipped"} 1' in prom and 'outcome="success"} 1' in prom
    assert [t[0] for t in ticks(history)] == ["a"]


def test_a_looplock_killed_mid_run_does_not_consume_the_slot(loop_dir, tmp_path):
    history = tmp_path / "history"
    a = start([*once(loop_dir), *tick(history, "a", "hold")], start_new_session=True)
    expect_line(a)
    assert ledger(loop_dir)["runs"][0]["ended_ms"] is None  # its start is recorded before the command
    os.killpg(a.pid, signal.SIGKILL)  # the host dies: looplock and its job
    a.wait(timeout=TIMEOUT)
    i = run(["--inspect", loop_dir])
    assert f"pid {a.pid} " in i.stdout and "its looplock is dead (this host): the slot runs again" in i.stdout, i.stdout
    r = run([*once(loop_dir, "60s", "tick", "-w", "20"), *tick(history, "b")])
    assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["a", "b"]
    entry = ledger(loop_dir)["runs"][0]
    assert entry["pid"] != a.pid and entry["exit_status"] == 0


@pytest.mark.parametrize("policy", [["-w", "0.3"], ["-p", "single_flight"]])
def test_a_looplock_killed_while_its_job_holds_on_never_uses_up_the_slot(loop_dir, policy):
    """looplock alone is killed; a process of its job (here a background
    sleep, which outlives the job's shell) keeps the lock through the
    inherited descriptor. The slot's run has not recorded its end, and its
    looplock is proven dead (this host, this boot, its pid gone): a later
    run of the slot, even single_flight, waits past its deadline for the
    lock, names the process that holds it (never the dead looplock), and
    runs the slot once that process has gone."""
    a = start([*once(loop_dir), "sh", "-c", "echo $$; sleep 60 & echo $!; wait"])
    job = None
    b = None
    try:
        shell = int(a.stdout.readline())
        job = int(a.stdout.readline())
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=TIMEOUT)
        # The job's shell dies of its parent-death signal a moment after
        # looplock (on a busy machine, a moment that can be seen): only then
        # does the sleep alone hold the lock.
        wait_until(lambda: not running(shell), "the job's shell to die with its looplock")
        b = start(["-v", *once(loop_dir, "60s", "tick", *policy), "echo", "ran"])
        (line,) = [x for x in expect_stderr(b, "waiting past the deadline") if "waiting past the deadline" in x]
        assert "has not recorded its end" in line and "that run's looplock is dead" in line, line
        held_by = line.split(" is held by ", 1)[1]
        assert held_by.startswith(f"pid {job} (sleep)"), line
        assert f"looplock pid {a.pid} " in held_by and "which has exited" in held_by, line
        kill_and_wait_gone(job)
        job = None
        out, err = b.communicate(timeout=TIMEOUT)
        assert (b.returncode, out) == (0, "ran\n"), err
        assert "noop-already-run" not in err
    finally:
        if job:
            kill_and_wait_gone(job)
        for p in (a, b):
            if p and p.poll() is None:
                p.kill()
            if p:
                p.wait(timeout=TIMEOUT)


@pytest.mark.parametrize("status", [0, 3])
def test_a_run_that_ended_counts_however_it_ended(loop_dir, tmp_path, status):
    history = tmp_path / "history"
    r = run([*once(loop_dir), "sh", "-c", f"exit {status}"])
    assert r.returncode == status
    assert ledger(loop_dir)["runs"][0]["exit_status"] == status
    r = run([*once(loop_dir), *tick(history, "b")])
    assert r.returncode == 0 and f"with status {status}" in r.stderr
    assert ticks(history) == []


def test_a_command_that_cannot_run_has_had_its_slot(loop_dir, tmp_path):
    r = run([*once(loop_dir), str(tmp_path / "no-such-command")])
    assert r.returncode == EX_NOTFOUND
    assert ledger(loop_dir)["runs"][0]["exit_status"] == EX_NOTFOUND
    r = run([*once(loop_dir), "true"])
    assert r.returncode == 0 and "with status 127" in r.stderr


def test_max_time_ending_the_run_counts_with_124(loop_dir):
    r = run(["--max-time", "0.2s", *once(loop_dir), "sleep", "10"])
    assert r.returncode == 124
    assert ledger(loop_dir)["runs"][0]["exit_status"] == 124


def test_a_ledger_that_cannot_be_written_fails_the_run_with_73_before_the_command(tmp_path, tmpfs):
    history = tmp_path / "history"

    def prepare(mnt):  # a lock file, no ledger, then read-only
        (mnt / "loop").mkdir()
        (mnt / "loop" / ".state.lock").touch()

    loop_dir = tmpfs(prepare=prepare, ro=True) / "loop"
    r = run([*once(loop_dir), *tick(history, "a")])
    assert r.returncode == EX_CANTCREAT, r.stderr
    assert "cannot write the run ledger" in r.stderr and "the command did not run" in r.stderr
    assert ticks(history) == []


def test_an_unsafe_ledger_is_refused_like_an_unsafe_lock_file(loop_dir, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (loop_dir / RUNS).symlink_to(target)
    r = run([*once(loop_dir), "true"])
    assert r.returncode == EX_CANTCREAT
    assert "unsafe run ledger" in r.stderr
    assert target.read_text() == "{}"


@pytest.mark.parametrize("kind", ["symlink", "fifo", "other_owner", "hard_link"])
def test_inspect_warns_of_a_ledger_every_run_refuses_and_check_fails(loop_dir, tmp_path, kind):
    """What every --once-per run refuses (73, event unsafe_run_ledger, a
    hint about the run ledger), --inspect shows as a warning with the fix,
    and --check fails on it."""
    path = loop_dir / RUNS
    if kind == "symlink":
        (tmp_path / "elsewhere.json").write_text("{}")
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hard_link":
        path.write_text("{}")
        os.link(path, tmp_path / "other-name")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the ledger to another user")
        path.write_text("{}")
        os.chown(path, 12345, 12345)
    r = run(["--log-format", "json", *once(loop_dir), "true"])
    assert r.returncode == EX_CANTCREAT, r.stderr
    line = json.loads(r.stderr.splitlines()[-1])
    assert line["event"] == "unsafe_run_ledger" and "unsafe run ledger" in line["message"], line
    assert "lock file" not in line["hint"] and "lock file" not in line["message"], line
    i = run(["--inspect", "--check", "--json", loop_dir])
    assert i.returncode == 1, (i.stdout, i.stderr)
    (w,) = [x for x in json.loads(i.stdout)["warnings"] if RUNS in x]
    assert "every --once-per run refuses it (exit 73)" in w, w
    t = run(["--inspect", loop_dir])
    assert f"warning   {loop_dir}/{RUNS}: every --once-per run refuses it" in t.stdout, t.stdout


def test_a_torn_ledger_blocks_nothing_it_is_reported_and_rewritten(loop_dir, tmp_path):
    """What a crash mid-write can leave: the ledger is rewritten in place,
    so half of it (its check then fails); a stray new file of the rename
    that replaces a ledger this process may not write."""
    history = tmp_path / "history"
    assert run([*once(loop_dir), *tick(history, "a")]).returncode == 0
    first = (loop_dir / RUNS).read_text().split("\n")[0]
    (loop_dir / RUNS).write_text(first[: len(first) // 2])
    (loop_dir / (RUNS + ".new")).write_text(first[:10])
    r = run([*once(loop_dir), *tick(history, "b")])
    assert r.returncode == 0, r.stderr
    assert "is not a run ledger (a write cut short, or another file): no operation's entry counts" in r.stderr
    assert [t[0] for t in ticks(history)] == ["a", "b"]
    assert ledger(loop_dir)["runs"][0]["ended_ms"] is not None
    r = run([*once(loop_dir), *tick(history, "c")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr


def test_a_name_that_is_not_utf8_has_its_slot_and_evicts_nobody(loop_dir, tmp_path):
    """--operation $'tick\\xff' is stored whole (operation_bytes, in hex):
    it finds its own entry, and its runs do not pile up entries that push
    another operation's out of the ledger."""
    history = tmp_path / "history"
    bad = os.fsdecode(b"tick\xff")  # surrogate-escaped: passed on as the raw byte
    assert run([*once(loop_dir, "60s", "good"), *tick(history, "good")]).returncode == 0
    for i in range(70):
        r = run([*once(loop_dir, "60s", bad), *tick(history, f"bad{i}")])
        assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["good", "bad0"]
    r = run([*once(loop_dir, "60s", bad), "true"])
    assert "noop-already-run: tick\\xff already ran" in r.stderr, r.stderr  # the byte shown, never written raw
    r = run([*once(loop_dir, "60s", "good"), *tick(history, "good2")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr, r.stderr
    runs = ledger(loop_dir)["runs"]
    assert len(runs) == 2, runs
    (b,) = [e for e in runs if e["operation"] != "good"]
    assert b["operation_bytes"] == "7469636bff" and b["operation"] == "tick\ufffd"


def test_operations_inside_their_slots_are_never_evicted_the_ledger_grows_and_says_so(loop_dir, tmp_path):
    history = tmp_path / "history"
    assert run([*once(loop_dir, "60s", "good"), *tick(history, "good")]).returncode == 0
    warned = []
    for i in range(70):
        r = run([*once(loop_dir, "60s", f"op{i}"), "true"])
        assert r.returncode == 0, r.stderr
        mine = [line for line in r.stderr.splitlines() if "more than 64" in line]
        assert len(mine) <= 1, r.stderr  # said once a run, at its start
        warned += mine
    assert warned and "operations inside their --once-per slots" in warned[-1], warned
    r = run([*once(loop_dir, "60s", "good"), *tick(history, "good2")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr, r.stderr
    assert [t[0] for t in ticks(history)] == ["good"]
    assert len(ledger(loop_dir)["runs"]) == 71


def test_a_looplock_killed_between_reserving_and_writing_the_ledger_leaves_it_whole(loop_dir, tmp_path):
    """The ledger's new length is reserved before it is rewritten: a KILL in
    between (strace holds looplock right after the reservation) leaves
    every other operation's entry as it was."""
    if not shutil.which("strace") or platform.machine() != "x86_64":
        pytest.skip("strace(1) on x86_64 is needed to stop looplock between the reservation and the write")
    for op in ("a", "b", "c"):
        assert run([*once(loop_dir, "5m", op), "true"]).returncode == 0
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fallocate", "-e",
                               "inject=fallocate:delay_exit=5000000", LOOPLOCK, *once(loop_dir, "5m", "new-" + "n" * 200),
                               "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # strace's child is looplock once it has exec'd it (a busy machine
        # can show the child before that, or a helper of strace's): the pid
        # whose executable is looplock, and that pid inside fallocate(2).
        looplock_exe = os.path.realpath(LOOPLOCK)

        def in_fallocate():
            for pid in children(tracer.pid):
                try:
                    if os.readlink(f"/proc/{pid}/exe") != looplock_exe:
                        continue
                    with open(f"/proc/{pid}/syscall") as f:
                        if f.read().split()[0] == "285":  # x86_64's fallocate
                            return pid
                except (OSError, IndexError):
                    continue
            return None

        wait_until(in_fallocate, "looplock to reserve the ledger's new length", timeout=TIMEOUT)
        traced = in_fallocate()
        assert traced, "looplock left fallocate(2) within its 5 s delay"
        os.kill(traced, signal.SIGKILL)
        tracer.wait(timeout=TIMEOUT)
    finally:
        if tracer.poll() is None:
            tracer.kill()
            tracer.wait(timeout=TIMEOUT)
    for op in ("a", "b", "c"):
        r = run([*once(loop_dir, "5m", op), "echo", "ran"])
        assert (r.returncode, r.stdout) == (0, ""), r
        assert "noop-already-run" in r.stderr and "damaged" not in r.stderr, r.stderr


def test_once_per_refuses_an_operation_name_over_256_bytes(loop_dir):
    r = run([*once(loop_dir, "60s", "é" * 128 + "x"), "true"])  # 257 bytes
    assert r.returncode == 64, r.stderr
    assert "--once-per needs an operation name of at most 256 bytes (257 given)" in r.stderr
    assert run([*once(loop_dir, "60s", "é" * 128), "true"]).returncode == 0


def test_a_full_disk_leaves_the_ledger_whole_and_the_run_exits_73_before_its_command(tmp_path, tmpfs):
    """The ledger's new copy goes beside its newest one, its length reserved
    first: ENOSPC changes nothing, so no operation loses its slot."""
    mnt = tmpfs(size="256k")
    d = mnt / "loop"
    d.mkdir()
    history = tmp_path / "history"
    # Three operations run; then their ledger is one copy at the file's
    # start, padded to end 100 bytes short of a page: the next copy, one
    # entry more, must go after it and needs a page more.
    ops = [f"op{i:02}-" + "o" * 40 for i in range(3)]
    for op in ops:
        assert run([*once(d, "60s", op), "true"]).returncode == 0
    text = sealed(ledger(d))
    (d / RUNS).write_text(text[:-1] + " " * (4096 - 100 - len(text)) + "\n")
    before = (d / RUNS).read_bytes()
    filler = fill_disk(mnt)
    r = run([*once(d, "60s", "op-new-" + "n" * 200), *tick(history, "new")])
    assert r.returncode == EX_CANTCREAT, r.stderr
    assert "No space left on device" in r.stderr and "the ledger was left as it was" in r.stderr, r.stderr
    assert ticks(history) == []
    assert (d / RUNS).read_bytes() == before
    for op in ops:
        r = run([*once(d, "60s", op), "true"])
        assert r.returncode == 0 and "noop-already-run" in r.stderr and "damaged" not in r.stderr, r.stderr
    filler.unlink()
    assert run([*once(d, "60s", "op-new-" + "n" * 200), *tick(history, "new")]).returncode == 0
    assert [t[0] for t in ticks(history)] == ["new"]


@pytest.mark.parametrize("how", ["fsize", "crash"])
def test_a_ledger_write_cut_short_by_anything_leaves_every_other_entry_as_it_was(loop_dir, tmp_path, how):
    """The file keeps two sealed copies and a write never touches the newest
    valid one: a write cut short by RLIMIT_FSIZE (EFBIG after a partial
    write, where the space reservation does not help) or by a crash
    mid-write (simulated: the other copy overwritten with half a ledger)
    leaves the 24 operations' slots as they were."""
    ops = [f"operation-{i:02}-" + "x" * 200 for i in range(24)]
    # The first entry's slot (1 s) is over once the others have run: its
    # next run rewrites the ledger from its first bytes.
    assert run([*once(loop_dir, "1s", "first"), "true"]).returncode == 0
    for op in ops:
        assert run([*once(loop_dir, "5m", op), "true"]).returncode == 0
    assert (loop_dir / RUNS).stat().st_size > 12000
    assert ledger(loop_dir)["runs"][0]["operation"] == "first"
    history = tmp_path / "history"
    if how == "fsize":
        if not shutil.which("prlimit"):
            pytest.skip("prlimit(1) is needed")
        wait_until(lambda: time.time() * 1000 - ledger(loop_dir)["runs"][0]["started_ms"] > 1500,
                   "the first entry's slot to be over")
        r = subprocess.run(["prlimit", "--fsize=4096", LOOPLOCK, *once(loop_dir, "1s", "first"),
                            *tick(history, "first")], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == EX_CANTCREAT, r.stderr
        assert "cannot write the run ledger" in r.stderr and "File too large" in r.stderr, r.stderr
        assert ticks(history) == []
    else:
        raw = (loop_dir / RUNS).read_bytes()
        lines = raw.split(b"\n")
        newest = ledger(loop_dir)["generation"]
        # The older copies' lines cut in half, as a crash mid-write leaves one.
        older = [i for i, line in enumerate(lines[:-1]) if b'"generation":%d,' % newest not in line]
        assert older
        for i in older:
            lines[i] = lines[i][: len(lines[i]) // 2] + b" " * (len(lines[i]) - len(lines[i]) // 2)
        (loop_dir / RUNS).write_bytes(b"\n".join(lines))
    for op in ops:
        r = run([*once(loop_dir, "5m", op), "echo", "ran"])
        assert (r.returncode, r.stdout) == (0, ""), r
        assert "noop-already-run" in r.stderr and "damaged" not in r.stderr, r.stderr
    r = run([*once(loop_dir, "5m", "new-one"), *tick(history, "new")])
    assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["new"]
    assert {e["operation"] for e in ledger(loop_dir)["runs"]} == {"first", *ops, "new-one"}


@pytest.mark.parametrize("ledger_first", [True, False], ids=["ledger", "no-ledger"])
def test_runs_nested_in_one_holder_never_lose_each_others_ledger_entries(loop_dir, tmp_path, ledger_first):
    """Nested runs share their holder's lock, so their ledger writes are
    serialised by a lock on the ledger itself: 30 at once, each of its own
    operation, all end up in it, also when the ledger is missing at first
    (the first of them makes it, empty, to lock it: before, its first
    writers each made it by a rename, unguarded, and one of 16 could exit
    73 when another's rename took its new file away)."""
    if ledger_first:
        assert run([*once(loop_dir, "5m", "first"), "true"]).returncode == 0
    script = ("for i in $(seq 30); do \"$0\" --once-per 5m --operation nested-$i \"$1\" -- true & done; wait")
    r = run([loop_dir, "--", "sh", "-c", script, LOOPLOCK, loop_dir], timeout=120)
    assert r.returncode == 0, r.stderr
    ops = {e["operation"] for e in ledger(loop_dir)["runs"]}
    assert ops == {*(["first"] if ledger_first else []), *(f"nested-{i}" for i in range(1, 31))}, sorted(ops)


def test_a_run_nested_in_the_holder_of_a_slots_running_run_skips_it(loop_dir, tmp_path):
    """Nested runs share their holder's lock, so none waits for another: a
    nested run that finds its operation's slot taken by a run that is on
    now (started, no end, its looplock alive here) skips (0,
    noop-already-run, running_now), as a run that waited for the lock
    would once that run ended. Before, it ran the operation a second time,
    at once."""
    history = tmp_path / "history"
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    # The first nested run's command says "ready" and waits on the gate; the
    # outer command then (on the test's word) starts the second nested run.
    script = ('"$0" --once-per 5m --operation op "$1" -- sh -c \'echo first >> "$1"; echo ready; read x < "$2"\' '
              'sh "$2" "$3" & read x; '
              '"$0" --log-format json --once-per 5m --operation op "$1" -- sh -c \'echo second >> "$1"\' sh "$2"; '
              'echo "second=$?"; wait')
    outer = start([loop_dir, "--", "sh", "-c", script, LOOPLOCK, loop_dir, history, gate])
    try:
        assert outer.stdout.readline() == "ready\n", outer.stderr.read()
        outer.stdin.write("x\n")
        outer.stdin.flush()
        assert outer.stdout.readline() == "second=0\n", outer.stderr.read()
        with open(gate, "w") as g:
            g.write("go\n")
        outer.stdin.close()
        assert outer.wait(timeout=TIMEOUT) == 0, outer.stderr.read()
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait(timeout=TIMEOUT)
    assert history.read_text() == "first\n"
    lines = [json.loads(x) for x in outer.stderr.read().splitlines() if x.startswith("{")]
    (line,) = [x for x in lines if x.get("event") == "noop-already-run"]
    assert line["running_now"] is True and "the same holder as this run" in line["message"], line
    assert line["last_run"]["ended_ms"] is None, line


def test_nested_runs_of_one_operation_at_once_run_it_once_in_its_slot(loop_dir, tmp_path):
    """16 nested runs of 4 operations, all at once, inside one holder: each
    operation runs once (its look and its record are one step under the
    ledger's lock). Before, each ran 4 times."""
    history = tmp_path / "history"
    script = ('for i in $(seq 16); do "$0" -q --once-per 5m --operation op$((i % 4)) "$1" -- '
              'sh -c \'echo "$0" >> "$1"; sleep 0.2\' op$((i % 4)) "$2" & done; wait')
    r = run([loop_dir, "--", "sh", "-c", script, LOOPLOCK, loop_dir, history], timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(history.read_text().split()) == ["op0", "op1", "op2", "op3"]


def sealed(obj):
    """A ledger's text as looplock writes it: the object, its "check" last
    (the first 16 hex digits of the SHA-256 of the text before it)."""
    body = json.dumps(obj, separators=(",", ":"))[:-1]
    return body + ',"check":"' + hashlib.sha256(body.encode()).hexdigest()[:16] + '"}\n'


def write_entry(loop_dir, started_ms, ended=True, host="h2"):
    entry = {"operation": "tick", "host": host, "pid": 4242, "agent_id": "cron",
             "started_at": "2026-01-01T00:00:00.000Z", "started_ms": started_ms,
             "ended_at": None, "ended_ms": started_ms + 100 if ended else None, "exit_status": 0 if ended else None}
    (loop_dir / RUNS).write_text(sealed({"schema": "looplock_runs_v0", "runs": [entry]}))


def test_a_start_in_the_future_counts_within_duration_with_a_warning_and_beyond_it_does_not_count(loop_dir, tmp_path):
    history = tmp_path / "history"
    now = int(time.time() * 1000)
    write_entry(loop_dir, now + 20_000)  # another host's clock, 20 s ahead
    r = run([*once(loop_dir, "60s"), *tick(history, "a")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr
    assert "the hosts' clocks differ" in r.stderr and "it counts" in r.stderr
    write_entry(loop_dir, now + 600_000)  # 10 min ahead: beyond --once-per
    r = run([*once(loop_dir, "60s"), *tick(history, "b")])
    assert r.returncode == 0, r.stderr
    assert "it does not count" in r.stderr
    assert [t[0] for t in ticks(history)] == ["b"]
    # An entry of this very host: its own clock was set back, no other host's.
    write_entry(loop_dir, now + 20_000, host=socket.gethostname())
    r = run([*once(loop_dir, "60s"), *tick(history, "c")])
    assert r.returncode == 0 and "noop-already-run" in r.stderr
    assert "this host's clock was set back by about" in r.stderr and "hosts' clocks" not in r.stderr, r.stderr


def test_a_start_without_an_end_under_the_lock_is_a_crashed_run_and_does_not_count(loop_dir, tmp_path):
    history = tmp_path / "history"
    write_entry(loop_dir, int(time.time() * 1000) - 1000, ended=False)
    r = run([*once(loop_dir), *tick(history, "a")])
    assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["a"]


def test_nested_once_per_uses_the_local_ledger_under_the_outer_lock(loop_dir, tmp_path):
    history = tmp_path / "history"
    inner = [LOOPLOCK, "--once-per", "60s", "--operation", "inner", "--jitter", "60s", str(loop_dir), "--",
             PY, TICK, str(history), "inner"]
    t0 = time.monotonic()
    for _ in range(2):
        r = run(["--operation", "outer", str(loop_dir), "--", *inner])
        assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20  # nested: no --jitter
    assert [t[0] for t in ticks(history)] == ["inner"]
    assert [e["operation"] for e in ledger(loop_dir)["runs"]] == ["inner"]
    # Nested in its own operation, the outer's slot is its own: it runs, and records nothing.
    same = [LOOPLOCK, "--once-per", "60s", "--operation", "outer", str(loop_dir), "--", PY, TICK, str(history), "same"]
    r = run(["--operation", "outer", str(loop_dir), "--", *same])
    assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["inner", "same"]
    assert [e["operation"] for e in ledger(loop_dir)["runs"]] == ["inner"]


def test_inspect_shows_the_last_run_of_each_operation(loop_dir, tmp_path):
    assert run([*once(loop_dir, "60s", "tick"), "true"]).returncode == 0
    assert run([*once(loop_dir, "60s", "gate"), "sh", "-c", "exit 2"]).returncode == 2
    r = run(["--inspect", loop_dir])
    assert r.returncode == 0, r.stderr
    runs = [line for line in r.stdout.splitlines() if line.startswith("last run")]
    assert len(runs) == 2, r.stdout
    assert any("status 2" in line for line in runs)
    j = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    entry = j[0] if isinstance(j, list) else j
    got = {e["operation"]: e for e in entry["runs"]}
    assert set(got) == {"tick", "gate"}
    assert got["gate"]["exit_status"] == 2 and got["tick"]["host"] == os.uname().nodename


# --- --jitter ---------------------------------------------------------------


def test_jitter_stays_within_its_bound_and_says_how_long_with_v(loop_dir):
    waited = []
    for _ in range(4):
        t0 = time.monotonic()
        r = run(["-v", "--log-format", "json", "--jitter", "0.4s", str(loop_dir), "--", "true"])
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        line = next(json.loads(x) for x in r.stderr.splitlines() if '"jitter"' in x)
        assert 0 <= line["jitter_ms"] < 400
        assert took >= line["jitter_ms"] / 1000
        waited.append(line["jitter_ms"])
    assert len(set(waited)) > 1  # random, not a constant


def test_jitter_is_outside_the_deadline_and_the_wait_metric(loop_dir, tmp_path, holders):
    h = holders(loop_dir)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    r = run(["-v", "--log-format", "json", "--metrics-dir", metrics, "--jitter", "1s", "-w", "0.3", str(loop_dir),
             "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    jitter = next(json.loads(x) for x in r.stderr.splitlines() if '"jitter"' in x)["jitter_ms"]
    row = incident_rows(loop_dir)[0]
    assert 250 <= row["waited_ms"] < 1000 and row["deadline_ms"] == 300
    prom = next(metrics.glob("*.prom")).read_text()
    wait = float(next(line.split()[-1] for line in prom.splitlines() if line.startswith("looplock_last_wait_seconds")))
    assert 0.25 <= wait < 1.0, (wait, jitter)
    h.release()


def test_a_signal_during_the_jitter_ends_the_run_as_during_a_wait(loop_dir, tmp_path):
    # --jitter's bound, 24h: a wait drawn shorter than the moment from its
    # start to the signal has odds of about one in ten million (with 60s and
    # a fixed 0.3 s pause, one in two hundred runs drew a wait that was over
    # before the signal came).
    p = start(["-v", "--jitter", "24h", str(loop_dir), "--", "touch", str(tmp_path / "ran")])
    wait_until(lambda: proc_state(p.pid) == "S", "looplock to sleep out its --jitter")  # its first sleep
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=TIMEOUT)
    assert p.returncode == -signal.SIGTERM
    assert not (tmp_path / "ran").exists()
    assert incident_rows(loop_dir) == []


# --- the job's deadline ------------------------------------------------------


def test_the_command_gets_looplock_deadline_with_max_time_and_never_a_stale_one(loop_dir):
    show = [PY, "-c", "import os; print(os.environ.get('LOOPLOCK_DEADLINE', 'none'))"]
    before = time.time()
    r = run(["--max-time", "30s", str(loop_dir), "--", *show])
    after = time.time()
    value = r.stdout.strip()
    assert value.count(".") == 1 and len(value.split(".")[1]) == 3, value
    assert before + 30 - 1 <= float(value) <= after + 30 + 1
    # A value no live looplock set is removed: stale (an expired deadline
    # copied into a cron line), malformed, or owned by a process that is not
    # a live ancestor with that start time.
    for env in ({"LOOPLOCK_DEADLINE": "1700000000.000"}, {"LOOPLOCK_DEADLINE": "1796000000.500"},
                {"LOOPLOCK_DEADLINE": "soon"},
                {"LOOPLOCK_DEADLINE": "1796000000.500", "LOOPLOCK_DEADLINE_OWNER": f"{os.getpid()}:1"},
                {"LOOPLOCK_DEADLINE": "1796000000.500", "LOOPLOCK_DEADLINE_OWNER": "999999999:5"}):
        r = run([str(loop_dir), "--", *show], env=env)
        assert (r.returncode, r.stdout.strip()) == (0, "none"), (env, r.stderr)
    # Owned by a live ancestor (this test, with its real start time): kept,
    # even when it has passed.
    with open(f"/proc/{os.getpid()}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    r = run([str(loop_dir), "--", *show],
            env={"LOOPLOCK_DEADLINE": "1700000000.000", "LOOPLOCK_DEADLINE_OWNER": f"{os.getpid()}:{start}"})
    assert r.stdout.strip() == "1700000000.000", r.stderr
    # Without --max-time a nested looplock passes its outer looplock's on.
    inner = [LOOPLOCK, "--operation", "inner", str(loop_dir), "--", *show]
    r = run(["--max-time", "30s", "--operation", "outer", str(loop_dir), "--", *inner])
    assert abs(float(r.stdout.strip()) - (time.time() + 30)) < 5, r.stdout
    # Nested: the earlier of its own and the inherited one.
    inner = [LOOPLOCK, "--max-time", "60s", "--operation", "inner", str(loop_dir), "--", *show]
    r = run(["--max-time", "30s", "--operation", "outer", str(loop_dir), "--", *inner])
    assert float(r.stdout.strip()) <= time.time() + 31
    inner = [LOOPLOCK, "--max-time", "5s", "--operation", "inner", str(loop_dir), "--", *show]
    r = run(["--max-time", "30s", "--operation", "outer", str(loop_dir), "--", *inner])
    assert float(r.stdout.strip()) <= time.time() + 6


def test_a_detached_grandchild_of_a_max_time_run_starts_a_later_run_without_its_deadline(loop_dir, tmp_path):
    """The deadline holds only while its looplock lives: a process that the
    job left behind (setsid) and that starts another, non-nested looplock
    after the first has exited does not pass that deadline on."""
    other = tmp_path / "other"
    other.mkdir()
    out = tmp_path / "seen"
    show = f"import os; open({str(out)!r}, 'w').write(os.environ.get('LOOPLOCK_DEADLINE', 'none'))"
    # The grandchild lets go of the test's pipes (so that the first looplock
    # is reaped), waits until that looplock has gone, then runs.
    script = ('exec >/dev/null 2>&1; while kill -0 "$LOOPLOCK_HOLDER_PID" 2>/dev/null; do sleep 0.01; done; '
              f'exec "$0" "$1" -- {PY} -c "$2"')
    r = run(["-o", "--max-time", "30s", str(loop_dir), "--", "setsid", "-f", "sh", "-c", script, LOOPLOCK,
             str(other), show])
    assert r.returncode == 0, r.stderr
    wait_until(lambda: out.exists() and out.read_text(), "the grandchild's run")
    assert out.read_text() == "none"


def test_a_tick_warned_before_max_time_checkpoints_and_finishes_cleanly(loop_dir, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    p = start(["--max-time", "3s", "--warn-before", "2s", str(loop_dir), "--", PY, CHECKPOINT, str(checkpoint)])
    expect_line(p)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err
    warned = [line for line in out.splitlines() if line.startswith("warned")]
    assert len(warned) == 1, out
    _, after_ms, left_ms = warned[0].split()
    assert 700 <= int(after_ms) < 3000  # about 1 s in: 2 s before --max-time's TERM
    assert 0 < int(left_ms) <= 3000
    assert "checkpointed" in out and int(checkpoint.read_text()) > 0
    assert "sent USR1 to the job" in err and "--max-time's TERM comes in" in err
    assert incident_rows(loop_dir) == []


def test_the_warning_comes_once_before_term_and_is_in_the_max_time_row(loop_dir, tmp_path):
    p = start(["--max-time", "1.5s", "--warn-before", "1s", "--warn-signal", "USR1", str(loop_dir), "--", PY,
               CHECKPOINT, str(tmp_path / "c"), "ignore"])
    expect_line(p)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 124, err
    lines = [line.split()[0] for line in out.splitlines()]
    assert lines == ["warned", "term"], out
    assert out.splitlines()[-1] == "term 1"  # one warning, then TERM
    row = incident_rows(loop_dir)[0]
    assert row["error_code"] == "max_time_exceeded"
    assert row["warned"]["signal"] == "USR1" and row["warned"]["before_end_ms"] >= 300
    r = run(["-q", "--max-time", "1s", "--warn-before", "0.5s", str(loop_dir), "--", PY, CHECKPOINT,
             str(tmp_path / "d")])
    assert r.returncode == 0 and "sent USR1" not in r.stderr  # -q hides the warning's line


# --- the warning reaches only what handles it ---------------------------------

WARN_TIMES = helper("warn_times.py")
WARN_GROUP = helper("warn_group.py")
WARNED_TICK = Path(__file__).resolve().parents[2] / "examples" / "python" / "warned_tick.py"


def test_a_shell_running_the_tick_is_not_ended_by_the_warning(loop_dir):
    """-c 'python3 warned_tick.py ...; echo done': the shell does not catch
    USR1 (its default action would end it, and looplock with it, 138, while
    Python goes on holding the lock). Only Python gets it: it checkpoints,
    the shell goes on to echo, and the run exits 0."""
    r = subprocess.run([LOOPLOCK, "--max-time", "3s", "--warn-before", "2s", str(loop_dir), "-c",
                        f"{PY} {WARNED_TICK} {loop_dir} 400 0.05; echo done"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("checkpointed at item ") and lines[-1] == "done", r.stdout
    (warned,) = [line for line in r.stderr.splitlines() if "(--warn-before)" in line]
    assert "sent USR1 to the job: to pid " in warned and ", which catches it (skipped pid " in warned, warned
    assert "lock_leaked" not in r.stderr and incident_rows(loop_dir) == []


def test_the_warning_goes_to_each_process_that_catches_it_and_skips_ignoring_and_blocking_ones(loop_dir):
    p = start(["--log-format", "json", "--max-time", "2s", "--warn-before", "1s", str(loop_dir), "--", PY, WARN_GROUP])
    pids = {}
    for _ in range(3):
        line = p.stdout.readline().split()
        assert line[0] == "ready", line
        pids[line[1]] = int(line[2])
    expect_line(p)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 124, err
    assert out.splitlines().count("usr1 catcher") == 1, out
    # The blocker never had one pending: it was not sent it.
    assert "term blocker 0" in out.splitlines() and "term ignorer 0" in out.splitlines(), out
    (warned,) = [json.loads(line) for line in err.splitlines() if json.loads(line)["event"] == "warned"]
    assert warned["pids"] == [pids["catcher"]], warned
    # Skipped: the ignorer, the blocker, and the job's first process (the
    # parent, which keeps USR1's default action).
    assert len(warned["skipped"]) == 3 and {pids["ignorer"], pids["blocker"]} < set(warned["skipped"]), warned
    row = incident_rows(loop_dir)[-1]
    assert row["error_code"] == "max_time_exceeded"
    assert row["warned"]["pids"] == [pids["catcher"]] and len(row["warned"]["skipped"]) == 3, row


def test_a_process_that_installs_its_handler_late_still_gets_the_warning_once(loop_dir):
    p = start(["--max-time", "4s", "--warn-before", "3s", str(loop_dir), "--", PY, WARN_TIMES, "1.5"])
    expect_line(p)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 124, err  # it survived the warning: ended by --max-time's TERM
    kinds = [line.split()[0] for line in out.splitlines()]
    assert kinds == ["handlers", "usr1", "term"], out
    (warned,) = [line for line in err.splitlines() if "(--warn-before)" in line]
    assert "to no process yet: none catches it" in warned and "it goes to any that catches it before the TERM" in warned


def test_the_warning_reaches_the_job_of_a_nested_looplock(loop_dir):
    """A nested looplock runs its command in a process group of its own: the
    warning reaches what that command runs too (a nested looplock does not
    catch USR1 itself, and is skipped)."""
    # The warning comes 3 s in: a nested looplock and Python start well before
    # then even on a busy machine (1 s was not always enough under load).
    p = start(["--max-time", "5s", "--warn-before", "2s", str(loop_dir), "--", LOOPLOCK, str(loop_dir), "--", PY,
               WARN_TIMES])
    expect_line(p)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 124, err
    assert [line.split()[0] for line in out.splitlines()] == ["usr1", "term"], out
    (warned,) = [line for line in err.splitlines() if "(--warn-before)" in line]
    assert ", which catches it (skipped pid " in warned, warned


def test_without_proc_no_warning_is_sent_and_looplock_says_so(loop_dir):
    need_no_proc()
    r = subprocess.run([*NO_PROC, LOOPLOCK, "--max-time", "2s", "--warn-before", "1s", str(loop_dir), "--", PY,
                        WARN_TIMES], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 124, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["ready", "term"], r.stdout
    assert "did not send USR1: without /proc of this pid namespace" in r.stderr, r.stderr
