"""A hold across steps (looplock-sharing(7), HOLD ACROSS STEPS): `looplock --hold`
takes the lock in a detached holder and prints LOOPLOCK_HOLD=VALUE; later
steps with the value run inside it, others wait; --release, --max-time,
--tied-to and --release --force end it. Real processes and real holders
(flock(1), Python's fcntl.flock); every hold a test takes is killed by its
pid afterwards, and every wait is bounded."""
import fcntl
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import blocked_waiters
from conftest import fill_disk
from conftest import (EX_OSERR, EX_TEMPFAIL, EX_USAGE, LOOPLOCK, PY, ROOT, TIMEOUT, expect_line, flock_holder,
                      helper, incident_rows, lock_is_free, read_record, release, run, running, start, wait_until)

EX_MAX_TIME = 124
NO_SUCH_HOLD = 1


def value_of(stdout):
    """The value of the one LOOPLOCK_HOLD=VALUE line --hold prints."""
    lines = stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("LOOPLOCK_HOLD="), stdout
    return lines[0].split("=", 1)[1]


def holder_pid(value):
    return int(value.split(":", 1)[0])


@pytest.fixture
def holds():
    """Takes holds (`looplock --hold ARGS`); each holder still running at the
    end of the test is killed by its pid."""
    taken = []

    def take(*args, env=None):
        r = run(["--hold", *args], env=env)
        if r.returncode == 0:
            taken.append(holder_pid(value_of(r.stdout)))
        return r

    yield take
    for pid in taken:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def step(value, *args, **kw):
    """A later step: looplock with the hold's value in its environment."""
    return run(list(args), env={"LOOPLOCK_HOLD": value}, **kw)


def unheld_env():
    env = dict(os.environ)
    env.pop("LOOPLOCK_HOLD", None)
    return env


def test_a_hold_is_held_from_one_step_to_another_and_released(holds, loop_dir, tmp_path):
    history = tmp_path / "history"
    r = holds("--max-time", "2m", loop_dir)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    value = value_of(r.stdout)
    pid = holder_pid(value)
    # --hold has returned (its output closed: nothing of the holder keeps it)
    # and the lock stays held, by that process.
    assert running(pid)
    assert not lock_is_free(loop_dir)
    rec = read_record(loop_dir)
    assert (rec["pid"], rec["operation"], rec["released_at"]) == (pid, "hold", None)
    assert rec["hold"]["tied_to"] is None and len(rec["hold"]["secret_sha256"]) == 64
    assert value.split(":")[2] not in (loop_dir / ".state.lock").read_text()  # the secret is never written

    # A later step with the value runs at once, inside the hold...
    s = step(value, "-v", loop_dir, "--", PY, "-c", f"open({str(history)!r}, 'a').write('step\\n')")
    assert s.returncode == 0, s.stderr
    assert "already held by the hold $LOOPLOCK_HOLD names" in s.stderr
    # ... while one without it, and flock(1), wait and give up.
    s = run(["-w", "0.3", loop_dir, "--", PY, "-c", f"open({str(history)!r}, 'a').write('other\\n')"],
            env=unheld_env())
    assert s.returncode == EX_TEMPFAIL, s.stderr
    assert "operation hold" in s.stderr
    assert subprocess.run(["flock", "-n", loop_dir / ".state.lock", "true"], timeout=TIMEOUT).returncode == 1
    assert history.read_text() == "step\n"

    rel = step(value, "--release")
    assert (rel.returncode, rel.stdout, rel.stderr) == (0, "", "")
    assert not running(pid)
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is not None
    # Released already: no such hold.
    rel = run(["--release", value])
    assert rel.returncode == NO_SUCH_HOLD
    assert "has ended" in rel.stderr


def test_the_holder_is_detached(holds, loop_dir, tmp_path):
    """Its own session, stdio on /dev/null, working directory /: a CI step
    that reads --hold's output until its end is never kept waiting."""
    r = holds("--max-time", "2m", loop_dir)
    pid = holder_pid(value_of(r.stdout))
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    assert int(fields[3]) == pid  # session id: it leads a session of its own
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    for fd in (0, 1, 2):
        assert os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/null"
    assert run(["--release", value_of(r.stdout)]).returncode == 0


def test_a_relative_dir_is_the_same_lock_for_the_holder(holds, loop_dir):
    r = run(["--hold", "--max-time", "2m", loop_dir.name], cwd=loop_dir.parent)
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    assert read_record(loop_dir)["pid"] == holder_pid(value)
    assert step(value, "--release").returncode == 0


def test_a_hold_waits_under_its_policy_and_prints_nothing_when_its_deadline_passes(holds, loop_dir):
    f = flock_holder(loop_dir / ".state.lock")
    try:
        r = holds("--max-time", "2m", "-w", "0.3", loop_dir)
        assert (r.returncode, r.stdout) == (EX_TEMPFAIL, "")
        assert "lock_acquire_timeout" in r.stderr
        r = holds("--max-time", "2m", "-w", "0.3", "-E", "9", loop_dir)
        assert (r.returncode, r.stdout) == (9, "")
    finally:
        release(f)
    rows = incident_rows(loop_dir)
    assert [row["waiter"]["operation"] for row in rows] == ["hold", "hold"]


def test_a_hold_waits_for_the_holder_then_holds(holds, loop_dir):
    f = flock_holder(loop_dir / ".state.lock")
    p = start(["--hold", "--max-time", "2m", "-p", "blocking", loop_dir])
    try:
        wait_until(lambda: p.pid in blocked_or_children(loop_dir, p.pid), "the hold to wait")
        assert p.poll() is None
    finally:
        release(f)
    out, err = p.communicate(timeout=TIMEOUT)
    assert p.returncode == 0, err
    value = value_of(out)
    assert run(["--release", value]).returncode == 0


def blocked_or_children(loop_dir, caller):
    """The caller's pid when its holder (its child) is blocked on the lock."""
    from conftest import blocked_waiters, children
    return {caller} if set(children(caller)) & blocked_waiters(loop_dir / ".state.lock") else set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_waiting_caller_ends_its_holder_too(loop_dir, sig):
    """Nobody would know the hold's value: it must never hold the lock later."""
    from conftest import children
    f = flock_holder(loop_dir / ".state.lock")
    p = start(["--hold", "--max-time", "2m", "-p", "blocking", loop_dir])
    try:
        wait_until(lambda: blocked_or_children(loop_dir, p.pid), "the hold to wait")
        kids = children(p.pid)
        p.send_signal(sig)
        p.communicate(timeout=TIMEOUT)
        assert p.returncode == 128 + sig
        for k in kids:
            wait_until(lambda: not running(k), f"holder {k} to end")
    finally:
        release(f)
    assert lock_is_free(loop_dir)


def test_a_killed_caller_leaves_no_hold_behind(loop_dir):
    """KILLed while its holder waits: the holder gets the lock, cannot report
    it (EPIPE), and lets it go."""
    from conftest import children
    f = flock_holder(loop_dir / ".state.lock")
    p = start(["--hold", "--max-time", "2m", "-p", "blocking", loop_dir])
    try:
        wait_until(lambda: blocked_or_children(loop_dir, p.pid), "the hold to wait")
        kids = children(p.pid)
        p.kill()
        p.wait(timeout=TIMEOUT)  # its holder still has the caller's stderr: no communicate()
    finally:
        release(f)
    for k in kids:
        wait_until(lambda: not running(k), f"holder {k} to end", timeout=TIMEOUT)
    assert lock_is_free(loop_dir)


def test_tied_to_ends_the_hold_when_that_process_is_killed(holds, loop_dir):
    tie = subprocess.Popen(["sleep", "300"])
    try:
        r = holds("--max-time", "2m", "--tied-to", str(tie.pid), loop_dir)
        assert r.returncode == 0, r.stderr
        value = value_of(r.stdout)
        pid = holder_pid(value)
        assert read_record(loop_dir)["hold"]["tied_to"] == tie.pid
        assert not lock_is_free(loop_dir)
        tie.kill()
        tie.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(pid), "the tied hold to end")
    finally:
        if tie.poll() is None:
            tie.kill()
            tie.wait(timeout=TIMEOUT)
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is not None
    rel = run(["--release", value])
    assert rel.returncode == NO_SUCH_HOLD, rel.stderr


def test_warn_before_in_a_step_warns_before_the_holds_end(holds, loop_dir, tmp_path):
    """A step inside a hold may give --warn-before without a --max-time of
    its own: the hold's end is its --max-time."""
    value = value_of(holds("--max-time", "3s", loop_dir).stdout)
    got = tmp_path / "warned"
    s = step(value, "--warn-before", "2s", loop_dir, "--", PY, "-c",
             f"import signal, time\n"
             f"signal.signal(signal.SIGUSR1, lambda *a: open({str(got)!r}, 'w').write('usr1'))\n"
             f"time.sleep(30)")
    assert s.returncode == EX_MAX_TIME, s.stderr
    assert got.read_text() == "usr1"


def test_a_tie_that_ends_while_a_step_runs_ends_the_step_as_max_time_would(holds, loop_dir, tmp_path):
    """The hold's tie ends while a step runs: the step's command is sent
    TERM as at --max-time (124, max_time_exceeded, a hold_ended warning),
    and the lock is free once it has ended. Before, the step ran on."""
    tie = subprocess.Popen(["sleep", "300"])
    try:
        r = holds("--max-time", "2m", "--tied-to", str(tie.pid), loop_dir)
        assert r.returncode == 0, r.stderr
        value = value_of(r.stdout)
        s = subprocess.Popen([LOOPLOCK, str(loop_dir), "--", "sh", "-c", "echo ready; exec sleep 60"],
                             env={**os.environ, "LOOPLOCK_HOLD": value}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert s.stdout.readline() == "ready\n", s.stderr.read()
        tie.kill()
        tie.wait(timeout=TIMEOUT)
        assert s.wait(timeout=TIMEOUT) == EX_MAX_TIME, s.stderr.read()
        err = s.stderr.read()
        assert "the hold this run runs inside has ended (the process it is tied to ended)" in err, err
        assert "max_time_exceeded" in err and "ran when the hold it ran inside ended" in err, err
        assert "The hold ended first: it was not hung" in err and "why it hung" not in err, err
    finally:
        if tie.poll() is None:
            tie.kill()
            tie.wait(timeout=TIMEOUT)
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")


def test_release_while_a_step_runs_names_the_step_that_still_holds_the_lock(holds, loop_dir):
    """--release while a step runs answers at once (0) and names, in its
    line and in JSON, the step's looplock that still holds the lock; the
    step runs on to its end and the lock is free after it."""
    r = holds("--max-time", "2m", loop_dir)
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    s = subprocess.Popen([LOOPLOCK, str(loop_dir), "--", "sh", "-c", "echo ready; read line; echo done"],
                         env={**os.environ, "LOOPLOCK_HOLD": value}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert s.stdout.readline() == "ready\n", s.stderr.read()
        rel = run(["--release", "--log-format", "json", value])
        assert rel.returncode == 0, rel.stderr
        lines = [json.loads(x) for x in rel.stderr.splitlines()]
        warn = next(x for x in lines if x.get("event") == "hold_steps_running")
        assert s.pid in warn["holder_pids"], warn
        # The step's looplock and its command (which holds the lock through the inherited descriptor).
        assert f"steps that run inside it (pid {s.pid} (looplock), pid " in warn["message"], warn
        assert " (sh)) still hold the lock" in warn["message"], warn
        assert not lock_is_free(loop_dir)
        # As documented, not a fault: --inspect --check passes meanwhile
        # (before: a warning that the kernel names an exited pid, exit 1).
        holder = holder_pid(value)
        wait_until(lambda: not running(holder), "the hold's looplock to end")
        i = run(["--inspect", "--check", loop_dir])
        assert i.returncode == 0, i.stdout
        s.stdin.write("go\n")
        s.stdin.close()
        assert s.wait(timeout=TIMEOUT) == 0, s.stderr.read()
    finally:
        if s.poll() is None:
            s.kill()
            s.wait(timeout=TIMEOUT)
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")


# Run by PY with the lock dir and looplock: a subreaper (as a container's
# PID 1 that never reaps), so that the holder it KILLs stays a zombie; a
# step inside the hold waits on stdin meanwhile. Prints --release's status
# and stderr, then --inspect's lines, as JSON.
KILLED_HOLDER = r"""
import ctypes, json, os, signal, subprocess, sys, time
loop_dir, looplock = sys.argv[1], sys.argv[2]
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
r = subprocess.run([looplock, "--hold", "--max-time", "2m", loop_dir], capture_output=True, text=True, timeout=60)
value = r.stdout.strip().split("=", 1)[1]
holder = int(value.split(":", 1)[0])
env = {**os.environ, "LOOPLOCK_HOLD": value}
step = subprocess.Popen([looplock, loop_dir, "--", "sh", "-c", "echo ready; read x"], env=env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert step.stdout.readline() == "ready\n"
os.kill(holder, signal.SIGKILL)
while open(f"/proc/{holder}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.001)
rel = subprocess.run([looplock, "--release"], env=env, capture_output=True, text=True, timeout=60)
ins = subprocess.run([looplock, "--inspect", loop_dir], capture_output=True, text=True, timeout=60)
step.stdin.write("x\n")
step.stdin.close()
step.wait(timeout=60)
os.waitpid(holder, 0)
print(json.dumps({"status": rel.returncode, "stderr": rel.stderr, "inspect": ins.stdout, "step": step.pid}))
"""


def test_release_of_a_killed_holder_with_a_step_running_says_no_such_hold(loop_dir):
    """The holder KILLed while a step runs, and not reaped (a container's
    PID 1 that never reaps keeps it a zombie): --release says there is no
    such hold (1), naming the steps that still hold the lock, and --inspect
    shows it was a hold, held now by its steps. Before, --release said
    "released the hold" (0), and --inspect showed the hold as live and
    blamed a background process started without -o."""
    r = subprocess.run([PY, "-c", KILLED_HOLDER, str(loop_dir), LOOPLOCK], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["status"] == NO_SUCH_HOLD, got["stderr"]
    assert "has ended without its row (killed)" in got["stderr"], got["stderr"]
    assert f"steps that ran inside it (pid {got['step']} (looplock)" in got["stderr"], got["stderr"]
    assert "hold      was a hold (looplock --hold)" in got["inspect"], got["inspect"]
    assert "they are the steps of the hold that pid" in got["inspect"], got["inspect"]
    assert "without -o" not in got["inspect"], got["inspect"]
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")


def test_max_time_ends_the_hold_and_release_says_124(holds, loop_dir):
    r = holds("--max-time", "1s", loop_dir)
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    pid = holder_pid(value)
    wait_until(lambda: not running(pid), "--max-time to end the hold", timeout=TIMEOUT)
    assert lock_is_free(loop_dir)
    row = incident_rows(loop_dir)[-1]
    assert (row["error_code"], row["holder"]["pid"], row["holder"]["operation"]) == ("max_time_exceeded", pid, "hold")
    rel = run(["--release", value])
    assert rel.returncode == EX_MAX_TIME
    assert "had already ended: --max-time passed" in rel.stderr


def test_the_holds_max_time_ends_a_step_that_runs_at_its_end_as_the_steps_own_would(holds, loop_dir, tmp_path):
    """A step that runs when the hold's --max-time comes is ended with it
    (TERM, exit 124, max_time_exceeded), as by its own --max-time; its
    LOOPLOCK_DEADLINE says so. Before, it ran on past the hold's end."""
    r = holds("--max-time", "2s", loop_dir)
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    out = tmp_path / "deadline"
    s = step(value, loop_dir, "--", "sh", "-c", f'echo "$LOOPLOCK_DEADLINE" > {out}; sleep 20')
    assert s.returncode == EX_MAX_TIME, s.stderr
    assert "max_time_exceeded" in s.stderr and "ran until the hold's --max-time (its end at " in s.stderr, s.stderr
    assert out.read_text().strip(), "no LOOPLOCK_DEADLINE"
    # A step whose own --max-time comes first keeps it.
    r = holds("--max-time", "1m", loop_dir)
    value = value_of(r.stdout)
    s = step(value, "--max-time", "0.5", loop_dir, "--", "sleep", "20")
    assert s.returncode == EX_MAX_TIME and "--max-time 500ms" in s.stderr, s.stderr
    assert run(["--release", value]).returncode == 0


def test_release_force_ends_a_hold_the_kernel_confirms(holds, loop_dir):
    r = holds("--max-time", "2m", loop_dir)
    pid = holder_pid(value_of(r.stdout))
    rel = run(["--release", "--force", loop_dir], env=unheld_env())
    assert (rel.returncode, rel.stderr) == (0, "")
    assert not running(pid)
    assert lock_is_free(loop_dir)
    rel = run(["--release", "--force", loop_dir])
    assert rel.returncode == NO_SUCH_HOLD
    assert "names no current holder" in rel.stderr


def test_release_force_never_ends_a_run_or_a_process_a_forged_record_names(loop_dir):
    # A run holds the lock: not a hold.
    p = start([loop_dir, "--", PY, helper("wait_stdin.py")], stdin=subprocess.PIPE)
    expect_line(p)
    rel = run(["--release", "--force", loop_dir])
    assert rel.returncode == NO_SUCH_HOLD
    assert "is held by a run, not by a hold" in rel.stderr
    assert p.poll() is None
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0
    # flock(1) holds it, and a record claims a hold by flock(1)'s pid: the
    # kernel confirms the pid, but it is not looplock.
    f = flock_holder(loop_dir / ".state.lock")
    try:
        rec = read_record(loop_dir)
        stat = Path(f"/proc/{f.pid}/stat").read_text()
        rec.update(pid=f.pid, pid_start=stat[stat.rindex(")") + 2:].split()[19], released_at=None,
                   hold={"tied_to": None, "tied_to_start": "", "ends_at": rec["acquired_at"], "secret_sha256": "0" * 64})
        rec.pop("check", None)
        (loop_dir / ".state.lock").write_text(json.dumps(rec, separators=(",", ":")) + "\n")
        rel = run(["--release", "--force", loop_dir])
        assert rel.returncode == NO_SUCH_HOLD
        assert "is not looplock" in rel.stderr
        assert f.poll() is None
    finally:
        release(f)


def test_a_wrong_or_stale_value_never_bypasses_the_lock(holds, loop_dir, tmp_path):
    history = tmp_path / "history"
    r = holds("--max-time", "2m", loop_dir)
    value = value_of(r.stdout)
    pid, start_time, secret, rest = value.split(":", 3)
    forged = ":".join([pid, start_time, "0" * 32, rest])
    s = step(forged, "-w", "0.3", loop_dir, "--", PY, "-c", f"open({str(history)!r}, 'a').write('forged\\n')")
    assert s.returncode == EX_TEMPFAIL
    assert "hold_not_live" not in s.stderr and "does not match the holder record" in s.stderr
    s = step("not-a-value", "-w", "0.3", loop_dir, "--", "true")
    assert s.returncode == EX_TEMPFAIL
    assert "ignoring $LOOPLOCK_HOLD" in s.stderr
    assert run(["--release", forged]).returncode == NO_SUCH_HOLD
    assert not history.exists()
    assert step(value, "--release").returncode == 0
    # The value of an ended hold: a run takes the lock as any run (a warning).
    s = step(value, loop_dir, "--", PY, "-c", f"open({str(history)!r}, 'a').write('after\\n')")
    assert s.returncode == 0
    assert "has ended" in s.stderr
    assert history.read_text() == "after\n"


def test_a_value_for_another_lock_is_ignored(holds, loop_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    value = value_of(holds("--max-time", "2m", other).stdout)
    s = step(value, loop_dir, "--", "true")
    assert (s.returncode, s.stderr) == (0, "")
    assert step(value, "--release").returncode == 0


def test_inspect_shows_the_hold(holds, loop_dir):
    tie = subprocess.Popen(["sleep", "300"])
    try:
        value = value_of(holds("--max-time", "2m", "--tied-to", str(tie.pid), loop_dir).stdout)
        out = run(["--inspect", loop_dir]).stdout
        hold_line = [line for line in out.splitlines() if line.startswith("hold ")]
        assert hold_line and f"pid {tie.pid} it is tied to" in hold_line[0], out
        assert f"looplock --release --force {loop_dir}" in out
        j = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
        assert j["record"]["holder"]["hold"]["tied_to"] == tie.pid
        assert step(value, "--release").returncode == 0
    finally:
        tie.kill()
        tie.wait(timeout=TIMEOUT)


def test_inspect_check_on_an_old_hold_advises_release_force_not_a_stalled_pid(holds, loop_dir):
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    try:
        check = ["--inspect", "--check", "--stale-after", "0.1", loop_dir]
        wait_until(lambda: run(check).returncode == 1, "the hold to be older than --stale-after")
        out = run(check)
        (warning,) = [line for line in out.stdout.splitlines() if "longer than --stale-after" in line]
        assert f"a hold (looplock --hold) until" in warning and f"looplock --release --force {loop_dir}" in warning
        assert "stalled" not in warning, warning
    finally:
        assert step(value, "--release").returncode == 0


def test_a_second_hold_in_a_job_that_holds_the_lock_is_refused_at_once(holds, loop_dir):
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    try:
        r = run(["--hold", "--max-time", "1m", "-w", "30", loop_dir], env={"LOOPLOCK_HOLD": value})
        assert r.returncode == EX_USAGE, r.stderr
        assert "names a hold of" in r.stderr and "the new hold would wait for it" in r.stderr, r.stderr
        assert r.stdout == ""
    finally:
        assert step(value, "--release").returncode == 0


def test_a_hold_ended_by_its_tie_is_named_so_by_later_steps_and_release(holds, loop_dir):
    tie = subprocess.Popen(["sleep", "300"])
    value = value_of(holds("--max-time", "2m", "--tied-to", str(tie.pid), loop_dir).stdout)
    tie.kill()
    tie.wait(timeout=TIMEOUT)
    wait_until(lambda: not running(holder_pid(value)), "the tied hold to end")
    rel = run(["--release", value])
    assert rel.returncode == NO_SUCH_HOLD
    assert f"the process it was tied to, pid {tie.pid}, has ended" in rel.stderr, rel.stderr
    s = step(value, loop_dir, "--", "true")  # it waits as any run, then runs (its own record replaces the hold's)
    assert s.returncode == 0
    assert f"the process it was tied to, pid {tie.pid}, has ended" in s.stderr, s.stderr


def test_a_hold_inside_a_run_of_the_same_lock_is_refused(loop_dir):
    r = run([loop_dir, "--", LOOPLOCK, "--hold", "--max-time", "1m", loop_dir])
    assert r.returncode == EX_USAGE
    assert "--hold inside a run that holds" in r.stderr


def test_a_read_only_lock_file_fails_the_hold(holds, tmpfs):
    """Later steps confirm a hold by its record: without one it lets go."""
    mnt = tmpfs(prepare=lambda m: (m / "loop").mkdir() or (m / "loop" / ".state.lock").touch(), ro=True)
    r = holds("--max-time", "1m", mnt / "loop")
    assert (r.returncode, r.stdout) == (EX_OSERR, ""), r.stderr
    assert "a hold needs its holder record" in r.stderr
    assert lock_is_free(mnt / "loop")


@pytest.mark.parametrize("args,message", [
    (["--hold", "DIR"], "--hold needs --max-time"),
    (["--hold", "--max-time", "1m", "-p", "single_flight", "DIR"], "-p single_flight cannot be used with --hold"),
    (["--hold", "--max-time", "1m", "-p", "coalesce", "--operation", "t", "DIR"], "-p coalesce cannot be used"),
    (["--hold", "--max-time", "1m", "--once-per", "5m", "DIR"], "--hold and --once-per cannot be combined"),
    (["--hold", "--max-time", "1m", "-s", "DIR"], "--hold and -s/--shared cannot be combined"),
    (["--hold", "--max-time", "1m", "--holders", "2", "DIR"], "--hold and --holders cannot be combined"),
    (["--hold", "--max-time", "1m", "-F", "DIR"], "needs looplock to stay the command's parent"),
    (["--hold", "--max-time", "1m", "--notify", "true", "DIR"], "--hold and --notify cannot be combined"),
    (["--hold", "--max-time", "1m", "DIR", "--", "true"], "--hold takes no command"),
    (["--hold", "--max-time", "1m", "--warn-before", "5s", "DIR"], "--warn-before cannot be used with --hold"),
    (["--hold", "--max-time", "1m", "--tied-to", "0", "DIR"], "--tied-to '0': there is no process 0"),
    (["--hold", "--max-time", "1m", "--tied-to", "x", "DIR"], "invalid --tied-to 'x'"),
    (["--tied-to", "1", "DIR", "--", "true"], "--tied-to only applies to --hold"),
    (["--release", "--force"], "--release --force needs DIR"),
    (["--release", "-w", "1", "x"], "-w/--timeout does not apply to --release"),
    (["--release", "--inspect", "DIR"], "--inspect and --release cannot be combined"),
    (["--force", "DIR", "--", "true"], "--force only applies to --release"),
    (["--release", "garbage"], "not a hold's value"),
])
def test_usage_errors(loop_dir, args, message):
    r = run([str(loop_dir) if a == "DIR" else a for a in args], env=unheld_env())
    assert r.returncode == EX_USAGE, r.stderr
    assert message in r.stderr.splitlines()[0], r.stderr
    assert not (loop_dir / ".state.lock").exists()


def test_release_without_a_value_is_a_usage_error():
    r = subprocess.run([LOOPLOCK, "--release"], env=unheld_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == EX_USAGE
    assert "LOOPLOCK_HOLD is not set" in r.stderr
    r = subprocess.run([LOOPLOCK, "--release"], env={**unheld_env(), "LOOPLOCK_HOLD": ""}, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == EX_USAGE
    assert "LOOPLOCK_HOLD is empty" in r.stderr, r.stderr


def test_tied_to_a_process_that_is_not_there(loop_dir):
    p = subprocess.Popen(["true"])
    p.wait(timeout=TIMEOUT)
    r = run(["--hold", "--max-time", "1m", "--tied-to", str(p.pid), loop_dir])
    assert r.returncode == EX_USAGE
    assert "there is no such process" in r.stderr
    assert lock_is_free(loop_dir)


def test_python_fcntl_flock_is_excluded_by_a_hold(holds, loop_dir):
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    fd = os.open(loop_dir / ".state.lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert step(value, "--release").returncode == 0
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_step_command_holds_the_lock_through_the_holds_descriptor(holds, loop_dir):
    """The loop scripts' own lock (examples/python/loop_lock.py) and flock(1)
    on $LOOPLOCK_FD nest inside a step instead of waiting for the hold."""
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    s = step(value, loop_dir, "--", PY, ROOT / "examples" / "python" / "loop_lock.py", loop_dir, timeout=TIMEOUT)
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith("inherited fd"), s.stdout
    s = step(value, loop_dir, "--", "sh", "-c", 'flock -n "$LOOPLOCK_FD" true && echo ok')
    assert (s.returncode, s.stdout.strip()) == (0, "ok"), s.stderr
    # -o, or a process the descriptor does not reach: the step's own looplock
    # keeps it, and is the ancestor such a process nests under.
    s = step(value, "-o", loop_dir, "--", "sh", "-c",
             f'echo "${{LOOPLOCK_FD:-none}}"; exec {PY} {ROOT / "examples" / "python" / "loop_lock.py"} {loop_dir}')
    assert s.returncode == 0, s.stderr
    assert s.stdout.splitlines()[0] == "none"
    assert s.stdout.splitlines()[1].startswith("held by ancestor pid"), s.stdout
    assert str(holder_pid(value)) not in s.stdout.splitlines()[1]
    assert step(value, "--release").returncode == 0


def test_a_killed_holder_leaves_no_lock_behind(holds, loop_dir):
    """KILL of the holder: its sentinel, which has the lock's descriptor to
    hand to the steps, ends with it."""
    from conftest import children
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    pid = holder_pid(value)
    [sentinel] = children(pid)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not running(sentinel), "the sentinel to end with its holder")
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")
    assert run(["--release", value]).returncode == NO_SUCH_HOLD
    # A step with the value of the killed hold takes the lock as any run.
    s = step(value, "-w", "5", loop_dir, "--", "true")
    assert s.returncode == 0, s.stderr


def test_a_step_right_after_the_hold_gets_its_descriptor(holds, loop_dir):
    """--hold prints the value just before the sentinel listens: a step that
    follows at once waits for it (bounded) rather than run without the
    descriptor."""
    for _ in range(5):
        value = value_of(holds("--max-time", "2m", loop_dir).stdout)
        s = step(value, loop_dir, "--", "sh", "-c", 'echo "${LOOPLOCK_FD:-none}"')
        assert s.returncode == 0 and s.stdout.strip() != "none", s.stderr
        assert "hold_fd_unavailable" not in s.stderr and s.stderr == "", s.stderr
        assert step(value, "--release").returncode == 0


def test_no_line_means_no_hold(holds, loop_dir):
    """A value that cannot be written (a full disk, a closed stdout) ends the
    holder: nobody could release it."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([LOOPLOCK, "--hold", "--max-time", "2m", loop_dir], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=TIMEOUT)
    assert r.returncode == EX_OSERR
    assert "cannot write to standard output" in r.stderr
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is not None


def test_a_tie_that_ends_while_the_hold_waits_means_no_hold(loop_dir):
    """The caller watches the tie while its holder waits: it ends the holder
    at once, while the lock is still busy."""
    tie = subprocess.Popen(["sleep", "300"])
    f = flock_holder(loop_dir / ".state.lock")
    try:
        p = start(["--hold", "--max-time", "2m", "-p", "blocking", "--tied-to", tie.pid, loop_dir])
        wait_until(lambda: blocked_or_children(loop_dir, p.pid), "the hold to wait")
        tie.kill()
        tie.wait(timeout=TIMEOUT)
        out, err = p.communicate(timeout=TIMEOUT)  # flock(1) still holds the lock
        assert (p.returncode, out) == (1, ""), err
        assert "ended while the hold waited for the lock" in err
        assert not blocked_waiters(loop_dir / ".state.lock")
    finally:
        if tie.poll() is None:
            tie.kill()
            tie.wait(timeout=TIMEOUT)
        release(f)
    assert lock_is_free(loop_dir)


def test_tied_to_a_thread_is_refused(loop_dir):
    import threading
    import time
    done = threading.Event()
    t = threading.Thread(target=done.wait, args=(TIMEOUT,))
    t.start()
    try:
        time.sleep(0)  # the thread has its id once started
        r = run(["--hold", "--max-time", "1m", "--tied-to", t.native_id, loop_dir])
    finally:
        done.set()
        t.join(timeout=TIMEOUT)
    assert r.returncode == EX_USAGE, r.stderr
    assert "that is a thread, not a process" in r.stderr
    assert lock_is_free(loop_dir)


@pytest.mark.parametrize("max_time,message", [("0", "--hold needs a --max-time above 0 and below inf"),
                                              ("inf", "--hold needs a --max-time above 0 and below inf"),
                                              ("999ms", "--hold needs a --max-time of at least 1.0s (999ms given)")])
def test_max_time_must_bound_the_hold(loop_dir, max_time, message):
    r = run(["--hold", "--max-time", max_time, loop_dir])
    assert r.returncode == EX_USAGE
    assert message in r.stderr
    assert not (loop_dir / ".state.lock").exists()


def test_on_a_full_disk_release_reads_max_time_from_the_record(holds, tmpfs):
    """No room for the incident row: the record, released at its ends_at,
    still says --max-time ended the hold."""
    mnt = tmpfs(size="64k")
    d = mnt / "loop"
    d.mkdir()
    assert run([d, "--", "true"]).returncode == 0  # the record's room, before the disk is full
    fill_disk(mnt)
    value = value_of(holds("--max-time", "1s", d).stdout)
    wait_until(lambda: not running(holder_pid(value)), "--max-time to end the hold", timeout=TIMEOUT)
    assert not (d / ".state.lock.incidents.jsonl").exists() or incident_rows(d) == []
    rel = run(["--release", value])
    assert rel.returncode == EX_MAX_TIME, rel.stderr
    assert "its incident row could not be read" in rel.stderr


def test_release_by_another_user_says_why(holds, world_dir):
    """Signals reach one's own processes only: 71 with a hint, never 1 (which
    would tell a job that the hold is gone)."""
    value = value_of(holds("--max-time", "2m", world_dir).stdout)
    as_other = ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", LOOPLOCK]
    (world_dir / ".state.lock").chmod(0o644)  # readable: the signal is what fails
    r = subprocess.run([*as_other, "--release", value], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == EX_OSERR, r.stderr
    assert "It runs as uid 0" in r.stderr
    (world_dir / ".state.lock").chmod(0o600)  # unreadable: nothing can be confirmed
    for args in (["--release", value], ["--release", "--force", world_dir]):
        r = subprocess.run([*as_other, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == EX_OSERR, r.stderr
        assert "cannot be read" in r.stderr or "cannot read" in r.stderr, r.stderr
    assert not lock_is_free(world_dir)
    assert step(value, "--release").returncode == 0


@pytest.mark.parametrize("how", ["closed pipe", "closed stdout"])
def test_a_value_nobody_can_read_means_no_hold(loop_dir, how):
    if how == "closed pipe":
        p = subprocess.Popen([LOOPLOCK, "--hold", "--max-time", "2m", "-p", "blocking", loop_dir],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.stdout.close()  # as `| true` does, before the value comes
        err = p.stderr.read()
        rc = p.wait(timeout=TIMEOUT)
    else:
        r = subprocess.run(["sh", "-c", f'exec "{LOOPLOCK}" --hold --max-time 2m "{loop_dir}" <&- >&-'],
                           capture_output=True, text=True, timeout=TIMEOUT)
        rc, err = r.returncode, r.stderr
    assert rc == EX_OSERR, err
    assert "cannot write to standard output" in err and "No hold was kept" in err
    assert lock_is_free(loop_dir)


def test_the_holder_keeps_none_of_the_callers_descriptors(holds, loop_dir):
    """A command substitution that also captures fd 3 still ends at once."""
    r = subprocess.run(["sh", "-c", f'x=$("{LOOPLOCK}" --hold --max-time 2m "{loop_dir}" 3>&1); echo "$x"'],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    value = value_of(r.stdout)
    pid = holder_pid(value)
    fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
    targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds]
    assert not any(t.startswith("pipe:") and fd < 3 for fd, t in zip(fds, targets)), targets
    assert step(value, "--release").returncode == 0


def test_a_step_without_the_holds_descriptor_waits_as_any_run(holds, loop_dir, tmp_path):
    """Only the descriptor proves the lock is held for the step (the hold may
    end between its check and the hand-off): a sentinel that does not answer
    (stopped here) makes the step wait, never run without the lock."""
    from conftest import children
    history = tmp_path / "history"
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    [sentinel] = children(holder_pid(value))
    os.kill(sentinel, signal.SIGSTOP)
    try:
        s = step(value, "-w", "0.5", loop_dir, "--", PY, "-c", f"open({str(history)!r}, 'a').write('ran\\n')")
    finally:
        os.kill(sentinel, signal.SIGCONT)
    assert s.returncode == EX_TEMPFAIL, s.stderr
    assert "did not hand over its lock descriptor" in s.stderr and "waits for the lock as any run" in s.stderr
    assert not history.exists()
    assert step(value, "--release").returncode == 0


def test_release_finds_a_hold_whose_lock_file_was_moved_away(holds, loop_dir):
    """The record and /proc/locks no longer say; the sentinel answering to
    the secret does."""
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    (loop_dir / ".state.lock").rename(loop_dir / "moved")
    rel = run(["--release", value])
    assert rel.returncode == 0, rel.stderr
    assert not running(holder_pid(value))


def test_relative_paths_are_the_callers(holds, loop_dir, tmp_path):
    """The holder works in /: a relative --metrics-dir is made absolute."""
    (tmp_path / "met").mkdir()
    r = run(["--hold", "--max-time", "2m", "--metrics-dir", "met", loop_dir], cwd=tmp_path)
    value = value_of(r.stdout)
    assert step(value, "--release").returncode == 0
    wait_until(lambda: any((tmp_path / "met").iterdir()), "the hold's metrics file")


def test_release_of_a_hold_whose_lock_another_run_took_since_names_that_run(holds, loop_dir):
    """The hold ended; a run took the lock and let go since: --release says
    which run the holder record names and when it let go (before: "names
    another run, or none")."""
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    assert step(value, "--release").returncode == 0
    r = run(["--operation", "later", loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    rel = run(["--release", value])
    assert rel.returncode == NO_SUCH_HOLD, rel.stderr
    assert ("the hold is not the lock's holder (its holder record names another run, pid " in rel.stderr
            and " (operation later), which let go at " in rel.stderr), rel.stderr


def test_a_step_in_a_time_namespace_of_its_own_runs_inside_the_live_hold(holds, loop_dir, tmp_path):
    """/proc shows start times shifted by the reader's time namespace
    (unshare --time --boottime): a step there compares them as the holder
    recorded them, so it runs inside the hold, and --inspect there names the
    record current. Before, the step read the live hold as ended ("process
    N is gone") and waited for its lock (75)."""
    probe = subprocess.run(["unshare", "--time", "--boottime", "1000", "true"], capture_output=True, text=True,
                           timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a time namespace here: {probe.stderr.strip()}")
    value = value_of(holds("--max-time", "2m", loop_dir).stdout)
    history = tmp_path / "history"
    timens = ["unshare", "--time", "--boottime", "1000", LOOPLOCK]
    s = subprocess.run([*timens, "-w", "1", loop_dir, "--", PY, "-c",
                        f"open({str(history)!r}, 'a').write('step\\n')"],
                       capture_output=True, text=True, timeout=TIMEOUT, env={**os.environ, "LOOPLOCK_HOLD": value})
    assert (s.returncode, s.stderr) == (0, ""), s.stderr
    assert history.read_text() == "step\n"
    i = subprocess.run([*timens, "--inspect", loop_dir], capture_output=True, text=True, timeout=TIMEOUT)
    assert "record    current: pid " in i.stdout and "pid_start" in i.stdout and "same process" in i.stdout, i.stdout
    assert step(value, "--release").returncode == 0
