"""Interoperation with other flock(2) users (util-linux flock(1), Python's
fcntl.flock) in both directions, shared locks, the lock fd passed to the
command (or not, with -o), and the exported environment."""
import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, PY, TIMEOUT, blocked_waiters, expect_stderr, expected_lock_id, helper,
                      kill_and_wait_gone, lock_is_free, read_record, run, start, wait_until)

LOCK = ".state.lock"
EXTERNAL = ["flock", "python"]


def try_flock(path, op):
    """Non-blocking flock(2) on a fresh open file description of path:
    True if taken (then released), False if it would block."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def flock_n(path, *opts):
    return subprocess.run(["flock", "-n", *opts, str(path), "true"], capture_output=True, timeout=TIMEOUT).returncode


# --- (a) an external holder blocks looplock -------------------------------------

@pytest.mark.parametrize("tool", EXTERNAL)
def test_external_holder_times_out_looplock(loop_dir, holders, tool):
    holders(loop_dir, tool=tool)
    marker = loop_dir / "ran"
    r = run(["-w", "0.3", loop_dir, "--", "touch", marker])
    assert r.returncode == EX_TEMPFAIL
    assert "lock_acquire_timeout" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("tool", EXTERNAL)
def test_external_holder_makes_single_flight_skip(loop_dir, holders, tool):
    holders(loop_dir, tool=tool)
    marker = loop_dir / "ran"
    r = run(["-p", "single_flight", loop_dir, "--", "touch", marker])
    assert r.returncode == 0
    assert "noop-locked" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("tool", EXTERNAL)
def test_blocking_waits_for_external_holder(loop_dir, holders, tool):
    h = holders(loop_dir, tool=tool)
    marker = loop_dir / "ran"
    waiter = start(["-v", "-p", "blocking", loop_dir, "--", "touch", marker])
    try:
        expect_stderr(waiter, "waiting for")
        # Blocked in flock(2), and its command has not run.
        wait_until(lambda: waiter.pid in blocked_waiters(loop_dir / LOCK), "looplock to block in flock(2)")
        assert not marker.exists()
        assert waiter.poll() is None
        h.release()
        out, err = waiter.communicate(timeout=TIMEOUT)
        assert waiter.returncode == 0, err
        assert marker.exists()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


@pytest.mark.parametrize("tool", EXTERNAL)
def test_after_external_release_looplock_runs(loop_dir, holders, tool):
    holders(loop_dir, tool=tool).release()
    r = run(["-w", "0", loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"


# --- (b) looplock holds: other tools are excluded -------------------------------

def test_looplock_holder_excludes_flock_and_python(loop_dir, holders):
    lock = loop_dir / LOCK
    h = holders(loop_dir, tool="looplock")
    assert flock_n(lock) == 1
    assert flock_n(lock, "-s") == 1
    with pytest.raises(BlockingIOError):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert not try_flock(lock, fcntl.LOCK_SH)
    h.release()
    assert flock_n(lock) == 0
    assert try_flock(lock, fcntl.LOCK_EX)


@pytest.mark.parametrize("tool", EXTERNAL)
def test_blocking_external_waiter_runs_after_looplock(loop_dir, holders, tool):
    lock = loop_dir / LOCK
    h = holders(loop_dir, tool="looplock")
    marker = loop_dir / "ran"
    if tool == "flock":
        argv = ["flock", str(lock), "touch", str(marker)]
    else:
        code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
                "open(sys.argv[2], 'w').close()")
        argv = [PY, "-c", code, str(lock), str(marker)]
    waiter = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: waiter.pid in blocked_waiters(lock), f"{tool} to block in flock(2)")
        assert not marker.exists()
        assert h.release() == 0
        waiter.wait(timeout=TIMEOUT)
        assert waiter.returncode == 0
        assert marker.exists()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


def test_flock_timeout_against_looplock(loop_dir, holders):
    holders(loop_dir, tool="looplock")
    r = subprocess.run(["flock", "-w", "0.2", str(loop_dir / LOCK), "true"], timeout=TIMEOUT)
    assert r.returncode == 1


# --- shared locks -------------------------------------------------------------------

def test_shared_holders_coexist_and_exclude_exclusive(loop_dir, holders):
    lock = loop_dir / LOCK
    # Each holder prints "ready" only once it has its lock: all three at once.
    holders(loop_dir, tool="looplock", shared=True)
    holders(loop_dir, tool="flock", shared=True)
    holders(loop_dir, tool="python", shared=True)
    # More readers are welcome...
    r = run(["-s", "-w", "0", loop_dir, "--", "echo", "reader"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "reader\n"
    assert flock_n(lock, "-s") == 0
    assert try_flock(lock, fcntl.LOCK_SH)
    # ...a writer is not.
    marker = loop_dir / "ran"
    r = run(["-w", "0", loop_dir, "--", "touch", marker])
    assert r.returncode == EX_TEMPFAIL
    assert not marker.exists()
    assert flock_n(lock) == 1
    assert not try_flock(lock, fcntl.LOCK_EX)


@pytest.mark.parametrize("tool", EXTERNAL)
def test_exclusive_external_holder_excludes_shared_looplock(loop_dir, holders, tool):
    holders(loop_dir, tool=tool)
    marker = loop_dir / "ran"
    r = run(["-s", "-w", "0.2", loop_dir, "--", "touch", marker])
    assert r.returncode == EX_TEMPFAIL
    assert not marker.exists()
    r = run(["-s", "-p", "single_flight", loop_dir, "--", "touch", marker])
    assert r.returncode == 0
    assert "noop-locked" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("tool", EXTERNAL)
def test_shared_looplock_coexists_with_external_reader(loop_dir, holders, tool):
    holders(loop_dir, tool=tool, shared=True)
    r = run(["-s", "-w", "0", loop_dir, "--", "echo", "reader"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "reader\n"


def test_shared_looplock_holder_blocks_exclusive_looplock_until_release(loop_dir, holders):
    h = holders(loop_dir, tool="looplock", shared=True)
    marker = loop_dir / "ran"
    waiter = start(["-v", "-p", "blocking", loop_dir, "--", "touch", marker])
    try:
        expect_stderr(waiter, "waiting for")
        assert not marker.exists()
        h.release()
        waiter.communicate(timeout=TIMEOUT)
        assert waiter.returncode == 0
        assert marker.exists()
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


# --- the lock fd and the command ----------------------------------------------------

CHECK_FD = """
import fcntl, os, sys
fd = int(os.environ["LOOPLOCK_FD"])
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the same open file as looplock's: already ours
fresh = os.open(os.path.join(os.environ["LOOPLOCK_DIR"], ".state.lock"), os.O_RDONLY)
try:
    fcntl.flock(fresh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held")
"""


def env_report(args, **kw):
    r = run([*args, "--", PY, helper("env_report.py")], **kw)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("shared", [False, True])
def test_command_inherits_lock_fd(loop_dir, shared):
    rep = env_report([*(["-s"] if shared else []), loop_dir])
    env = rep["env"]
    assert "LOOPLOCK_FD" in env
    fd = env["LOOPLOCK_FD"]
    assert int(fd) >= 3
    st = os.stat(loop_dir / LOCK)
    assert rep["fds"][fd]["path"] == os.path.realpath(loop_dir / LOCK)
    assert (rep["fds"][fd]["dev"], rep["fds"][fd]["ino"]) == (st.st_dev, st.st_ino)


def test_inherited_fd_is_the_locked_open_file(loop_dir):
    r = run([loop_dir, "--", PY, "-c", CHECK_FD])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "held\n"


def test_close_does_not_pass_lock_fd(loop_dir):
    rep = env_report(["-o", loop_dir])
    assert "LOOPLOCK_FD" not in rep["env"]
    st = os.stat(loop_dir / LOCK)
    lock_fds = [fd for fd, f in rep["fds"].items() if (f["dev"], f["ino"]) == (st.st_dev, st.st_ino)]
    assert lock_fds == [], "with -o the command must not hold the lock file open"


def test_close_ignores_forged_looplock_fd(loop_dir):
    rep = env_report(["-o", loop_dir], env={"LOOPLOCK_FD": "3"})
    assert "LOOPLOCK_FD" not in rep["env"]


def test_close_still_holds_the_lock_while_command_runs(loop_dir):
    code = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
            "except BlockingIOError:\n    print('held')\n")
    r = run(["-o", loop_dir, "--", PY, "-c", code, loop_dir / LOCK])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "held\n"


@pytest.mark.parametrize("close", [False, True])
def test_daemon_started_by_command_keeps_lock_only_without_close(loop_dir, close):
    r = run([*(["-o"] if close else []), loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)])
    assert r.returncode == 0, r.stderr
    daemon = int(r.stdout)
    try:
        assert Path(f"/proc/{daemon}").exists(), "the daemon must still run"
        if close:
            # looplock has exited; nothing else holds the lock.
            assert lock_is_free(loop_dir)
        else:
            # Like flock(1): the daemon inherited the locked open file and
            # keeps the lock after looplock exits...
            assert not lock_is_free(loop_dir)
            kill_and_wait_gone(daemon)
            # ...until it ends.
            wait_until(lambda: lock_is_free(loop_dir), "the lock to be freed by the daemon's death")
    finally:
        kill_and_wait_gone(daemon)


# --- exported environment --------------------------------------------------------------


def test_exported_environment(loop_dir):
    env = env_report([loop_dir])["env"]
    assert env["LOOPLOCK_DIR"] == os.path.realpath(loop_dir)
    assert env["LOOPLOCK_LOCK_ID"] == expected_lock_id(loop_dir)
    assert len(env["LOOPLOCK_LOCK_ID"]) == 16
    assert all(c in "0123456789abcdef" for c in env["LOOPLOCK_LOCK_ID"])
    assert env["LOOPLOCK_POLICY"] == "mutation"
    assert read_record(loop_dir)["lock_id"] == env["LOOPLOCK_LOCK_ID"]


def test_exported_dir_is_absolute_and_canonical(tmp_path, loop_dir):
    (tmp_path / "alias").symlink_to(loop_dir)
    for arg, cwd in (("loop", tmp_path), ("alias", tmp_path), ("./alias/../loop/", tmp_path),
                     (str(tmp_path / "alias"), "/")):
        env = env_report([arg], cwd=cwd)["env"]
        assert os.path.isabs(env["LOOPLOCK_DIR"])
        assert env["LOOPLOCK_DIR"] == os.path.realpath(loop_dir), arg
        assert env["LOOPLOCK_LOCK_ID"] == expected_lock_id(loop_dir), arg


def test_lock_id_differs_between_dirs(tmp_path, loop_dir):
    other = tmp_path / "other"
    other.mkdir()
    a = env_report([loop_dir])["env"]["LOOPLOCK_LOCK_ID"]
    b = env_report([other])["env"]["LOOPLOCK_LOCK_ID"]
    assert a != b
    assert b == expected_lock_id(other)


@pytest.mark.parametrize("policy", ["mutation", "monitor", "single_flight", "blocking"])
def test_exported_policy(loop_dir, policy):
    env = env_report(["-p", policy, loop_dir])["env"]
    assert env["LOOPLOCK_POLICY"] == policy


def test_shell_form_gets_the_same_environment(loop_dir):
    r = run(["-p", "monitor", loop_dir, "-c",
             'printf "%s\\n" "$LOOPLOCK_DIR" "$LOOPLOCK_LOCK_ID" "$LOOPLOCK_POLICY" "${LOOPLOCK_FD:+fd}"'])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [os.path.realpath(loop_dir), expected_lock_id(loop_dir), "monitor", "fd"]
