"""--holders N (looplock-sharing(7), HOLDERS): up to N runs hold the lock at once,
each under its own index; an exclusive holder of .state.lock (a plain
looplock, flock(1), Python's fcntl.flock) excludes all of them. Real
looplock processes and real holders, and a history of who ran when,
checked afterwards."""
import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, LOOPLOCK, NO_PROC, PY, TIMEOUT, expect_line, expect_stderr, flock_holder, helper,
                      incident_rows, kill_and_wait_gone, need_no_proc, release, run, start)

TICK = helper("holder_tick.py")
WAIT = helper("wait_stdin.py")


def history_of(path):
    """[(kind, label, index, ns)] in time order."""
    p = Path(path)
    rows = [line.split() for line in p.read_text().splitlines()] if p.exists() else []
    return sorted(((k, lab, idx, int(ns)) for k, lab, idx, ns in rows), key=lambda r: r[3])


def most_at_once(history):
    """The most runs inside at once, and whether an exclusive run ("x...")
    was ever inside beside another run."""
    inside, most, mixed = set(), 0, False
    for kind, label, _, _ in history:
        if kind == "start":
            inside.add(label)
            most = max(most, len(inside))
            if len(inside) > 1 and any(lab.startswith("x") for lab in inside):
                mixed = True
        else:
            inside.discard(label)
    return most, mixed


def indexes_inside(history):
    """Each start's index, checked unique among the runs inside then."""
    inside = {}
    for kind, label, idx, _ in history:
        if kind == "start":
            assert idx not in inside.values(), f"index {idx} taken twice: {history}"
            inside[label] = idx
        else:
            inside.pop(label, None)


def burst(loop_dir, history, n, runs, barrier, extra=()):
    procs = [start(["--holders", str(n), "-p", "blocking", *extra, loop_dir, "--", PY, TICK, history, f"h{i}",
                    str(barrier), str(n + 1)], stdin=subprocess.DEVNULL) for i in range(runs)]
    return [(p.wait(timeout=60), p.stderr.read()) for p in procs]


def test_never_more_than_n_at_once_and_n_reached(loop_dir, tmp_path):
    history = tmp_path / "history"
    ends = burst(loop_dir, history, 3, 8, barrier=3)
    assert [s for s, _ in ends] == [0] * 8, ends
    h = history_of(history)
    assert len(h) == 16
    assert most_at_once(h) == (3, False)
    indexes_inside(h)
    assert {idx for _, _, idx, _ in h} <= {"0", "1", "2"}
    assert sorted(p.name for p in loop_dir.glob(".state.lock.holders.*")) == [f".state.lock.holders.{k}" for k in range(3)]


def test_the_control_without_a_lock_has_them_all_inside_at_once(tmp_path):
    """The history check can fail: unlocked, the same burst is all inside."""
    history = tmp_path / "history"
    procs = [subprocess.Popen([PY, TICK, history, f"h{i}", "8"]) for i in range(8)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 8
    assert most_at_once(history_of(history))[0] == 8


def test_runs_with_different_n_are_bounded_by_the_largest(loop_dir, tmp_path):
    history = tmp_path / "history"
    procs = [start(["--holders", str(2 if i % 2 else 4), "-p", "blocking", loop_dir, "--", PY, TICK, history,
                    f"h{i}", "4"], stdin=subprocess.DEVNULL) for i in range(8)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 8
    h = history_of(history)
    most, _ = most_at_once(h)
    assert 2 <= most <= 4
    indexes_inside(h)


def test_an_exclusive_run_never_runs_beside_a_holder(loop_dir, tmp_path):
    """Exclusive users: a plain looplock run and flock(1) on the lock file."""
    history = tmp_path / "history"
    procs = []
    for i in range(9):
        if i == 2:
            procs.append(subprocess.Popen(["flock", str(loop_dir / ".state.lock"), PY, TICK, str(history), f"x{i}",
                                           "1", "2"], stdin=subprocess.DEVNULL))
            continue
        if i % 3 == 2:
            args = ["-p", "blocking", loop_dir, "--", PY, TICK, history, f"x{i}", "1", "2"]
        else:
            args = ["--holders", "2", "-p", "blocking", loop_dir, "--", PY, TICK, history, f"h{i}", "2", "3"]
        procs.append(start(args, stdin=subprocess.DEVNULL))
    assert [p.wait(timeout=90) for p in procs] == [0] * 9
    h = history_of(history)
    assert len(h) == 18
    most, mixed = most_at_once(h)
    assert not mixed, h
    assert most <= 2


def test_a_flock_holder_excludes_every_holder_and_is_excluded_by_any(loop_dir, tmp_path):
    lock = loop_dir / ".state.lock"
    f = flock_holder(lock)
    try:
        r = run(["--holders", "3", "-w", "0.3", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL, r.stderr
        assert "lock_acquire_timeout" in r.stderr and "(flock)" in r.stderr
        # It let go of its index when it gave up.
        r = run(["--holders", "3", "-n", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
    finally:
        release(f)
    h = start(["--holders", "3", loop_dir, "--", PY, WAIT])
    try:
        expect_line(h, "ready")
        assert subprocess.run(["flock", "-n", str(lock), "true"], timeout=TIMEOUT).returncode == 1
        # Python's fcntl.flock, as the loop scripts take it, is refused too.
        probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
                 "try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError: sys.exit(3)")
        assert subprocess.run([PY, "-c", probe, str(lock)], timeout=TIMEOUT).returncode == 3
        # Another holder comes in beside it.
        r = run(["--holders", "3", "-n", loop_dir, "--", "sh", "-c", "echo $LOOPLOCK_HOLDER_INDEX"])
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
    finally:
        h.stdin.close()
        assert h.wait(timeout=TIMEOUT) == 0


def test_all_held_the_timeout_row_keeps_holder_and_adds_holders(loop_dir):
    hs = [start(["--holders", "2", "--agent", f"a{i}", "--operation", "deploy", loop_dir, "--", PY, WAIT])
          for i in range(2)]
    try:
        for h in hs:
            expect_line(h, "ready")
        r = run(["--holders", "2", "-w", "0.2", "--log-format", "json", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        line = json.loads(r.stderr.splitlines()[-1])
        assert line["event"] == "lock_acquire_timeout"
        assert "every holder index of" in line["message"] and "(--holders 2) still held after" in line["message"]
        assert [x["index"] for x in line["holders"]] == [0, 1]
        assert sorted(x["holder"]["pid"] for x in line["holders"]) == sorted(h.pid for h in hs)
        assert {x["holder"]["holders"] for x in line["holders"]} == {2}
        row = incident_rows(loop_dir)[-1]
        assert row["error_code"] == "lock_acquire_timeout"
        assert row["holder"]["index"] == 0
        assert sorted(row["holder_pids"]) == sorted(h.pid for h in hs)
        assert [x["index"] for x in row["holders"]] == [0, 1]
        # single_flight: a skip that names them.
        r = run(["--holders", "2", "-p", "single_flight", "--log-format", "json", loop_dir, "--", "true"])
        assert r.returncode == 0
        skip = json.loads(r.stderr.splitlines()[-1])
        assert skip["event"] == "noop-locked" and len(skip["holders"]) == 2
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)


def test_an_exclusive_run_blocked_by_holders_names_them_from_their_index_records(loop_dir):
    """A run without --holders that finds the lock held by --holders holders
    names them by the records they wrote in their index files (text and
    row), not as readers without a record."""
    hs = [start(["--holders", "3", "--agent", f"a{i}", "--operation", "deploy", loop_dir, "--", PY, WAIT])
          for i in range(2)]
    try:
        for h in hs:
            expect_line(h, "ready")
        r = run(["-w", "0.2", "--operation", "tick", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        assert "readers write no holder record" not in r.stderr, r.stderr
        assert "agent a0, operation deploy" in r.stderr and "agent a1, operation deploy" in r.stderr, r.stderr
        row = incident_rows(loop_dir)[-1]
        assert row["holder"] is not None and row["holder"]["operation"] == "deploy", row
        assert sorted(x["holder"]["pid"] for x in row["holders"]) == sorted(h.pid for h in hs), row
        r = run(["-p", "single_flight", "--log-format", "json", loop_dir, "--", "true"])
        skip = json.loads(r.stderr.splitlines()[-1])
        assert skip["event"] == "noop-locked" and len(skip["holders"]) == 2, skip
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)


def test_each_holder_has_its_record_and_its_index(loop_dir):
    h = start(["--holders", "2", "--operation", "deploy", loop_dir, "--", "sh", "-c",
               'echo "$LOOPLOCK_HOLDER_INDEX"; read x || true'])
    try:
        assert h.stdout.readline() == "0\n"
        rec = json.loads((loop_dir / ".state.lock.holders.0").read_text())
        assert (rec["pid"], rec["holders"], rec["index"], rec["released_at"]) == (h.pid, 2, 0, None)
        r = run(["--holders", "2", loop_dir, "--", "sh", "-c", 'echo "$LOOPLOCK_HOLDER_INDEX"'])
        assert r.stdout == "1\n"
        rec1 = json.loads((loop_dir / ".state.lock.holders.1").read_text())
        assert rec1["index"] == 1 and rec1["released_at"]
        # The exclusive record in the lock file is not touched by holders.
        assert (loop_dir / ".state.lock").read_text() == ""
    finally:
        h.stdin.close()
        assert h.wait(timeout=TIMEOUT) == 0
    assert json.loads((loop_dir / ".state.lock.holders.0").read_text())["released_at"]
    # Without --holders the variable is not passed on from outside.
    r = run([loop_dir, "--", "sh", "-c", 'echo "${LOOPLOCK_HOLDER_INDEX-unset}"'],
            env={"LOOPLOCK_HOLDER_INDEX": "7"})
    assert r.stdout == "unset\n"


def test_a_killed_holder_frees_its_index_for_a_waiter(loop_dir):
    hs = []
    for _ in range(2):  # one after the other: index 0, then 1
        hs.append(start(["--holders", "2", loop_dir, "--", PY, WAIT]))
        expect_line(hs[-1], "ready")
    waiter = start(["--holders", "2", "-p", "blocking", "-v", loop_dir, "--", "sh", "-c",
                    'echo "got $LOOPLOCK_HOLDER_INDEX"'])
    try:
        expect_stderr(waiter, "waiting for one of the 2 holders")
        os.kill(hs[1].pid, signal.SIGKILL)
        hs[1].wait(timeout=TIMEOUT)
        out, _ = waiter.communicate(timeout=TIMEOUT)
        assert waiter.returncode == 0 and out == "got 1\n"
    finally:
        for h in hs:
            if h.poll() is None:
                h.stdin.close()
                h.wait(timeout=TIMEOUT)


def test_an_exclusive_lock_inside_a_holder_fails_at_once(loop_dir):
    for outer in (["--holders", "2"], ["--holders", "2", "-o"], ["-s"]):
        r = run([*outer, loop_dir, "--", LOOPLOCK, "-p", "blocking", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL, (outer, r.stderr)
        assert "so the lock would wait for its own holder" in r.stderr
    # -E is its status too, so that a caller tells it from a command's 75.
    r = run(["--holders", "2", loop_dir, "--", LOOPLOCK, "-E", "9", loop_dir, "--", "true"])
    assert r.returncode == 9 and "nested_in_shared" not in r.stdout, r.stderr
    # A nested holder runs inside the outer one's critical section.
    r = run(["--holders", "2", loop_dir, "--", LOOPLOCK, "--holders", "2", "-v", loop_dir, "--", "sh", "-c",
             'echo "$LOOPLOCK_HOLDER_INDEX"'])
    assert r.returncode == 0 and r.stdout == "0\n" and "running inside its critical section" in r.stderr
    # The scripts' own lock says so too, instead of waiting for its parent.
    lib = Path(__file__).resolve().parents[2] / "examples" / "python" / "loop_lock.py"
    r = run(["--holders", "2", loop_dir, "--", PY, lib, loop_dir])
    assert r.returncode == 1 and "inside holder 0 of `looplock --holders`" in r.stderr


def test_usage_errors():
    for args, says in ((["--holders", "1"], "expected a number from 2 to 1024"),
                       (["--holders", "2", "-s"], "cannot be combined"),
                       (["--holders", "2", "-x"], "cannot be combined"),
                       (["--holders", "2", "--once-per", "5m", "--operation", "t"], "cannot be combined"),
                       (["--holders", "2", "-F"], "drop -F")):
        r = run([*args, "/tmp", "--", "true"])
        assert r.returncode == 64 and says in r.stderr, (args, r.stderr)


def test_inspect_shows_each_index_and_warns_when_holders_disagree_on_n(loop_dir):
    hs = []
    for n, op in (("2", "deploy"), ("3", "migrate")):
        hs.append(start(["--holders", n, "--operation", op, loop_dir, "--", PY, WAIT]))
        expect_line(hs[-1], "ready")
    try:
        report = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
        idx = report["holder_indexes"]
        assert [(x["index"], x["held"], x["holder_pids"]) for x in idx] == \
            [(0, True, [hs[0].pid]), (1, True, [hs[1].pid])]  # index 2 not reached: not made
        assert idx[1]["record"]["holders"] == 3 and idx[1]["record_status"] == "current"
        assert any("the holders disagree on N" in w for w in report["warnings"])
        assert report["kernel"]["mode"] == "shared"
        text = run(["--inspect", loop_dir]).stdout
        assert "2 of 2 index files held (--holders)" in text
        assert f"index 1: pid {hs[1].pid} (agent" in text and "--holders 3" in text
        assert run(["--inspect", "--check", loop_dir]).returncode == 1
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)
    report = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    assert [x["held"] for x in report["holder_indexes"]] == [False] * 2
    assert report["holder_indexes"][0]["record"]["released_at"]
    assert report["warnings"] == []


def test_an_unsafe_index_file_is_refused_and_inspect_says_so(loop_dir, tmp_path):
    os.symlink(tmp_path / "elsewhere", loop_dir / ".state.lock.holders.0")
    r = run(["--holders", "2", loop_dir, "--", "true"])
    assert r.returncode == 73 and "unsafe holder index" in r.stderr and "symbolic link" in r.stderr
    assert not (tmp_path / "elsewhere").exists()
    os.mkfifo(loop_dir / ".state.lock.holders.1")  # never opened, by a run or by --inspect
    report = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    for k in (0, 1):
        assert any(f".state.lock.holders.{k}" in w and "refuses it (exit 73)" in w for w in report["warnings"])
    assert [x["held"] for x in report["holder_indexes"]] == [False, False]


def lingers(until):
    """A shell word list: one process (no children) that lives until `until` exists."""
    code = f"import os, time\nwhile not os.path.exists({str(until)!r}): time.sleep(0.02)"
    return f"{PY} -c {shlex.quote(code)} >/dev/null 2>&1"


def test_what_a_job_leaves_running_keeps_its_index_so_never_more_than_n(loop_dir, tmp_path):
    """The index descriptor goes with the lock's: a leftover of the job holds
    both, and the next runs do not count it out."""
    leftover = tmp_path / "leftover"
    # The job leaves one process that keeps what it inherited until `leftover` exists.
    r = run(["--holders", "2", loop_dir, "--", "sh", "-c", f'{lingers(leftover)} & echo "$LOOPLOCK_HOLDER_INDEX"'])
    left = int(re.search(r"the command exited, but pid (\d+) that it started still holds", r.stderr).group(1))
    try:
        assert r.returncode == 0 and r.stdout == "0\n"
        # Index 0 is still held by the leftover: the next two runs take 1, then find none.
        r1 = run(["--holders", "2", "-n", loop_dir, "--", "sh", "-c", 'echo "$LOOPLOCK_HOLDER_INDEX"'])
        assert (r1.returncode, r1.stdout) == (0, "1\n"), r1.stderr
        h = start(["--holders", "2", loop_dir, "--", PY, WAIT])
        expect_line(h, "ready")
        r2 = run(["--holders", "2", "-n", loop_dir, "--", "echo", "third"])
        assert (r2.returncode, r2.stdout) == (EX_TEMPFAIL, ""), r2.stderr
        h.stdin.close()
        assert h.wait(timeout=TIMEOUT) == 0
    finally:
        leftover.touch()
        kill_and_wait_gone(left)
    # With -o the job inherits neither: its leftover keeps nothing.
    later = tmp_path / "later"
    try:
        r = run(["--holders", "2", "-o", loop_dir, "--", "sh", "-c", f"{lingers(later)} &"])
        assert r.returncode == 0 and "still holds" not in r.stderr
        r1 = run(["--holders", "2", "-n", loop_dir, "--", "sh", "-c", 'echo "$LOOPLOCK_HOLDER_INDEX"'])
        assert r1.stdout == "0\n", r1.stderr
    finally:
        later.touch()


def test_an_exclusive_holder_that_keeps_holders_waiting_is_the_one_named(loop_dir):
    f = flock_holder(loop_dir / ".state.lock")
    parked = []
    try:
        for _ in range(2):  # they take an index each, then wait for .state.lock
            parked.append(start(["--holders", "2", "-p", "blocking", "-v", loop_dir, "--", "true"]))
            expect_stderr(parked[-1], "waiting for")
        r = run(["--holders", "2", "-w", "0.3", "--log-format", "json", loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        line = json.loads(r.stderr.splitlines()[-1])
        assert line["holder_pids"] == [f.pid], line
        assert "(flock)" in line["message"] and "holders" not in line
    finally:
        release(f)
        for p in parked:
            assert p.wait(timeout=TIMEOUT) == 0


def test_sigalrm_is_absorbed_while_a_timed_run_waits_for_an_index(loop_dir):
    hs = []
    for _ in range(2):
        hs.append(start(["--holders", "2", loop_dir, "--", PY, WAIT]))
        expect_line(hs[-1], "ready")
    try:
        w = start(["--holders", "2", "-w", "1.5", "-v", loop_dir, "--", "true"])
        expect_stderr(w, "waiting for one of the 2 holders")
        os.kill(w.pid, signal.SIGALRM)
        assert w.wait(timeout=TIMEOUT) == EX_TEMPFAIL  # its deadline, not the signal
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)


def test_too_many_index_files_for_the_open_file_limit_says_how_to_fix_it(loop_dir):
    """All 70 held (by one process, as flock(2) allows): a run under a
    limit of 64 descriptors cannot keep them open while it waits."""
    code = ("import fcntl, os, sys\n"
            "fds = [os.open(os.path.join(sys.argv[1], f'.state.lock.holders.{k}'), os.O_RDWR | os.O_CREAT, 0o660)"
            " for k in range(70)]\n"
            "[fcntl.flock(fd, fcntl.LOCK_EX) for fd in fds]\nprint('ready', flush=True)\nsys.stdin.read()")
    h = subprocess.Popen([PY, "-c", code, str(loop_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        expect_line(h, "ready")
        r = subprocess.run(["sh", "-c", 'ulimit -n 64; exec "$0" --holders 70 -w 1 "$1" -- true', LOOPLOCK,
                            str(loop_dir)], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 71, r.stderr
        assert "Too many open files" in r.stderr and "raise the open-file limit (ulimit -n) above 102" in r.stderr
    finally:
        h.stdin.close()
        h.wait(timeout=TIMEOUT)
    # Free, a run opens index 0 alone, whatever N.
    r = subprocess.run(["sh", "-c", 'ulimit -n 64; exec "$0" --holders 1000 "$1" -- true', LOOPLOCK, str(loop_dir)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr


def test_without_proc_a_nested_holder_fails_at_once_instead_of_taking_an_index(loop_dir):
    """Without /proc the outer holder cannot be confirmed: before, the inner
    run took a second index, and waited forever when none was free."""
    need_no_proc()
    outer = start(["--holders", "2", loop_dir, "--", PY, WAIT])  # index 0; the nested run's outer takes 1
    try:
        expect_line(outer, "ready")
        inner = [LOOPLOCK, "--holders", "2", "-p", "blocking", str(loop_dir), "--", "echo", "inner ran"]
        r = subprocess.run([*NO_PROC, LOOPLOCK, "--holders", "2", str(loop_dir), "--", *inner], capture_output=True,
                           text=True, timeout=TIMEOUT)
        assert r.returncode == EX_TEMPFAIL and r.stdout == "", r.stderr
        assert "cannot tell whether this command runs inside holder 1 of" in r.stderr
    finally:
        outer.stdin.close()
        outer.wait(timeout=TIMEOUT)


def test_a_leftover_that_keeps_only_the_index_is_named(loop_dir, tmp_path):
    """The job closes $LOOPLOCK_FD, as the man page lets it, then leaves a
    process behind: it keeps the index, and the run says so."""
    gone = tmp_path / "gone"
    r = run(["--holders", "2", loop_dir, "--", "sh", "-c", f'eval "exec $LOOPLOCK_FD>&-"; {lingers(gone)} &'])
    try:
        assert r.returncode == 0, r.stderr
        m = re.search(r"the command exited, but pid (\d+) that it started still holds (\S+) through the inherited "
                      r"descriptor: that index stays taken", r.stderr)
        assert m and m.group(2).endswith(".state.lock.holders.0"), r.stderr
        r1 = run(["--holders", "2", loop_dir, "--", "sh", "-c", 'echo "$LOOPLOCK_HOLDER_INDEX"'])
        assert r1.stdout == "1\n"
    finally:
        gone.touch()
        if m:
            kill_and_wait_gone(int(m.group(1)))


def test_an_index_file_deleted_while_held_is_reported(loop_dir):
    r = run(["--holders", "2", "--log-format", "json", loop_dir, "--", "sh", "-c",
             'rm "$LOOPLOCK_DIR/.state.lock.holders.$LOOPLOCK_HOLDER_INDEX"'])
    assert r.returncode == 0
    events = [json.loads(line)["event"] for line in r.stderr.splitlines()]
    assert "holder_index_replaced" in events, r.stderr


@pytest.mark.parametrize("outer", [["--holders", "2"], ["-s"]])
def test_without_proc_an_exclusive_run_inside_a_shared_holder_fails_at_once(loop_dir, outer):
    """Before, without /proc it waited for its own holder (forever with -p blocking)."""
    need_no_proc()
    inner = [LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "echo", "inner ran"]
    r = subprocess.run([*NO_PROC, LOOPLOCK, *outer, str(loop_dir), "--", *inner], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == EX_TEMPFAIL and r.stdout == "", r.stderr
    assert "so the lock would wait for its own holder" in r.stderr


def test_inspect_warns_of_an_index_a_leftover_keeps(loop_dir, tmp_path):
    gone = tmp_path / "gone"
    r = run(["--holders", "2", loop_dir, "--", "sh", "-c", f'eval "exec $LOOPLOCK_FD>&-"; {lingers(gone)} &'])
    left = re.search(r"but pid (\d+) that it started", r.stderr)
    try:
        assert left, r.stderr
        report = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
        assert any(".state.lock.holders.0 is held by" in w and "places stays taken" in w for w in report["warnings"])
        assert run(["--inspect", "--check", loop_dir]).returncode == 1
    finally:
        gone.touch()
        if left:
            kill_and_wait_gone(int(left.group(1)))
