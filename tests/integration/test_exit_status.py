"""Every row of the man page's EXIT STATUS table, each shown with the real
binary, plus -F (exec in place)."""
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import (
    EX_CANTCREAT,
    EX_NOINPUT,
    EX_NOTEXEC,
    EX_NOTFOUND,
    EX_OSERR,
    EX_TEMPFAIL,
    EX_USAGE,
    EX_VANISHED,
    LOOPLOCK,
    TIMEOUT,
    fresh_signals,
    lock_is_free,
    run,
)

LOCK = ".state.lock"


def lines(text):
    return text.splitlines()


def assert_error(r, status, *words):
    """looplock's own failure: the status, and a `looplock: ` line naming the
    cause."""
    assert r.returncode == status, (r.returncode, r.stderr)
    errs = lines(r.stderr)
    assert errs and all(l.startswith("looplock: ") for l in errs), r.stderr
    for w in words:
        assert w in errs[0], (w, r.stderr)


# --- the command exited with N: N ---------------------------------------------

def test_exit_status_passes_through_0_to_255(loop_dir):
    wrong = []
    for n in range(256):
        r = run([loop_dir, "--", "sh", "-c", f"exit {n}"])
        if r.returncode != n or r.stderr:
            wrong.append((n, r.returncode, r.stderr))
    assert wrong == []


@pytest.mark.parametrize("n", [0, 1, 75, 255])
def test_exit_status_passes_through_shell_form(loop_dir, n):
    assert run([loop_dir, "-c", f"exit {n}"]).returncode == n


@pytest.mark.parametrize("n", [0, 3, 64, 126, 127, 255])
def test_exit_status_passes_through_no_fork(loop_dir, n):
    r = run(["-F", loop_dir, "--", "sh", "-c", f"exit {n}"])
    assert r.returncode == n
    assert r.stderr == ""


# --- the command was killed by signal S: looplock dies of S -------------------

def run_raw(argv, cwd, core_unlimited=False):
    """Runs argv and returns its raw wait status (to see WCOREDUMP)."""
    import time

    def pre():
        fresh_signals()  # the suite may run in a background job, whose shell ignored QUIT
        if core_unlimited:
            resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

    p = subprocess.Popen(argv, cwd=cwd, preexec_fn=pre, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + TIMEOUT
    while time.monotonic() < end:
        pid, status = os.waitpid(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = 0  # reaped here; keep Popen from waiting again
            return status
        time.sleep(0.01)
    p.kill()
    p.wait()
    raise AssertionError(f"{argv} did not end within {TIMEOUT} s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP,
                                 signal.SIGQUIT, signal.SIGSEGV, signal.SIGABRT, signal.SIGUSR1])
def test_killed_by_signal_dies_of_same_signal(loop_dir, sig):
    # The signal's default disposition, set for looplock: an ignored one is
    # inherited across exec (a suite started under nohup(1) ignores HUP), and
    # looplock keeps it ignored for the command, as nohup relies on.
    r = run([loop_dir, "--", "sh", "-c", f"ulimit -c 0; kill -{sig.name[3:]} $$; sleep 5"], cwd=loop_dir,
            preexec_fn=None if sig == signal.SIGKILL else lambda: signal.signal(sig, signal.SIG_DFL))
    assert r.returncode == -sig, r.returncode
    assert r.stderr == ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGSEGV])
def test_killed_by_signal_no_fork(loop_dir, sig):
    r = run(["-F", loop_dir, "--", "sh", "-c", f"ulimit -c 0; kill -{sig.name[3:]} $$; sleep 5"], cwd=loop_dir)
    assert r.returncode == -sig


def test_shell_sees_128_plus_signal(loop_dir):
    script = '"$0" "$1" -- sh -c \'kill -TERM $$; sleep 5\'; echo "status $?"'
    r = subprocess.run(["sh", "-c", script, LOOPLOCK, str(loop_dir)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.stdout == "status 143\n"


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGQUIT, signal.SIGABRT])
def test_core_signal_leaves_no_core_of_looplock(tmp_path, loop_dir, sig):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    name = sig.name[3:]
    # Control: without looplock, the same shell with cores enabled dumps one,
    # so this check can fail.
    control = run_raw(["sh", "-c", f"kill -{name} $$"], cwd, core_unlimited=True)
    assert os.WIFSIGNALED(control) and os.WTERMSIG(control) == sig
    control_dumped = os.WCOREDUMP(control)
    for f in cwd.iterdir():
        f.unlink()
    # The command disables its own core dump; looplock must not add one.
    status = run_raw([LOOPLOCK, str(loop_dir), "--", "sh", "-c", f"ulimit -c 0; kill -{name} $$"], cwd,
                     core_unlimited=True)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig
    assert not os.WCOREDUMP(status), "looplock dumped core"
    assert list(cwd.iterdir()) == []
    if not control_dumped:
        pytest.skip("this system writes no core dumps (core_pattern/limits): the no-core check is vacuous")


# --- deadline passed: 75, or -E -----------------------------------------------

@pytest.mark.parametrize("policy", ["mutation", "monitor"])
def test_deadline_passed_is_75(loop_dir, holders, policy):
    holders(loop_dir)
    marker = loop_dir / "ran"
    r = run(["-p", policy, "-w", "0", loop_dir, "--", "touch", marker])
    assert r.returncode == EX_TEMPFAIL
    assert "lock_acquire_timeout" in r.stderr
    assert not marker.exists()


@pytest.mark.parametrize("code", [1, 42, 255])
def test_deadline_passed_conflict_exit_code(loop_dir, holders, code):
    holders(loop_dir)
    r = run(["-E", str(code), "-w", "0", loop_dir, "--", "true"])
    assert r.returncode == code
    assert "lock_acquire_timeout" in r.stderr


def test_free_lock_ignores_conflict_exit_code(loop_dir):
    assert run(["-E", "9", "-w", "0", loop_dir, "--", "sh", "-c", "exit 4"]).returncode == 4


# --- single_flight found the lock held: 0, or --skip-exit-code ---------------

@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_single_flight_skip_is_0(loop_dir, holders, quiet):
    holders(loop_dir)
    marker = loop_dir / "ran"
    r = run([*quiet, "-p", "single_flight", loop_dir, "--", "touch", marker])
    assert r.returncode == 0
    assert not marker.exists()
    assert r.stdout == ""
    if quiet:
        assert r.stderr == ""  # a healthy skip under cron must not mail
        return
    skip = [l for l in lines(r.stderr) if "noop-locked" in l]
    assert len(skip) == 1 and skip[0].startswith("looplock: "), r.stderr


@pytest.mark.parametrize("code", [0, 1, 75, 255])
def test_single_flight_skip_exit_code(loop_dir, holders, code):
    holders(loop_dir)
    r = run(["-p", "single_flight", "--skip-exit-code", str(code), loop_dir, "--", "true"])
    assert r.returncode == code
    assert "noop-locked" in r.stderr
    r = run(["-q", "-p", "single_flight", "--skip-exit-code", str(code), loop_dir, "--", "true"])
    assert (r.returncode, r.stderr) == (code, "")


def test_single_flight_free_runs_command(loop_dir):
    r = run(["-p", "single_flight", "--skip-exit-code", "9", loop_dir, "--", "sh", "-c", "exit 4"])
    assert r.returncode == 4
    assert "noop-locked" not in r.stderr


# --- usage error: 64 ------------------------------------------------------------

def test_usage_error_is_64(loop_dir):
    marker = loop_dir / "ran"
    r = run(["-p", "nope", loop_dir, "--", "touch", marker])
    assert_error(r, EX_USAGE, "nope")
    assert not marker.exists()


# --- DIR missing or not a directory: 66 ---------------------------------------

def test_dir_missing_is_66(tmp_path):
    r = run([tmp_path / "absent", "--", "true"])
    assert_error(r, EX_NOINPUT, "does not exist")
    assert not (tmp_path / "absent").exists(), "looplock must never create DIR"


def test_a_path_the_system_cannot_follow_is_66_and_named_so_not_missing(tmp_path):
    """An existing DIR given by a path longer than the system opens at once
    (PATH_MAX), or through a loop of symbolic links: 66 as for DIR, but the
    event and the message say why, not that DIR is missing."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    rel = []
    while len("/".join(rel)) < 5000:  # made step by step, each relative to the last: no path is long
        name = "d" * 200
        os.mkdir(name, dir_fd=fd)
        deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
        rel.append(name)
    long_path = "/".join(rel)
    r = subprocess.run([LOOPLOCK, "--log-format", "json", long_path, "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=tmp_path)
    assert r.returncode == EX_NOINPUT, r.stderr
    obj = json.loads(r.stderr.splitlines()[-1])
    assert obj["event"] == "dir_path_unusable" and "File name too long" in obj["message"], obj
    assert "shorter relative path" in obj["hint"], obj
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    r = run(["--log-format", "json", tmp_path / "a", "--", "true"])
    obj = json.loads(r.stderr.splitlines()[-1])
    assert r.returncode == EX_NOINPUT and obj["event"] == "dir_path_unusable", r.stderr
    # The control: the same directory, from inside it, locks.
    try:
        r = subprocess.run([LOOPLOCK, ".", "--", "true"], capture_output=True, text=True, timeout=TIMEOUT,
                           preexec_fn=lambda: os.fchdir(fd), pass_fds=(fd,))
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr


def test_dir_is_a_file_is_66(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = run([f, "--", "true"])
    assert_error(r, EX_NOINPUT, "not a directory")
    assert f.read_text() == "x"


def test_dir_under_a_file_is_66(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    assert_error(run([f / "sub", "--", "true"]), EX_NOINPUT)


def test_dir_is_dangling_symlink_is_66(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path / "absent")
    assert_error(run([tmp_path / "link", "--", "true"]), EX_NOINPUT)


# --- lock file unsafe: 73 --------------------------------------------------------

def unsafe_case(loop_dir, *words):
    marker = loop_dir.parent / "ran"
    r = run([loop_dir, "--", "touch", marker], timeout=10)
    assert_error(r, EX_CANTCREAT, *words)
    assert not marker.exists(), "the command ran without a safe lock"
    return r


def test_unsafe_symlink(tmp_path, loop_dir):
    target = tmp_path / "target"
    (loop_dir / LOCK).symlink_to(target)
    unsafe_case(loop_dir, "symbolic link")
    assert not target.exists(), "looplock followed the symlink"


def test_unsafe_symlink_to_existing_file(tmp_path, loop_dir):
    target = tmp_path / "target"
    target.write_text("precious")
    (loop_dir / LOCK).symlink_to(target)
    unsafe_case(loop_dir, "symbolic link")
    assert target.read_text() == "precious"


def test_unsafe_directory(loop_dir):
    (loop_dir / LOCK).mkdir()
    unsafe_case(loop_dir, "directory")


def test_unsafe_hard_link(tmp_path, loop_dir):
    (loop_dir / LOCK).write_text("")
    os.link(loop_dir / LOCK, tmp_path / "other-name")
    unsafe_case(loop_dir, "2 hard links")


def test_unsafe_fifo(loop_dir):
    os.mkfifo(loop_dir / LOCK)
    unsafe_case(loop_dir, "FIFO")


def test_unsafe_socket(loop_dir):
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(loop_dir / LOCK))
        unsafe_case(loop_dir, "socket")
    finally:
        s.close()


def test_unsafe_world_writable_dir(loop_dir):
    os.chmod(loop_dir, 0o777)
    unsafe_case(loop_dir, "world-writable")
    assert not (loop_dir / LOCK).exists(), "no lock file is created in an unsafe DIR"


def test_world_writable_dir_with_sticky_bit_is_fine(loop_dir):
    os.chmod(loop_dir, 0o1777)
    r = run([loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_unsafe_foreign_owner(loop_dir):
    (loop_dir / LOCK).write_text("")
    os.chown(loop_dir / LOCK, 65534, 65534)
    unsafe_case(loop_dir, "owned by uid 65534")


# --- lock file cannot be created: 73 --------------------------------------------

def test_cannot_create_immutable_dir(loop_dir):
    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root (the non-root case is covered by test_cannot_create_as_other_user)")
    c = subprocess.run(["chattr", "+i", str(loop_dir)], capture_output=True, text=True, timeout=TIMEOUT)
    if c.returncode != 0:
        pytest.skip(f"chattr +i not supported here: {c.stderr.strip()}")
    try:
        marker = loop_dir.parent / "ran"
        r = run([loop_dir, "--", "touch", marker])
        assert_error(r, EX_CANTCREAT, "cannot create")
        assert not marker.exists()
    finally:
        subprocess.run(["chattr", "-i", str(loop_dir)], timeout=TIMEOUT)


def as_nobody():
    """argv prefix that runs a command as uid/gid 65534, or None."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv"):
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    return None


def test_cannot_create_as_other_user():
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("needs root and setpriv or runuser to run looplock as another user")
    base = Path(tempfile.mkdtemp(prefix="looplock-it-"))
    try:
        os.chmod(base, 0o755)
        d = base / "loop"
        d.mkdir(mode=0o755)  # owned by root, not writable by uid 65534
        marker = base / "ran"
        probe = subprocess.run([*prefix, LOOPLOCK, "--version"], capture_output=True, timeout=TIMEOUT, cwd="/")
        if probe.returncode != 0:
            pytest.skip(f"uid 65534 cannot run {LOOPLOCK}")
        r = subprocess.run([*prefix, LOOPLOCK, str(d), "--", "touch", str(marker)], capture_output=True,
                           text=True, timeout=TIMEOUT, cwd="/")
        assert_error(r, EX_CANTCREAT, "cannot create", "Permission denied")
        assert not marker.exists()
        assert not (d / LOCK).exists()
    finally:
        shutil.rmtree(base)


# --- vanished mid-lock: 74, unless the command failed ---------------------------

def test_lock_file_replaced_mid_lock_is_74(loop_dir):
    lock = loop_dir / LOCK
    r = run([loop_dir, "--", "sh", "-c", 'rm "$1" && : > "$1"', "sh", lock])
    assert_error(r, EX_VANISHED, "vanished mid-lock")


def test_lock_file_deleted_mid_lock_is_74(loop_dir):
    r = run([loop_dir, "--", "rm", loop_dir / LOCK])
    assert_error(r, EX_VANISHED, "vanished mid-lock")


def test_dir_moved_away_mid_lock_is_74(tmp_path, loop_dir):
    r = run([loop_dir, "--", "mv", loop_dir, tmp_path / "elsewhere"])
    assert_error(r, EX_VANISHED, "vanished mid-lock")


def test_dir_replaced_mid_lock_is_74(tmp_path, loop_dir):
    r = run([loop_dir, "--", "sh", "-c", 'mv "$1" "$2" && mkdir "$1"', "sh", loop_dir, tmp_path / "old"])
    assert_error(r, EX_VANISHED, "vanished mid-lock")


def test_vanished_but_command_failed_keeps_its_status(loop_dir):
    lock = loop_dir / LOCK
    r = run([loop_dir, "--", "sh", "-c", 'rm "$1" && : > "$1"; exit 5', "sh", lock])
    assert r.returncode == 5
    assert "vanished mid-lock" in r.stderr


def test_vanished_but_command_killed_keeps_its_signal(loop_dir):
    r = run([loop_dir, "--", "sh", "-c", 'rm "$1"; kill -TERM $$', "sh", loop_dir / LOCK])
    assert r.returncode == -signal.SIGTERM


def test_intact_lock_is_not_vanished(loop_dir):
    # Control: rewriting the content (same inode) is not "vanished".
    r = run([loop_dir, "--", "sh", "-c", 'echo junk >> "$1"', "sh", loop_dir / LOCK])
    assert r.returncode == 0, r.stderr


# --- operating-system failure: 71 ---------------------------------------------

@pytest.mark.skipif(os.environ.get("LOOPLOCK_SANITIZED") == "1",
                    reason="the sanitizer runtime itself needs file descriptors (UBSan's vptr check fails first)")
@pytest.mark.parametrize("limit", [4])
def test_fd_exhaustion_is_71(loop_dir, limit):
    # 0-2 are stdio and the loop directory takes 3: the lock file cannot be
    # opened. (With 3, a dynamically linked build would fail in ld.so.)
    marker = loop_dir / "ran"
    r = subprocess.run(["sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", LOOPLOCK, str(loop_dir), "--",
                        "touch", str(marker)], capture_output=True, text=True, timeout=TIMEOUT)
    assert_error(r, EX_OSERR, "Too many open files")
    assert not marker.exists()
    assert lock_is_free(loop_dir)


# --- not executable: 126; not found: 127 ---------------------------------------

def test_not_executable_file_is_126(loop_dir):
    script = loop_dir / "script"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    assert_error(run([loop_dir, "--", script]), EX_NOTEXEC, "cannot run", "Permission denied")


def test_directory_as_command_is_126(loop_dir):
    assert_error(run([loop_dir, "--", loop_dir]), EX_NOTEXEC, "cannot run")


def test_not_found_on_path_is_127(loop_dir):
    assert_error(run([loop_dir, "--", "looplock-no-such-command-xyz"]), EX_NOTFOUND, "cannot run",
                 "No such file")


def test_not_found_path_is_127(loop_dir):
    assert_error(run([loop_dir, "--", loop_dir / "absent"]), EX_NOTFOUND, "cannot run")


def test_shell_form_not_found_is_127(loop_dir):
    # The shell reports it; looplock passes its 127 through.
    assert run([loop_dir, "-c", "looplock-no-such-command-xyz"]).returncode == EX_NOTFOUND


def test_exec_failure_releases_lock(loop_dir):
    run([loop_dir, "--", "looplock-no-such-command-xyz"])
    assert lock_is_free(loop_dir)


def test_no_fork_not_executable_is_126(loop_dir):
    script = loop_dir / "script"
    script.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(script, 0o644)
    assert_error(run(["-F", loop_dir, "--", script]), EX_NOTEXEC, "cannot run")
    assert_error(run(["-F", loop_dir, "--", loop_dir]), EX_NOTEXEC, "cannot run")


def test_no_fork_not_found_is_127(loop_dir):
    assert_error(run(["-F", loop_dir, "--", "looplock-no-such-command-xyz"]), EX_NOTFOUND, "cannot run")
    assert_error(run(["-F", loop_dir, "--", loop_dir / "absent"]), EX_NOTFOUND, "cannot run")
