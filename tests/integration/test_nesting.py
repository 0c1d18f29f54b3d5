"""Nesting (looplock-sharing(7), NESTING): a looplock started, directly
or further down, by a command that already runs under looplock for the same
lock runs its command at once inside the outer critical section, without
re-acquiring or rewriting the holder record; a forged or stale environment
never bypasses the lock.

The inner looplock always gets `-w 1` (or `-w 0.3` where it must time out), so
a nesting failure shows up as 75 instead of a hang. Its command is
helpers/nest_probe.py, which reports what it sees of the lock (who holds it
according to the kernel, the holder record, its LOOPLOCK_* variables) and
exits with a chosen status.
"""
import json
import os
import select
import signal
import subprocess
import time

import pytest

from conftest import (
    NO_PROC,
    PID_NS,
    fds_on,
    EX_TEMPFAIL,
    LOOPLOCK,
    PY,
    need_no_proc,
    need_pid_namespace,
    TIMEOUT,
    helper,
    incident_rows,
    lock_is_free,
    read_record,
    run,
    start,
)

PROBE = helper("nest_probe.py")
STATUS = 7  # what the probe exits with: must come back through every level


def inner(loop_dir, wait="1", extra=(), status=STATUS):
    """argv of an inner looplock on loop_dir running the probe."""
    return [LOOPLOCK, "-w", wait, *extra, str(loop_dir), "--", PY, PROBE, str(loop_dir), str(status)]


# How the outer command reaches the inner looplock.
CHAINS = {
    "direct": lambda argv: argv,
    "sh": lambda argv: ["sh", "-c", '"$@"; rc=$?; exit $rc', "sh", *argv],
    # Python's subprocess closes every inherited fd, the lock fd included.
    "python": lambda argv: [PY, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", *argv],
    "sh-python": lambda argv: ["sh", "-c", '"$@"; rc=$?; exit $rc', "sh",
                               PY, "-c", "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))", *argv],
}


def run_outer(outer_opts, loop_dir, command, env=None):
    """Runs `looplock OUTER_OPTS loop_dir -- command`; returns (proc, stdout, stderr)."""
    p = start([*outer_opts, loop_dir, "--", *command], env=env, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return p, out, err


def read_line(stream, timeout=TIMEOUT):
    """One line from a pipe, or an AssertionError after `timeout` seconds."""
    fd, data, end = stream.fileno(), b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = end - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no line within {timeout} s; got {data!r}")
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode()


def probes(out):
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("outer_opts", [[], ["-o"], ["-F"]], ids=["default", "close-fd", "no-fork"])
def test_nested_looplock_runs_inside_the_outer_critical_section(loop_dir, chain, outer_opts):
    p, out, err = run_outer(["-p", "blocking", *outer_opts], loop_dir, CHAINS[chain](inner(loop_dir)))
    assert p.returncode == STATUS, err
    [probe] = probes(out)
    outer = p.pid  # with -F, the outer command has looplock's pid
    assert probe["held"]
    # Only the outer holder has the lock; the inner looplock (the probe's
    # parent) took nothing of its own.
    assert probe["kernel"] == [[outer, "WRITE"]]
    assert probe["ppid"] != outer or (chain == "direct" and outer_opts == ["-F"])
    assert probe["record"]["pid"] == outer
    assert probe["record"]["released_at"] is None
    assert probe["env"]["LOOPLOCK_HOLDER_PID"] == str(outer)
    assert lock_is_free(loop_dir)
    assert incident_rows(loop_dir) == []


def test_inner_looplock_does_not_rewrite_the_holder_record(loop_dir, tmp_path):
    lock = loop_dir / ".state.lock"
    before, after = tmp_path / "before", tmp_path / "after"
    script = ('cat "$1" > "$2"; shift 3; "$@"; rc=$?; cat "$LOCK" > "$AFTER"; '
              f'{PY} {PROBE} "$LOOPLOCK_DIR"; exit $rc')
    command = ["sh", "-c", script, "sh", str(lock), str(before), "-", *inner(loop_dir, extra=["-v"])]
    p, out, err = run_outer(["-p", "blocking"], loop_dir, command, env={"LOCK": str(lock), "AFTER": str(after)})
    assert p.returncode == STATUS, err
    first, last = probes(out)
    text_before, text_after = before.read_text(), after.read_text()
    assert text_before == text_after, "the inner looplock rewrote the holder record"
    assert text_after.count('"acquired_at"') == 1
    record = json.loads(text_after)
    assert record["pid"] == p.pid and record["released_at"] is None
    assert first["record"] == record
    # After the inner looplock ended, the outer one still holds the lock.
    assert last["held"] and last["kernel"] == [[p.pid, "WRITE"]]
    final = read_record(loop_dir)
    assert final["pid"] == p.pid and final["acquired_at"] == record["acquired_at"]
    assert final["released_at"] is not None


@pytest.mark.parametrize("status", [0, 1, 42, 255])
def test_exit_status_passes_through_both_levels(loop_dir, status):
    p, out, err = run_outer(["-p", "blocking"], loop_dir, CHAINS["sh"](inner(loop_dir, status=status)))
    assert p.returncode == status, err


def test_inner_command_killed_by_a_signal(loop_dir):
    command = CHAINS["direct"]([LOOPLOCK, "-w", "1", str(loop_dir), "--", "sh", "-c", "kill -TERM $$"])
    p, out, err = run_outer(["-p", "blocking"], loop_dir, command)
    assert p.returncode == -signal.SIGTERM, err


def test_a_different_dir_inside_is_locked_normally(loop_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    p, out, err = run_outer(["-p", "blocking"], loop_dir, CHAINS["sh"](inner(other)))
    assert p.returncode == STATUS, err
    [probe] = probes(out)
    # The inner looplock took and recorded the other lock itself.
    assert probe["kernel"] == [[probe["ppid"], "WRITE"]]
    assert probe["record"]["pid"] == probe["ppid"] != p.pid
    assert probe["env"]["LOOPLOCK_HOLDER_PID"] == str(probe["ppid"])
    assert read_record(other)["released_at"] is not None


def test_a_different_dir_inside_waits_for_its_own_holder(loop_dir, tmp_path, holders):
    other = tmp_path / "other"
    other.mkdir()
    h = holders(other, tool="flock")
    p, out, err = run_outer(["-p", "blocking"], loop_dir, CHAINS["sh"](inner(other, wait="0.3")))
    assert p.returncode == EX_TEMPFAIL, err
    assert probes(out) == []
    assert "lock_acquire_timeout" in err
    assert len(incident_rows(other)) == 1
    assert h.release() == 0


# --- shared and exclusive ---------------------------------------------------

def test_shared_outer_does_not_satisfy_an_exclusive_inner(loop_dir):
    # It would wait for its own holder until its deadline (forever with -p
    # blocking): it fails at once.
    p, out, err = run_outer(["-s", "-p", "blocking"], loop_dir, CHAINS["sh"](inner(loop_dir, wait="30")))
    assert p.returncode == EX_TEMPFAIL, err
    assert probes(out) == []
    assert "inside looplock -s" in err and "so the lock would wait for its own holder" in err


def test_shared_outer_satisfies_a_shared_inner(loop_dir):
    p, out, err = run_outer(["-s", "-p", "blocking"], loop_dir, CHAINS["sh"](inner(loop_dir, extra=["-s"])))
    assert p.returncode == STATUS, err
    [probe] = probes(out)
    assert probe["kernel"] == [[p.pid, "READ"]]  # nested: no second shared lock


def test_exclusive_outer_satisfies_a_shared_inner(loop_dir):
    p, out, err = run_outer(["-p", "blocking"], loop_dir, CHAINS["sh"](inner(loop_dir, extra=["-s"])))
    assert p.returncode == STATUS, err
    [probe] = probes(out)
    assert probe["kernel"] == [[p.pid, "WRITE"]]


# --- forged and stale environments ------------------------------------------

def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait(timeout=TIMEOUT)
    return p.pid


def assert_times_out(loop_dir, env, rows_before):
    r = run(["-w", "0.3", loop_dir, "--", PY, "-c", "print('ran')"], env=env)
    assert r.returncode == EX_TEMPFAIL, (env, r.stderr)
    assert "ran" not in r.stdout
    assert "lock_acquire_timeout" in r.stderr
    assert len(incident_rows(loop_dir)) == rows_before + 1


@pytest.mark.parametrize("forgery", ["parent", "pid-1", "dead-pid", "garbage", "real-holder-not-ancestor"])
def test_forged_environment_never_bypasses_the_lock(loop_dir, holders, forgery):
    lock = loop_dir / ".state.lock"
    h = holders(loop_dir, tool="flock")
    # The test process (looplock's parent, so an ancestor) has the lock file
    # open too, but does not hold the lock.
    own_fd = os.open(lock, os.O_RDONLY)
    try:
        holder_fd = fds_on(h.pid, lock)[0]
        cases = {
            "parent": [(os.getpid(), own_fd), (os.getpid(), holder_fd)],
            "pid-1": [(1, own_fd), (1, 0), (1, 3)],
            "dead-pid": [(dead_pid(), own_fd), (dead_pid(), holder_fd)],
            "garbage": [("abc", "3"), (f"{os.getpid()}x", own_fd), (os.getpid(), "3x"), ("-1", "3"),
                        ("", ""), (f" {os.getpid()}", f" {own_fd}"), (f"{os.getpid()}", "-1"),
                        ("99999999999999999999", "3")],
            # flock(1) really holds this lock on holder_fd, but it is not an ancestor.
            "real-holder-not-ancestor": [(h.pid, holder_fd)],
        }[forgery]
        for i, (pid, fd) in enumerate(cases):
            assert_times_out(loop_dir, {"LOOPLOCK_HOLDER_PID": str(pid), "LOOPLOCK_HOLDER_FD": str(fd),
                                        "LOOPLOCK_FD": str(fd), "LOOPLOCK_DIR": str(loop_dir)}, i)
    finally:
        os.close(own_fd)
    assert h.release() == 0


def test_stale_environment_of_a_finished_run(loop_dir, holders):
    dump = "import json, os; print(json.dumps(dict(os.environ)))"
    r = run(["-p", "blocking", loop_dir, "--", PY, "-c", dump])
    assert r.returncode == 0, r.stderr
    saved = json.loads(r.stdout)
    assert "LOOPLOCK_HOLDER_PID" in saved  # otherwise this test proves nothing
    h = holders(loop_dir, tool="flock")
    assert_times_out(loop_dir, saved, 0)
    assert h.release() == 0


LATE_RUNNER = r"""
import os, subprocess, sys
looplock, loop_dir, fifo = sys.argv[1:]
with open(fifo) as f:  # until the test says go
    f.read()
r = subprocess.run([looplock, "-w", "0.3", loop_dir, "--", "echo", "ran"], capture_output=True, text=True)
print("result", r.returncode, r.stdout.strip() or "-", flush=True)
"""

SPAWN_LATE_RUNNER = r"""
import os, subprocess, sys
# A daemon that keeps this run's environment and runs looplock later, after
# this looplock has finished. (subprocess closes the inherited lock fd.)
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], start_new_session=True,
                 stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
"""


def test_stale_environment_kept_by_a_daemon(loop_dir, tmp_path, holders):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    p = start(["-p", "blocking", loop_dir, "--", PY, "-c", SPAWN_LATE_RUNNER, LATE_RUNNER,
               LOOPLOCK, str(loop_dir), str(fifo)], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert p.wait(timeout=TIMEOUT) == 0  # the earlier run is over
        assert lock_is_free(loop_dir)
        h = holders(loop_dir, tool="flock")
        with open(fifo, "w") as f:
            f.write("go\n")
        # The daemon still has the pipe of the looplock's stdout.
        out = read_line(p.stdout)
    finally:
        if p.poll() is None:
            p.kill()
    assert out.split() == ["result", str(EX_TEMPFAIL), "-"]
    assert len(incident_rows(loop_dir)) == 1
    assert h.release() == 0


NO_FORK_THEN_UNLOCK = r"""
import fcntl, os, subprocess, sys
looplock, loop_dir = sys.argv[1:]
fd = int(os.environ["LOOPLOCK_FD"])
assert os.environ["LOOPLOCK_HOLDER_PID"] == str(os.getpid())
# Give up the lock, but keep the same fd number open on the same file.
fcntl.flock(fd, fcntl.LOCK_UN)
print("unlocked", flush=True)
sys.stdin.readline()  # the test took the lock with flock(1) meanwhile
r = subprocess.run([looplock, "-w", "0.3", loop_dir, "--", "echo", "ran"], capture_output=True, text=True,
                   pass_fds=(fd,))
print("result", r.returncode, r.stdout.strip() or "-", flush=True)
"""


def test_live_ancestor_that_no_longer_holds_the_lock(loop_dir, holders):
    """-F: the environment names the command itself, alive and an ancestor,
    with the very fd, which is still open on the lock file; but it gave up
    the lock, so that is no reason to skip waiting."""
    p = start(["-F", "-p", "blocking", loop_dir, "--", PY, "-c", NO_FORK_THEN_UNLOCK, LOOPLOCK, str(loop_dir)])
    try:
        assert read_line(p.stdout).strip() == "unlocked"
        h = holders(loop_dir, tool="flock")
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert out.split() == ["result", str(EX_TEMPFAIL), "-"]
    assert h.release() == 0


def test_close_holds_inside_a_nested_run(loop_dir):
    """-o on a nested looplock: its command gets no lock fd and no LOOPLOCK_FD,
    although the nested looplock itself inherited both from the outer one."""
    probe = "echo ${LOOPLOCK_FD-unset}; ls -l /proc/self/fd | grep -c state.lock || true"
    r = run([loop_dir, "--", LOOPLOCK, "-o", "-w", "1", loop_dir, "--", "sh", "-c", probe])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["unset", "0"]
    # Control: without -o the nested command does get the fd.
    r = run([loop_dir, "--", LOOPLOCK, "-w", "1", loop_dir, "--", "sh", "-c", probe])
    assert r.returncode == 0, r.stderr
    fd, count = r.stdout.split()
    assert fd != "unset" and count == "1"


# --- without /proc, in pid namespaces, as another user ------------------------------
#
# The inner looplock recognises the outer one through the lock descriptor it
# inherited, which the kernel confirms (/proc/self/fdinfo, or, without /proc,
# flock(2) probes that change nothing): no pid needs to mean the same thing on
# both sides, and no other process's /proc entries need to be readable.

INNER_SH = "echo inner-ran; exit 7"


def inner_plain(loop_dir, wait="1"):
    return [LOOPLOCK, "-w", wait, str(loop_dir), "--", "sh", "-c", INNER_SH]


@pytest.mark.parametrize("chain", ["direct", "sh"])
def test_nesting_without_proc(loop_dir, chain):
    need_no_proc()
    r = subprocess.run([*NO_PROC, LOOPLOCK, "-p", "blocking", str(loop_dir), "--", *CHAINS[chain](inner_plain(loop_dir))],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == STATUS, r.stderr
    assert r.stdout == "inner-ran\n"
    assert lock_is_free(loop_dir)


def test_nesting_without_proc_and_a_blocking_inner_run(loop_dir):
    """-p blocking inside: before, it waited for its own parent forever."""
    need_no_proc()
    inner = [LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "sh", "-c", INNER_SH]
    r = subprocess.run([*NO_PROC, LOOPLOCK, "-p", "blocking", str(loop_dir), "--", *inner], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == STATUS, r.stderr


def test_without_proc_an_fd_that_does_not_hold_the_lock_never_bypasses_it(loop_dir, holders):
    """A forged environment naming a descriptor that is open on the lock file
    but does not hold the lock (flock(1) holds it) still waits, and times out."""
    need_no_proc()
    holders(loop_dir, tool="flock")
    lock = loop_dir / ".state.lock"
    script = (f'exec 9<{lock}; LOOPLOCK_HOLDER_PID=$$ LOOPLOCK_HOLDER_FD=9 LOOPLOCK_FD=9 '
              f'exec {LOOPLOCK} -w 0.3 {loop_dir} -- echo ran')
    r = subprocess.run([*NO_PROC, "sh", "-c", script], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert "ran" not in r.stdout
    assert len(incident_rows(loop_dir)) == 1


def test_without_proc_a_shared_inner_run_inside_a_shared_outer_one(loop_dir):
    need_no_proc()
    inner = [LOOPLOCK, "-s", "-w", "1", str(loop_dir), "--", "sh", "-c", INNER_SH]
    r = subprocess.run([*NO_PROC, LOOPLOCK, "-s", "-p", "blocking", str(loop_dir), "--", *inner], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == STATUS, r.stderr


@pytest.mark.parametrize("own_proc", [True, False], ids=["own-proc", "host-proc"])
def test_nesting_into_a_pid_namespace(loop_dir, own_proc):
    """The inner looplock is PID 1 of a pid namespace (with its own /proc, or
    seeing the host's): pids mean nothing across the boundary."""
    need_pid_namespace()
    ns = PID_NS if own_proc else [a for a in PID_NS if a != "--mount-proc"]
    r = run(["-p", "blocking", loop_dir, "--", *ns, *inner_plain(loop_dir)])
    assert r.returncode == STATUS, r.stderr
    assert r.stdout == "inner-ran\n"


@pytest.mark.parametrize("switch", [["runuser", "-u", "nobody", "--"], ["su", "-s", "/bin/sh", "nobody", "-c",
                                                                       '"$0" "$@"', "--"]], ids=["runuser", "su"])
def test_nesting_as_another_user_that_kept_the_descriptor(world_dir, switch):
    """su and runuser keep the inherited descriptor: the inner looplock,
    running as nobody, can read its own /proc entries but not the outer
    looplock's, and is not the lock file's owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    inner = [LOOPLOCK, "-w", "1", str(world_dir), "--", "sh", "-c", "id -u; exit 7"]
    r = run(["-p", "blocking", world_dir, "--", *switch, *inner])
    assert r.returncode == STATUS, r.stderr
    assert r.stdout == "65534\n"
    assert lock_is_free(world_dir)
