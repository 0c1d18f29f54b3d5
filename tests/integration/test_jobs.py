"""A command is a job (a shell and what it starts), not one process
(looplock-jobs(7), SIGNALS): what looplock sends it goes to the job's process group, once; a
timeout(1) or --kill-after reaches the whole job and leaves nothing holding
the lock; in a terminal looplock runs the command as a shell runs a job (its
own process group, the terminal's foreground), so a signal sent to
looplock's process group reaches the command once and the command can read
the terminal; as a session leader a hangup reaches the job; as PID 1 of a pid
namespace looplock behaves as tini does; looplock never leaves a core file of
its own.

Handshakes everywhere: the command prints "ready" (or looplock -v says it
waits) before the test acts; every wait is bounded.
"""
import fcntl
import os
import shutil
import resource
import signal
import subprocess
import termios

import pytest

from conftest import (
    LOOPLOCK,
    PID_NS,
    PY,
    S,
    SANITIZED,
    SIGWAIT,
    TIMEOUT,
    Lines,
    children,
    expect_stderr,
    fresh_signal_state,
    fresh_signals,
    incident_rows,
    lock_is_free,
    need_pid_namespace,
    only_child,
    run,
    running,
    wait_until,
)


def group_gone(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- the whole job ------------------------------------------------------------


def test_timeout_of_looplock_leaves_no_process_of_the_job_and_a_free_lock(loop_dir, tmp_path):
    """timeout(1) signals looplock (and its own process group); the command's
    sleep must go too, or it keeps holding the inherited lock fd."""
    pgid_file = tmp_path / "pgid"
    r = subprocess.run(["timeout", "3", LOOPLOCK, loop_dir, "-c", f"echo $$ > {pgid_file}; sleep 25; echo after"],
                       capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=fresh_signal_state)
    assert r.returncode == 124, r.stderr
    assert "after" not in r.stdout
    pgid = int(pgid_file.read_text())
    wait_until(lambda: group_gone(pgid), f"the job's process group {pgid} to be gone")
    assert lock_is_free(loop_dir)
    r = run(["-w", "0", loop_dir, "--", "true"])  # the next tick runs at once
    assert r.returncode == 0, r.stderr


def test_kill_after_reaches_a_grandchild_that_ignores_term(loop_dir, tmp_path, procs):
    pid_file = tmp_path / "pid"
    job = f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; echo ready; exec sleep 30'; echo after"
    p = procs.start(["--kill-after", "0.5", "-p", "blocking", loop_dir, "-c", job])
    Lines(p.stdout).expect("ready")
    grandchild = int(pid_file.read_text())
    procs.extra_pids.append(grandchild)
    os.kill(p.pid, signal.SIGTERM)
    # The command (sh) dies of TERM; looplock waits for the rest of its job,
    # KILLs it at --kill-after, and only then ends (and releases the lock).
    assert p.wait(timeout=TIMEOUT) == -signal.SIGTERM
    assert not running(grandchild), "the TERM-ignoring grandchild outlived looplock"
    assert lock_is_free(loop_dir)
    assert "KILL" in p.stderr.read()


def test_kill_after_zero_means_never(loop_dir, tmp_path, procs):
    """As in timeout(1): --kill-after 0 sends no KILL at all."""
    p = procs.start(["--kill-after", "0", "-p", "blocking", loop_dir, "--", PY, SIGWAIT])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, signal.SIGTERM)
    assert out.next() == "SIGTERM"
    with pytest.raises(subprocess.TimeoutExpired):  # a negative check needs a bound
        p.wait(timeout=1.5)
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0


# --- a terminal ------------------------------------------------------------------


def test_signal_to_a_foreground_looplocks_group_reaches_the_command_once(loop_dir, pty_job):
    """bash passing on a hangup, or kill -- -PGID, signals looplock's whole
    process group. The command runs in a group of its own, so it gets the
    signal once, from looplock. A queued real-time signal shows a duplicate."""
    job = pty_job(["-p", "blocking", loop_dir, "--", PY, SIGWAIT, "--origin"])
    job.out.expect("ready")
    for _ in range(3):
        os.killpg(job.pid, signal.SIGRTMIN)
        assert job.out.next() == f"SIGRTMIN user {job.pid}"
        os.kill(job.pid, S.SIGUSR1)  # the marker: a duplicate would come before it
        assert job.out.next() == f"SIGUSR1 user {job.pid}"
    job.type(b"\x04")
    assert job.out.rest() == []
    assert job.status() == "pty_job: exit 0"


def test_the_command_is_the_terminals_foreground_job(loop_dir, pty_job):
    """It can read the terminal (a background job would be stopped by SIGTTIN)."""
    job = pty_job(["-p", "blocking", loop_dir, "--", "sh", "-c", 'echo ready; read line; echo "got $line"'])
    job.out.expect("ready")
    job.type(b"hello\n")
    assert job.out.next() == "got hello"
    assert job.status() == "pty_job: exit 0"


def test_the_terminal_comes_back_after_the_command(loop_dir, pty_job):
    """After looplock, the shell that ran it can read the terminal again."""
    job = pty_job(["sh", "-c", f'{LOOPLOCK} -w 1 {loop_dir} -- true; echo ready; read x; echo "got $x"'],
                  looplock=False)
    job.out.expect("ready")
    job.type(b"x\n")
    assert job.out.next() == "got x"
    assert job.status() == "pty_job: exit 0"


def test_hangup_reaches_the_job_of_a_session_leader(loop_dir, procs):
    """`ssh -t host looplock ...`, `setsid -c looplock ...`: looplock leads the
    session, so the kernel sends the terminal's hangup to looplock only; it
    must pass it on to the command's job."""
    try:
        master, slave = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal available: {e}")

    def leader():
        fresh_signal_state()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # after setsid (start_new_session)

    job = 'trap "echo hup; exit 0" HUP; echo ready; while :; do sleep 0.1; done'
    try:
        p = procs.popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "-c", job], stdin=slave,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                        preexec_fn=leader)
    finally:
        os.close(slave)
    out = Lines(p.stdout)
    out.expect("ready")
    assert os.getsid(p.pid) == p.pid
    os.close(master)  # the terminal goes away
    assert out.next() == "hup"
    assert p.wait(timeout=TIMEOUT) == 0
    assert lock_is_free(loop_dir)


def test_a_hangup_reaches_the_job_once_with_bash_as_the_session_leader(loop_dir, procs, tmp_path):
    """bash leads the session and looplock is its foreground job (the command
    the terminal's foreground group). On a hangup the kernel sends HUP to
    bash, bash sends HUP to its jobs (looplock's group), and when bash exits
    the kernel sends HUP to the terminal's last foreground group: the
    command. looplock must not forward bash's HUP as a second one. Alone, the
    command gets one."""
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    try:
        master, slave = os.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal available: {e}")
    out_file = tmp_path / "signals"
    fifo = tmp_path / "stdin"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # the command's stdin; closed at the end

    def leader():
        fresh_signal_state()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # after setsid (start_new_session)

    try:
        shell = procs.popen([bash, "--norc", "--noprofile", "-i"], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=leader, env={"PATH": os.environ["PATH"], "PS1": "$ "})
    finally:
        os.close(slave)
    try:
        os.write(master, f"{LOOPLOCK} -p blocking {loop_dir} -- {PY} {SIGWAIT} --origin <{fifo} >{out_file}\n".encode())
        wait_until(lambda: out_file.exists() and "ready" in out_file.read_text(), "the command to start", TIMEOUT)
        looplock = only_child(shell.pid)
        procs.extra_pids.append(looplock)
        os.close(master)  # the terminal goes away
        master = -1
        wait_until(lambda: "SIGHUP" in out_file.read_text(), "the hangup to reach the command", TIMEOUT)
        shell.wait(timeout=TIMEOUT)  # bash has passed it on, and exited
        # A marker through looplock: a HUP it had still to forward comes first
        # (the lowest pending signal is taken first).
        os.kill(looplock, signal.SIGUSR2)
        wait_until(lambda: "SIGUSR2" in out_file.read_text(), "the marker to be forwarded", TIMEOUT)
    finally:
        if master >= 0:
            os.close(master)
        os.close(keep)
    wait_until(lambda: not running(looplock), "looplock to end", TIMEOUT)
    lines = out_file.read_text().splitlines()
    assert [l for l in lines if l.startswith("SIGHUP")] == ["SIGHUP kernel"], lines


# --- PID 1 of a pid namespace ----------------------------------------------------


PID1 = [*PID_NS, LOOPLOCK]


def pid1_of(unshare_pid):
    """The looplock that unshare --fork started (PID 1 inside, this pid outside)."""
    wait_until(lambda: len(children(unshare_pid)) == 1, "unshare to start looplock")
    return children(unshare_pid)[0]


@pytest.mark.parametrize("sig", [S.SIGTERM, S.SIGINT, S.SIGHUP, S.SIGQUIT], ids=lambda s: s.name)
def test_as_pid1_a_signal_ends_the_wait(loop_dir, tmp_path, holders, procs, sig):
    need_pid_namespace()
    holders(loop_dir)
    ran = tmp_path / "ran"
    p = procs.popen([*PID1, "-v", "-p", "blocking", str(loop_dir), "--", "touch", str(ran)], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, preexec_fn=fresh_signal_state)
    expect_stderr(p, "waiting for")
    os.kill(pid1_of(p.pid), sig)
    assert p.wait(timeout=10) == 128 + sig  # PID 1 cannot die of its own signal
    assert not ran.exists()
    assert incident_rows(loop_dir) == []
    assert not lock_is_free(loop_dir)


@pytest.mark.parametrize("script,status", [("exit 7", 7), ("kill -TERM $$", 128 + signal.SIGTERM),
                                           ("kill -KILL $$", 128 + signal.SIGKILL)])
def test_as_pid1_the_command_status_passes_through(loop_dir, script, status):
    need_pid_namespace()
    r = subprocess.run([*PID1, str(loop_dir), "--", "sh", "-c", script], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == status, r.stderr


ORPHAN_MAKER = r"""
import os, sys, time
# A child that leaves a grandchild behind and exits: the grandchild is
# orphaned, reparented to PID 1 (looplock), and exits at once.
if os.fork() == 0:
    if os.fork() == 0:
        os._exit(0)
    os._exit(0)
os.wait()
def zombies():
    n = 0
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            n += s[s.rindex(")") + 2] == "Z"
    return n
end = time.monotonic() + 10
while zombies() and time.monotonic() < end:
    time.sleep(0.01)
print("zombies", zombies(), flush=True)
"""


def test_as_pid1_orphans_are_reaped(loop_dir):
    need_pid_namespace()
    r = subprocess.run([*PID1, str(loop_dir), "--", PY, "-c", ORPHAN_MAKER], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["zombies", "0"]


def test_as_pid1_signals_reach_the_command(loop_dir, procs):
    need_pid_namespace()
    p = procs.popen([*PID1, "-p", "blocking", str(loop_dir), "--", PY, SIGWAIT], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=fresh_signal_state)
    out = Lines(p.stdout)
    out.expect("ready")
    pid1 = pid1_of(p.pid)
    for sig in (S.SIGUSR1, S.SIGTERM):
        os.kill(pid1, sig)
        assert out.next() == sig.name
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0


# --- no core file of looplock's own -------------------------------------------------


def core_files_go_to_cwd():
    with open("/proc/sys/kernel/core_pattern") as f:
        pattern = f.read().strip()
    if pattern.startswith("|") or "/" in pattern:
        pytest.skip(f"core files are not written to the working directory here (core_pattern {pattern!r})")
    if resource.getrlimit(resource.RLIMIT_CORE)[1] == 0:
        pytest.skip("the hard core-file limit is 0 here: no process can leave a core file")


def unlimited_core():
    fresh_signals()
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def wait_status(p):
    _, status = os.waitpid(p.pid, 0)
    p.returncode = -1  # reaped here; tell Popen
    return status


@pytest.mark.parametrize("sig", [S.SIGQUIT, S.SIGABRT, S.SIGSEGV], ids=lambda s: s.name)
def test_a_waiting_looplock_killed_by_a_core_signal_leaves_no_core_file(loop_dir, tmp_path, holders, procs, sig):
    core_files_go_to_cwd()
    if SANITIZED and sig == S.SIGSEGV:
        pytest.skip("the sanitizer runtime handles SIGSEGV itself")
    holders(loop_dir)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    p = procs.popen([LOOPLOCK, "-v", "-p", "blocking", str(loop_dir), "--", "true"], cwd=cwd, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=unlimited_core)
    expect_stderr(p, "waiting for")
    os.kill(p.pid, sig)
    status = wait_status(p)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig
    assert not os.WCOREDUMP(status)
    assert list(cwd.iterdir()) == []
    # The control: the same signal, limit and directory give a plain process a core file.
    c = subprocess.Popen(["sleep", "30"], cwd=cwd, preexec_fn=unlimited_core)
    wait_until(lambda: open(f"/proc/{c.pid}/comm").read().strip() == "sleep", "the control to exec sleep")
    os.kill(c.pid, sig)
    control = wait_status(c)
    assert os.WCOREDUMP(control), "no core file even for the control: this test proves nothing here"
    for f in cwd.iterdir():
        f.unlink()


@pytest.mark.parametrize("sig", [S.SIGABRT, S.SIGSEGV, S.SIGBUS, S.SIGQUIT], ids=lambda s: s.name)
def test_a_core_signal_sent_to_a_running_looplock_reaches_the_command_only(loop_dir, tmp_path, procs, sig):
    core_files_go_to_cwd()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    p = procs.popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", PY, SIGWAIT], cwd=cwd,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=unlimited_core)
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, sig)
    assert out.next() == sig.name
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0
    assert list(cwd.iterdir()) == []
