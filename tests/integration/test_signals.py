"""Signals (looplock-jobs(7): SIGNALS; looplock(1): ENVIRONMENT): forwarding to
the command exactly once, dying of the command's signal, signals that end a
wait, the parent-death signal, waiting for the command before releasing,
--kill-after, the inherited signal mask and dispositions, a terminal's ^C and
^Z, and -F.

Every step is a handshake: the command (helpers/print_signals.py) prints
"ready" and then one line per signal it receives, so the test sends a signal
and reads the line that proves it arrived before it goes on. Where a state
change must be awaited (a process disappearing, a lock being freed, a stop),
a bounded poll is used.
"""
import os
import signal
import subprocess
import time

import pytest

from conftest import (
    PRINT_SIGNALS,
    S,
    SIGWAIT,
    Lines,
    children,
    eventually,
    only_child,
    proc_state,
    running,
    fds_on,
    LOOPLOCK,
    PY,
    TIMEOUT,
    incident_rows,
    lock_is_free,
    read_record,
    sig_name,
)


def fd_holds_flock(pid, fd):
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        return any(line.startswith("lock:") and "FLOCK" in line for line in f)


# --- forwarding while the command runs -------------------------------------

FORWARDED = [S.SIGHUP, S.SIGINT, S.SIGQUIT, S.SIGTERM, S.SIGUSR1, S.SIGUSR2, S.SIGALRM, S.SIGPIPE,
             S.SIGVTALRM, S.SIGPROF, S.SIGXCPU, S.SIGXFSZ,
             # Signals whose default action dumps core: looplock must neither die of them nor keep them.
             S.SIGABRT, S.SIGBUS, S.SIGFPE, S.SIGILL, S.SIGSEGV, S.SIGTRAP, S.SIGSYS, S.SIGIO, S.SIGPWR,
             S.SIGSTKFLT,
             signal.SIGRTMIN, signal.SIGRTMIN + 3, signal.SIGRTMAX]


@pytest.mark.parametrize("sig", FORWARDED, ids=sig_name)
def test_signal_reaches_the_command_exactly_once(loop_dir, procs, sig):
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, SIGWAIT, "--origin"])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, sig)
    assert out.next() == f"{sig_name(sig)} user {p.pid}"  # forwarded by looplock
    # A second, different signal as a marker: a duplicate of the first would
    # have been sent before it, so it would show up before the marker
    # (real-time signals queue, so a duplicate cannot merge with the first).
    marker = S.SIGUSR1 if sig == S.SIGUSR2 else S.SIGUSR2
    os.kill(p.pid, marker)
    assert out.next() == f"{sig_name(marker)} user {p.pid}"
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0
    assert lock_is_free(loop_dir)


@pytest.mark.parametrize("sig", [S.SIGTERM, signal.SIGRTMIN], ids=sig_name)
def test_signal_to_looplocks_process_group_reaches_the_command_once(loop_dir, procs, sig):
    """timeout(1) and `kill -- -PGID` signal looplock's whole process group.
    Without a terminal, the command runs in a group of its own, so it gets
    the signal once, forwarded by looplock, and not a second time directly."""
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, SIGWAIT, "--origin"], start_new_session=True)
    out = Lines(p.stdout)
    out.expect("ready")
    command = only_child(p.pid)
    assert os.getpgid(command) != os.getpgid(p.pid)
    os.killpg(os.getpgid(p.pid), sig)
    assert out.next() == f"{sig_name(sig)} user {p.pid}"  # forwarded by looplock
    os.kill(p.pid, S.SIGUSR2)  # marker: a duplicate would show up before it
    assert out.next() == f"SIGUSR2 user {p.pid}"
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0


@pytest.mark.parametrize("sig", [S.SIGTSTP, S.SIGTTIN, S.SIGTTOU, S.SIGCONT, S.SIGWINCH, S.SIGURG],
                         ids=sig_name)
def test_job_control_signal_without_a_terminal_reaches_the_command_once(loop_dir, procs, sig):
    """Without a terminal there is no job control for looplock to mirror:
    these too are passed to the job (whose command here takes them instead of
    stopping), and looplock itself neither stops nor drops them."""
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, SIGWAIT, "--origin", "--job-control"])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, sig)
    assert out.next() == f"{sig_name(sig)} user {p.pid}"
    os.kill(p.pid, S.SIGUSR2)
    assert out.next() == f"SIGUSR2 user {p.pid}"
    assert proc_state(p.pid) != "T"
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0


def test_signals_in_a_burst_each_arrive_once(loop_dir, procs):
    """Several real-time signals in a row, none lost or doubled (they queue)."""
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, SIGWAIT])
    out = Lines(p.stdout)
    out.expect("ready")
    sent = [signal.SIGRTMIN + i for i in (1, 2, 2, 4, 5, 5, 5)]
    for s in sent:
        os.kill(p.pid, s)
    got = [out.next() for _ in sent]
    assert sorted(got) == sorted(sig_name(s) for s in sent)
    os.kill(p.pid, S.SIGUSR1)
    assert out.next() == "SIGUSR1"
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0


@pytest.mark.parametrize("sig", [S.SIGTERM, S.SIGINT], ids=sig_name)
def test_looplock_dies_of_the_signal_that_killed_the_command(loop_dir, procs, sig):
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, PRINT_SIGNALS, "--die"])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, sig)
    assert out.next() == sig_name(sig)
    assert p.wait(timeout=TIMEOUT) == -sig
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is not None


# --- signals while waiting for the lock -----------------------------------

@pytest.mark.parametrize("policy", [["-w", "20"], ["-p", "blocking"]], ids=["mutation", "blocking"])
@pytest.mark.parametrize("sig", [S.SIGINT, S.SIGTERM, S.SIGHUP, S.SIGQUIT], ids=sig_name)
def test_signal_ends_the_wait(loop_dir, tmp_path, holders, procs, sig, policy):
    h = holders(loop_dir)
    before = (loop_dir / ".state.lock").read_text()
    ran = tmp_path / "ran"
    p = procs.start(["-v", *policy, loop_dir, "--", PY, "-c", f"open({str(ran)!r}, 'w')"],
                    cwd=tmp_path)
    Lines(p.stderr).until(lambda line: "waiting for" in line)
    os.kill(p.pid, sig)
    assert p.wait(timeout=TIMEOUT) == -sig
    assert incident_rows(loop_dir) == []
    assert not ran.exists(), "the command ran although the wait was ended"
    assert (loop_dir / ".state.lock").read_text() == before, "the holder record was touched"
    assert not lock_is_free(loop_dir)
    assert h.release() == 0
    assert lock_is_free(loop_dir)


LAUNCHER = r"""
import os, signal, sys
# Start from defaults (Python ignores PIPE and XFSZ, a background job INT
# and QUIT), then block and ignore what the test asks for.
for s in signal.Signals:
    if s not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(s, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_SETMASK, [getattr(signal, n) for n in sys.argv[1].split(",") if n])
for n in sys.argv[2].split(","):
    if n:
        signal.signal(getattr(signal, n), signal.SIG_IGN)
os.execv(sys.argv[3], sys.argv[3:])
"""


def launch(procs, block, ignore, args, **kw):
    """Starts looplock with `block` blocked and `ignore` ignored (comma-separated names)."""
    return procs.popen([PY, "-c", LAUNCHER, block, ignore, LOOPLOCK, *map(str, args)],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_signal_ends_the_wait_even_if_the_caller_blocked_it(loop_dir, tmp_path, holders, procs):
    holders(loop_dir)
    ran = tmp_path / "ran"
    p = launch(procs, "SIGTERM,SIGINT", "", ["-v", "-w", "20", loop_dir, "--", PY, "-c", f"open({str(ran)!r}, 'w')"])
    Lines(p.stderr).until(lambda line: "waiting for" in line)
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=TIMEOUT) == -signal.SIGTERM
    assert incident_rows(loop_dir) == []
    assert not ran.exists()


# --- the command does not outlive looplock -------------------------------

PRINT_PID_AND_WAIT = ("import os, sys; print(os.getpid(), os.environ.get('LOOPLOCK_FD', '-'), flush=True); "
                      "sys.stdin.read()")


@pytest.mark.parametrize("close", [False, True], ids=["inherit-fd", "close-fd"])
def test_kill_9_of_looplock_terminates_the_command_and_frees_the_lock(loop_dir, procs, close):
    lock = loop_dir / ".state.lock"
    p = procs.start([*(["-o"] if close else []), "-p", "blocking", loop_dir, "--", PY, "-c", PRINT_PID_AND_WAIT])
    pid_text, fd_text = Lines(p.stdout).next().split()
    child = int(pid_text)
    procs.extra_pids.append(child)
    assert child in children(p.pid)
    if close:
        assert fd_text == "-" and fds_on(child, lock) == [], "-o: the command must not have the lock fd"
    else:
        # The command shares looplock's open file description, lock included.
        assert fds_on(child, lock) == [int(fd_text)]
        assert fd_holds_flock(child, int(fd_text))
    assert not lock_is_free(loop_dir)

    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert eventually(lambda: not running(child)), f"the command {child} outlived looplock"
    assert eventually(lambda: lock_is_free(loop_dir))


DAEMONIZE = r"""
import os, subprocess, sys
fd = os.environ.get("LOOPLOCK_FD")
d = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                     pass_fds=(int(fd),) if fd else (), stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(os.getpid(), d.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("close", [False, True], ids=["inherit-fd", "close-fd"])
def test_lock_stays_held_while_an_inheritor_of_the_fd_lives(loop_dir, procs, close):
    """The parent-death signal ends the command, but not a daemon it started:
    with the inherited fd the daemon keeps the lock until it is gone; with -o
    the lock dies with looplock."""
    p = procs.start([*(["-o"] if close else []), "-p", "blocking", loop_dir, "--", PY, "-c", DAEMONIZE])
    child, daemon = map(int, Lines(p.stdout).next().split())
    procs.extra_pids += [child, daemon]
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert eventually(lambda: not running(child))
    assert running(daemon)
    if close:
        assert eventually(lambda: lock_is_free(loop_dir))
    else:
        assert not lock_is_free(loop_dir), "the daemon holds the inherited fd, so the lock must still be held"
        os.kill(daemon, signal.SIGKILL)
        assert eventually(lambda: lock_is_free(loop_dir))


# --- waiting for the command before releasing ----------------------------

@pytest.mark.parametrize("sig", [S.SIGTERM, S.SIGINT, S.SIGHUP], ids=sig_name)
def test_lock_stays_held_until_the_command_exits(loop_dir, procs, sig):
    # -o: only looplock holds the lock, so "held" is looplock's doing.
    p = procs.start(["-o", "-p", "blocking", loop_dir, "--", PY, PRINT_SIGNALS])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, sig)
    assert out.next() == sig_name(sig)  # the command got it and keeps running
    assert p.poll() is None
    assert not lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is None
    os.kill(p.pid, S.SIGUSR1)
    assert out.next() == "SIGUSR1"
    assert p.poll() is None
    assert not lock_is_free(loop_dir)
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is not None


# --- --kill-after -----------------------------------------------------------

@pytest.mark.parametrize("sig", [S.SIGTERM, S.SIGINT], ids=sig_name)
def test_kill_after_kills_a_command_that_ignores_the_signal(loop_dir, procs, sig):
    p = procs.start(["--kill-after", "0.5", "-p", "blocking", loop_dir, "--", PY, PRINT_SIGNALS])
    out = Lines(p.stdout)
    out.expect("ready")
    child = only_child(p.pid)
    t0 = time.monotonic()
    os.kill(p.pid, sig)
    assert out.next() == sig_name(sig)
    assert p.wait(timeout=10) == -signal.SIGKILL
    elapsed = time.monotonic() - t0
    assert 0.45 <= elapsed < 5, f"KILL came {elapsed:.3f} s after {sig_name(sig)}, expected ~0.5 s"
    assert eventually(lambda: not running(child))
    assert lock_is_free(loop_dir)


def test_without_kill_after_the_command_keeps_running(loop_dir, procs):
    p = procs.start(["-p", "blocking", loop_dir, "--", PY, PRINT_SIGNALS])
    out = Lines(p.stdout)
    out.expect("ready")
    os.kill(p.pid, signal.SIGTERM)
    assert out.next() == "SIGTERM"
    # A negative check needs a bound: well past the 0.5 s used above.
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=1.5)
    os.kill(p.pid, signal.SIGUSR1)
    assert out.next() == "SIGUSR1"
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0


# --- inherited signal mask and dispositions -------------------------------

SHOW_SIGNAL_STATE = ("import sys\n"
                     "for line in open('/proc/self/status'):\n"
                     "    if line.startswith(('SigBlk:', 'SigIgn:')): print(line.strip())\n"
                     "sys.exit(7)\n")


def signal_set(hexmask):
    mask = int(hexmask, 16)
    return {n for n in range(1, 65) if mask & (1 << (n - 1))}


def command_signal_state(procs, loop_dir, block, ignore, extra=()):
    p = launch(procs, block, ignore, [*extra, loop_dir, "--", PY, "-c", SHOW_SIGNAL_STATE])
    out, err = p.communicate(timeout=TIMEOUT)
    # SIGCHLD ignored by the caller must not stop looplock from seeing the exit status.
    assert p.returncode == 7, err
    fields = dict(line.decode().split(":\t") for line in out.splitlines())
    return signal_set(fields["SigBlk"]), signal_set(fields["SigIgn"])


@pytest.mark.parametrize("extra", [[], ["-F"]], ids=["fork", "no-fork"])
def test_command_starts_with_the_inherited_mask_and_dispositions(loop_dir, procs, extra):
    blocked, ignored = command_signal_state(procs, loop_dir, "SIGUSR1", "SIGHUP,SIGCHLD", extra)
    assert blocked == {signal.SIGUSR1}
    assert signal.SIGHUP in ignored
    assert signal.SIGCHLD in ignored


@pytest.mark.parametrize("extra", [[], ["-F"]], ids=["fork", "no-fork"])
def test_looplocks_own_signal_handling_does_not_leak_into_the_command(loop_dir, procs, extra):
    blocked, ignored = command_signal_state(procs, loop_dir, "", "", extra)
    assert blocked == set()
    assert signal.SIGHUP not in ignored
    assert signal.SIGCHLD not in ignored


# --- a terminal: ^C, ^\ and ^Z --------------------------------------------

@pytest.mark.parametrize("key,sig", [(b"\x03", S.SIGINT), (b"\x1c", S.SIGQUIT)], ids=["ctrl-c", "ctrl-backslash"])
def test_terminal_signal_reaches_the_command_once(loop_dir, pty_job, key, sig):
    job = pty_job(["-p", "blocking", loop_dir, "--", PY, SIGWAIT, "--origin"])
    job.out.expect("ready")
    # The terminal signals the whole foreground group; looplock must not send
    # it again (that copy would read "user <looplock's pid>"). A second copy
    # can merge with the first if it arrives before the command took it, so a
    # few rounds make a doubling bug show up reliably.
    for _ in range(5):
        job.type(key)
        assert job.out.next() == f"{sig_name(sig)} kernel"
        os.kill(job.pid, signal.SIGUSR1)  # the marker: looplock forwards it
        assert job.out.next() == f"SIGUSR1 user {job.pid}"
    job.type(b"\x04")  # ^D: end of input, the command exits 0
    assert job.out.rest() == []
    assert job.status() == "pty_job: exit 0"
    assert lock_is_free(loop_dir)


def test_job_control_stops_and_resumes_looplock_and_the_command(loop_dir, pty_job):
    job = pty_job(["-p", "blocking", loop_dir, "--", PY, PRINT_SIGNALS])
    job.out.expect("ready")
    command = only_child(job.pid)
    job.type(b"\x1a")  # ^Z
    assert job.err.until(lambda line: line.startswith("pty_job: stopped")) == f"pty_job: stopped {int(S.SIGTSTP)}"
    assert eventually(lambda: proc_state(job.pid) == "T" and proc_state(command) == "T"), \
        (proc_state(job.pid), proc_state(command))
    assert not lock_is_free(loop_dir)
    os.killpg(job.pid, signal.SIGCONT)  # fg
    assert eventually(lambda: proc_state(job.pid) in ("S", "R") and proc_state(command) in ("S", "R")), \
        (proc_state(job.pid), proc_state(command))
    os.kill(job.pid, signal.SIGUSR1)
    assert job.out.next() == "SIGUSR1"
    job.type(b"\x04")
    assert job.out.rest() == []
    assert job.status() == "pty_job: exit 0"
    assert lock_is_free(loop_dir)


# --- -F / --no-fork --------------------------------------------------------

RUN_PRINT_SIGNALS_WITH_PID = ("import os, runpy, sys; print(os.getpid(), flush=True); "
                              f"sys.argv = [{PRINT_SIGNALS!r}]; runpy.run_path({PRINT_SIGNALS!r}, run_name='__main__')")


def test_no_fork_the_command_replaces_looplock(loop_dir, procs):
    p = procs.start(["-F", "-p", "blocking", loop_dir, "--", PY, "-c", RUN_PRINT_SIGNALS_WITH_PID])
    out = Lines(p.stdout)
    assert int(out.next()) == p.pid
    out.expect("ready")
    assert children(p.pid) == []
    record = read_record(loop_dir)
    assert record["pid"] == p.pid and record["released_at"] is None
    for sig in (S.SIGUSR1, S.SIGTERM, signal.SIGRTMIN + 2):
        os.kill(p.pid, sig)
        assert out.next() == sig_name(sig)
    assert p.poll() is None
    assert not lock_is_free(loop_dir)
    p.stdin.close()
    assert out.rest() == []
    assert p.wait(timeout=TIMEOUT) == 0
    assert lock_is_free(loop_dir)
    assert read_record(loop_dir)["released_at"] is None  # -F writes no release
