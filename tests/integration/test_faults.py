"""Faults: the loop directory or the lock file disappearing under looplock,
an EINTR storm, a full disk, a file size limit, a network file system, and a
lock leaked to a background process. In each, looplock keeps its contract:
the documented exit status, a clear "looplock: ..." message, no lost update,
no second holder running silently.

Covers: DIR removed (rm -rf) or replaced while held (74, or the command's
failing status); DIR removed, moved or replaced while a waiter waits (the
waiter never runs on the old directory's lock file); an outsider unlinking
the lock file in a loop while looplock runs back to back (overlaps only
where reported, never on one inode); flock(2) EINTR storms injected by
strace (-w still ends on time; -p blocking acquires once the storm passes,
and an endless storm leaves it waiting but TERM ends it); a full tmpfs (the
incident append and the record write fail with one warning each, the
timeout and the run are unchanged); RLIMIT_FSIZE with SIGXFSZ at its
default or ignored (looplock never dies of SIGXFSZ; the command still gets
the disposition looplock inherited); fstatfs(2) saying NFS (one warning,
-q hides it, --inspect reports it; a control without it); a lock leaked to
a background process (the lock_leaked warning naming its pid, none with -o
or when the background process closed the fd, and --inspect naming it as
the real holder).

Some cases need root (mount, strace); they skip with the reason otherwise.
The network-file-system case fakes fstatfs(2): through the LD_PRELOAD shim
tests/integration/shim/fake_statfs.c (built by meson, path in
$FAKE_STATFS_SO) for a dynamically linked looplock, or through strace's
poke_exit for any build.
"""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import fill_disk
from conftest import (SANITIZED, EX_CANTCREAT, EX_NOINPUT, EX_OSERR, EX_TEMPFAIL, EX_VANISHED, LOOPLOCK, PY, TIMEOUT, eventually,
                      expect_line, expect_stderr, flock_holder, helper, incident_rows, kill_and_wait_gone, lock_is_free,
                      read_record, release, run, start)

SIGWAIT_HELPER = helper("sigwait_print.py")

LOCK = ".state.lock"
INCIDENTS = ".state.lock.incidents.jsonl"


# --- helpers -------------------------------------------------------------------


def looplock_lines(stderr):
    lines = stderr.splitlines()
    assert all(l.startswith("looplock: ") for l in lines), stderr
    return lines


def read_line(stream, timeout=TIMEOUT):
    """One line from a pipe, or "" when none comes within timeout."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    if not sel.select(timeout=timeout):
        return ""
    return stream.readline()


def need_strace():
    if not shutil.which("strace"):
        pytest.skip("strace is not installed (scripts/packages.txt lists it)")
    probe = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=none", "true"],
                           capture_output=True, text=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()}")


# --- DIR removed while held ----------------------------------------------------------


@pytest.mark.parametrize("close", [False, True], ids=["inherit-fd", "close-fd"])
def test_dir_removed_mid_hold_is_74(tmp_path, loop_dir, close):
    (loop_dir / "state").write_text("1")
    r = run([*(["-o"] if close else []), loop_dir, "--", "rm", "-rf", loop_dir])
    assert r.returncode == EX_VANISHED, r.stderr
    lines = looplock_lines(r.stderr)
    assert any("loop dir vanished mid-lock" in l for l in lines), r.stderr
    assert not loop_dir.exists(), "looplock never creates DIR"
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("code", [3, 74, 75])
def test_dir_removed_mid_hold_but_command_failed_keeps_its_status(loop_dir, code):
    r = run([loop_dir, "--", "sh", "-c", f'rm -rf "$LOOPLOCK_DIR"; exit {code}'])
    assert r.returncode == code, r.stderr
    assert "loop dir vanished mid-lock" in r.stderr
    looplock_lines(r.stderr)
    assert not loop_dir.exists()


def test_dir_removed_and_recreated_mid_hold_is_74(loop_dir):
    r = run([loop_dir, "--", "sh", "-c", 'rm -rf "$LOOPLOCK_DIR" && mkdir "$LOOPLOCK_DIR"'])
    assert r.returncode == EX_VANISHED, r.stderr
    assert "loop dir vanished mid-lock" in r.stderr
    assert os.listdir(loop_dir) == [], "looplock must not write into the new DIR after the fact"


DIR_ACTIONS = {
    "removed": 'rm -rf "$LOOPLOCK_DIR"',
    "moved": 'mv "$LOOPLOCK_DIR" "$LOOPLOCK_DIR.old"',
    "removed_and_recreated": 'rm -rf "$LOOPLOCK_DIR" && mkdir "$LOOPLOCK_DIR"',
    "moved_and_recreated": 'mv "$LOOPLOCK_DIR" "$LOOPLOCK_DIR.old" && mkdir "$LOOPLOCK_DIR"',
}
# The waiter's command: which lock file does it hold, and which one does the
# path DIR/.state.lock name now?
WHICH_LOCK = 'echo ran $(stat -L -c %i "/proc/self/fd/$LOOPLOCK_FD") $(stat -c %i "$LOOPLOCK_DIR/.state.lock")'


def waiter_behind_a_dir_remover(loop_dir, action):
    """A holder that removes or moves DIR (and maybe creates it anew) while a
    looplock waiter is blocked on the old lock file. Returns the waiter's
    (status, stdout, stderr)."""
    script = "echo ready; read x; " + DIR_ACTIONS[action]
    h = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "sh", "-c", script],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    w = None
    try:
        expect_line(h, "ready")
        w = subprocess.Popen([LOOPLOCK, "-v", "-w", "10", str(loop_dir), "--", "sh", "-c", WHICH_LOCK],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The waiter is blocked once it says so (-v: "waiting for ...").
        first = read_line(w.stderr)
        assert first.startswith("looplock: waiting for"), f"the waiter did not wait: {first!r}"
        h.stdin.close()
        assert h.wait(timeout=TIMEOUT) == EX_VANISHED
        out, err = w.communicate(timeout=TIMEOUT)
        return w.returncode, out, first + err
    finally:
        for p in (h, w):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=TIMEOUT)


@pytest.mark.parametrize("action", ["removed", "moved"])
def test_waiter_when_dir_is_gone_fails_cleanly(loop_dir, action):
    """DIR is gone from its path when the waiter gets its turn: the waiter
    must not run the command (least of all on the lock file in the moved
    directory: the man page, "it never runs the command on a lock that no longer protects DIR"),
    must create nothing, and must say so in one clean error (66: DIR is
    missing, as for a run started now; 73 is tolerated: the lock file cannot
    be created)."""
    status, out, err = waiter_behind_a_dir_remover(loop_dir, action)
    assert out == "", f"the command ran on an orphaned lock file: {out!r}"
    assert status in (EX_NOINPUT, EX_CANTCREAT), (status, err)
    looplock_lines(err)
    assert not loop_dir.exists()


@pytest.mark.parametrize("action", ["removed_and_recreated", "moved_and_recreated"])
def test_waiter_when_dir_is_replaced_locks_the_new_dir(loop_dir, action):
    """DIR was replaced by a new directory while a waiter waited: as for a
    lock file replaced meanwhile (the man page: "retries on the new file within the same deadline"),
    the waiter must lock DIR/.state.lock as the path now names it and run
    there; never on the old directory's lock file (another looplock started
    now would lock the new one: two holders), nor fail for a directory that
    exists."""
    status, out, err = waiter_behind_a_dir_remover(loop_dir, action)
    assert status == 0, (status, out, err)
    word, held, at_path = out.split()
    assert word == "ran"
    assert held == at_path, "the command ran holding a lock file the path no longer names"
    looplock_lines(err)
    assert f"{loop_dir} was moved, deleted or replaced while looplock waited for its lock" in err, err
    rec = read_record(loop_dir)
    assert rec is not None and rec["released_at"] is not None


# --- an outsider deleting the lock file in a loop ------------------------------------

INTERVAL_TICK = r"""
import os, sys, time
fd = int(os.environ["LOOPLOCK_FD"])
ino = os.fstat(fd).st_ino
t0 = time.monotonic_ns()
time.sleep(float(sys.argv[2]))
t1 = time.monotonic_ns()
line = f"{os.getppid()} {ino} {t0} {t1}\n".encode()
out = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(out, line)
os.close(out)
"""


def test_outsider_deleting_the_lock_file_never_lets_two_run_silently(tmp_path, loop_dir):
    """While a process unlinks DIR/.state.lock in a loop, looplock processes
    run back to back (3 at a time). Two commands may then overlap (the lock
    was broken by the outsider), but never on one inode, and never silently:
    of every two overlapping runs, at least one reports "loop dir vanished
    mid-lock" (74). Runs report nothing else than that or "replaced"."""
    log = tmp_path / "intervals"
    lock = loop_dir / LOCK
    stop = threading.Event()
    deletions = [0]

    def deleter():
        rnd = random.Random(4)
        while not stop.is_set():
            try:
                os.unlink(lock)
                deletions[0] += 1
            except FileNotFoundError:
                pass
            time.sleep(rnd.uniform(0.002, 0.04))

    results = []
    results_lock = threading.Lock()

    def worker(n):
        for _ in range(n):
            p = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", PY, "-c", INTERVAL_TICK,
                                  str(log), "0.02"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = p.communicate(timeout=TIMEOUT)
            with results_lock:
                results.append((p.pid, p.returncode, err))

    d = threading.Thread(target=deleter)
    d.start()
    workers = [threading.Thread(target=worker, args=(12,)) for _ in range(3)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=120)
    finally:
        stop.set()
        d.join(timeout=TIMEOUT)
    assert not any(w.is_alive() for w in workers)
    assert len(results) == 36

    by_pid = {}
    for pid, rc, err in results:
        lines = looplock_lines(err)
        assert rc in (0, EX_VANISHED), (rc, err)
        vanished = any("loop dir vanished mid-lock" in l for l in lines)
        assert vanished == (rc == EX_VANISHED), err
        for l in lines:
            assert "vanished mid-lock" in l or "deleted or replaced" in l or "never delete" in l, l
        by_pid[pid] = vanished
    intervals = []
    for line in log.read_text().splitlines():
        pid, ino, t0, t1 = map(int, line.split())
        intervals.append((pid, ino, t0, t1))
    assert sorted(i[0] for i in intervals) == sorted(by_pid), "every run's command ran exactly once"

    overlaps = 0
    for i, (p1, ino1, a1, b1) in enumerate(intervals):
        for p2, ino2, a2, b2 in intervals[i + 1:]:
            if a1 < b2 and a2 < b1:
                overlaps += 1
                assert ino1 != ino2, f"runs {p1} and {p2} held the same inode {ino1} at once"
                assert by_pid[p1] or by_pid[p2], f"runs {p1} and {p2} overlapped and neither reported it"
    # The test must have exercised something: the outsider hit held locks.
    assert deletions[0] > 10
    assert sum(by_pid.values()) >= 1, "no run saw its lock file vanish: the test exercised nothing"


# --- EINTR storms --------------------------------------------------------------


def strace_prefix(inject, trace="/dev/null"):
    return ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=flock", "-e", f"inject=flock:{inject}"]


def storm_started(trace):
    """Handshake: strace has faked at least one flock(2) (looplock waits)."""
    return eventually(lambda: trace.exists() and "INJECTED" in trace.read_text(errors="replace"))


def test_eintr_storm_does_not_stretch_the_deadline(loop_dir):
    """Every flock(2) after the first fails with EINTR: -w 0.3 still ends at
    about 0.3 s with 75, one incident row and the usual lines."""
    need_strace()
    h = flock_holder(loop_dir / LOCK)
    try:
        t0 = time.monotonic()
        r = subprocess.run([*strace_prefix("error=EINTR:when=2+"), LOOPLOCK, "-w", "0.3", str(loop_dir), "--",
                            "touch", str(loop_dir / "ran")], capture_output=True, text=True, timeout=TIMEOUT)
        elapsed = time.monotonic() - t0
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    assert "lock_acquire_timeout" in r.stderr
    looplock_lines(r.stderr)
    assert not (loop_dir / "ran").exists()
    assert len(incident_rows(loop_dir)) == 1


def test_eintr_storm_blocking_still_acquires_after_release(tmp_path, loop_dir):
    """A storm of slow EINTRs (20 ms each, for about 1.2 s) while the holder
    holds and after it released: once the storm passes, -p blocking takes the
    lock and runs the command."""
    need_strace()
    trace = tmp_path / "trace"
    h = flock_holder(loop_dir / LOCK)
    p = subprocess.Popen([*strace_prefix("error=EINTR:delay_exit=20000:when=2..60", trace), LOOPLOCK, "-p",
                          "blocking", str(loop_dir), "--", "sh", "-c", "echo ran"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert storm_started(trace), "looplock never waited"
        assert p.poll() is None, "the waiter must wait while the lock is held"
        release(h)
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
        release(h)
    assert p.returncode == 0, err
    assert out == "ran\n"
    assert err == ""


def child_pids(pid):
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def test_endless_eintr_storm_under_blocking_waits_and_ends_on_term(tmp_path, loop_dir):
    """With every flock(2) but the first faked to EINTR (strace never lets
    the call reach the kernel), -p blocking cannot acquire even after the
    holder released: it keeps waiting (it never runs the command unlocked),
    and TERM still ends the wait at once, as the man page says for a waiter."""
    need_strace()
    trace = tmp_path / "trace"
    h = flock_holder(loop_dir / LOCK)
    marker = loop_dir / "ran"
    p = subprocess.Popen([*strace_prefix("error=EINTR:when=2+", trace), LOOPLOCK, "-p", "blocking", str(loop_dir),
                          "--", "touch", str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert storm_started(trace), "looplock never waited"
        (looplock_pid,) = child_pids(p.pid)
        release(h)
        time.sleep(0.5)
        assert p.poll() is None and not marker.exists()
        os.kill(looplock_pid, signal.SIGTERM)
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
        release(h)
    assert not marker.exists()
    assert incident_rows(loop_dir) == []
    assert lock_is_free(loop_dir)


# --- a full disk ------------------------------------------------------------------


def test_full_disk_incident_append_warns_and_times_out_on_time(tmpfs):
    mnt = tmpfs("64k")
    d = mnt / "loop"
    d.mkdir(mode=0o755)
    (d / LOCK).write_bytes(b"")
    fill_disk(mnt)
    h = flock_holder(d / LOCK)
    try:
        t0 = time.monotonic()
        r = run(["-w", "0.3", d, "--", "touch", mnt / "ran"])
        elapsed = time.monotonic() - t0
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    lines = looplock_lines(r.stderr)
    assert any("lock_acquire_timeout" in l for l in lines)
    warnings = [l for l in lines if "cannot append the incident row" in l]
    assert len(warnings) == 1 and "No space left on device" in warnings[0], r.stderr
    assert not (d / INCIDENTS).exists() or (d / INCIDENTS).read_bytes() == b"", "no partial row"


def test_a_row_cut_short_by_a_full_disk_never_corrupts_the_next_one(tmpfs):
    """The incidents file's last page has 60 bytes free and the file system
    none: the row is cut there (no newline). Once there is room again, the
    next row starts on a line of its own."""
    mnt = tmpfs("64k")
    d = mnt / "loop"
    d.mkdir(mode=0o755)
    (d / LOCK).write_bytes(b"")
    row = json.dumps({"note": "x" * 10}) + "\n"
    (d / INCIDENTS).write_text(row + "#" * (4096 - 60 - len(row) - 1) + "\n")
    fill_disk(mnt)
    h = flock_holder(d / LOCK)
    try:
        r = run(["-w", "0.1", d, "--", "true"])
        assert r.returncode == EX_TEMPFAIL, r.stderr
        assert "cannot append the incident row" in r.stderr
        assert "No space left on device" in r.stderr, r.stderr  # the cause, not "Input/output error"
        data = (d / INCIDENTS).read_bytes()
        assert len(data) == 4096 and not data.endswith(b"\n"), len(data)
        (mnt / "filler").unlink()
        r = run(["-w", "0.1", d, "--", "true"])
        assert r.returncode == EX_TEMPFAIL, r.stderr
    finally:
        release(h)
    lines = (d / INCIDENTS).read_text().split("\n")
    assert lines[-1] == "" and len(lines[-3]) == 60, lines[-3:]
    assert json.loads(lines[-2])["error_code"] == "lock_acquire_timeout"
    obj = json.loads(run(["--inspect", "--json", d]).stdout)
    assert obj["incidents"]["latest"]["error_code"] == "lock_acquire_timeout"


def test_full_disk_record_write_warns_and_the_command_runs(tmpfs):
    mnt = tmpfs("64k")
    d = mnt / "loop"
    d.mkdir(mode=0o755)
    (d / LOCK).write_bytes(b"")
    fill_disk(mnt)
    r = run([d, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    lines = looplock_lines(r.stderr)
    assert len(lines) == 1 and "holder record" in lines[0] and "No space left on device" in lines[0], r.stderr
    assert lock_is_free(d)


# --- RLIMIT_FSIZE ------------------------------------------------------------------


def limited(fsize, xfsz):
    import resource

    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        signal.signal(signal.SIGXFSZ, xfsz)

    return pre


@pytest.mark.parametrize("xfsz", [signal.SIG_DFL, signal.SIG_IGN], ids=["SIGXFSZ-default", "SIGXFSZ-ignored"])
def test_file_size_limit_on_incident_append_still_times_out(loop_dir, xfsz):
    """RLIMIT_FSIZE below the size of the incidents file: the append fails
    (EFBIG, and SIGXFSZ unless ignored). looplock must still exit 75 on time
    with one warning, not die of SIGXFSZ."""
    row = json.dumps({"schema": "file_lock_incident_v0", "note": "x" * 200}) + "\n"
    big = row * (64 * 1024 // len(row) + 1)
    (loop_dir / INCIDENTS).write_text(big)
    h = flock_holder(loop_dir / LOCK)
    try:
        t0 = time.monotonic()
        r = subprocess.run([LOOPLOCK, "-w", "0.3", str(loop_dir), "--", "true"], capture_output=True, text=True,
                           timeout=TIMEOUT, preexec_fn=limited(1024, xfsz))
        elapsed = time.monotonic() - t0
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, (r.returncode, r.stderr)
    assert 0.25 <= elapsed < 3.0, elapsed
    lines = looplock_lines(r.stderr)
    assert any("lock_acquire_timeout" in l for l in lines)
    warnings = [l for l in lines if "cannot append the incident row" in l]
    assert len(warnings) == 1 and "File too large" in warnings[0], r.stderr
    assert (loop_dir / INCIDENTS).read_text() == big


@pytest.mark.parametrize("xfsz", [signal.SIG_DFL, signal.SIG_IGN], ids=["SIGXFSZ-default", "SIGXFSZ-ignored"])
def test_file_size_limit_on_record_write_still_runs_the_command(loop_dir, xfsz):
    """RLIMIT_FSIZE smaller than a holder record: the record cannot be
    written; looplock warns once and runs the command (SIGXFSZ, if not
    ignored, must not kill looplock while it holds the lock)."""
    r = subprocess.run([LOOPLOCK, str(loop_dir), "--", "echo", "ran"], capture_output=True, text=True,
                       timeout=TIMEOUT, preexec_fn=limited(10, xfsz))
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout == "ran\n"
    lines = looplock_lines(r.stderr)
    assert len(lines) == 1 and "holder record" in lines[0] and "File too large" in lines[0], r.stderr
    assert lock_is_free(loop_dir)
    i = run(["--inspect", "--json", loop_dir])
    assert i.returncode == 0, i.stderr
    obj = json.loads(i.stdout)
    assert obj["kernel"]["held"] is False


def test_command_still_gets_sigxfsz_default(loop_dir):
    """Control for the above: whatever looplock does with SIGXFSZ for itself,
    the command starts with the disposition looplock inherited (default here)
    and dies of SIGXFSZ when it exceeds the limit; looplock dies likewise."""
    r = subprocess.run([LOOPLOCK, "-o", str(loop_dir), "--", "sh", "-c", 'head -c 100 /dev/zero > "$1"', "sh",
                        str(loop_dir / "big")], capture_output=True, text=True, timeout=TIMEOUT,
                       preexec_fn=limited(4096 * 4, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr  # 100 bytes fit
    r = subprocess.run([LOOPLOCK, "-o", str(loop_dir), "--", "sh", "-c", 'exec head -c 100000 /dev/zero > "$1"', "sh",
                        str(loop_dir / "big")], capture_output=True, text=True, timeout=TIMEOUT,
                       preexec_fn=limited(4096 * 4, signal.SIG_DFL))
    assert r.returncode == -signal.SIGXFSZ, (r.returncode, r.stderr)


# --- network file systems ------------------------------------------------------------

NFS_WARNING = "network file system"


def is_dynamic(path):
    """Whether the ELF executable has a PT_INTERP (is dynamically linked)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return False
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return any(struct.unpack_from("<I", table, i * phentsize)[0] == 3 for i in range(phnum))


def shim_path(tmp_path):
    so = os.environ.get("FAKE_STATFS_SO")
    if so and Path(so).exists():
        return so
    src = Path(__file__).resolve().parent / "shim" / "fake_statfs.c"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no FAKE_STATFS_SO and no C compiler to build the shim")
    so = tmp_path / "fake_statfs.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src), "-ldl"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    if r.returncode != 0:
        pytest.skip(f"cannot build the shim: {r.stderr.strip()}")
    return str(so)


@pytest.fixture(params=["preload", "strace"])
def fake_nfs(request, tmp_path):
    """fake_nfs(args, nfs=True) -> CompletedProcess: runs looplock with
    fstatfs(2) reporting NFS (or, nfs=False, the same machinery as a control
    that changes nothing)."""
    if request.param == "preload":
        if not is_dynamic(LOOPLOCK):
            pytest.skip("looplock is statically linked: LD_PRELOAD cannot reach its fstatfs "
                        "(the strace variant covers it; -Dstatic_link=false builds one the shim reaches)")
        so = shim_path(tmp_path)

        def go(args, nfs=True, **kw):
            env = {"LD_PRELOAD": so}
            if nfs:
                env["FAKE_FSTYPE_NFS"] = "1"
            return run(args, env=env, **kw)
    else:
        need_strace()
        import platform

        if platform.machine() not in ("x86_64", "aarch64"):
            pytest.skip("the poke writes a 64-bit little-endian f_type")

        def go(args, nfs=True, **kw):
            poke = ["-e", "inject=fstatfs:poke_exit=@arg2=6969000000000000"] if nfs else []
            return subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=fstatfs", *poke,
                                   LOOPLOCK, *map(str, args)], capture_output=True, text=True,
                                  timeout=TIMEOUT, **kw)
    return go


def test_network_file_system_warns_once_and_works(loop_dir, fake_nfs):
    r = fake_nfs([loop_dir, "--", "sh", "-c", 'cat "$LOOPLOCK_DIR/.state.lock"'])
    assert r.returncode == 0, r.stderr
    lines = looplock_lines(r.stderr)
    assert len(lines) == 1 and NFS_WARNING in lines[0] and "(nfs)" in lines[0], r.stderr
    assert json.loads(r.stdout)["released_at"] is None
    assert read_record(loop_dir)["released_at"] is not None

    # -q hides the warning; the run is the same.
    q = fake_nfs(["-q", loop_dir, "--", "true"])
    assert q.returncode == 0 and q.stderr == "", q.stderr
    # --log-format json: one line, event network_file_system.
    j = fake_nfs(["--log-format", "json", loop_dir, "--", "true"])
    assert j.returncode == 0
    (obj,) = [json.loads(l) for l in j.stderr.splitlines()]
    assert obj["event"] == "network_file_system"
    # --inspect says so too.
    i = fake_nfs(["--inspect", "--json", loop_dir])
    assert i.returncode == 0, i.stderr
    rep = json.loads(i.stdout)
    assert rep["network_fs"] == "nfs"
    assert any(NFS_WARNING in w for w in rep["warnings"]), rep["warnings"]


def test_network_file_system_warning_with_a_timeout(loop_dir, fake_nfs):
    h = flock_holder(loop_dir / LOCK)
    try:
        r = fake_nfs(["-w", "0.2", loop_dir, "--", "true"])
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    lines = looplock_lines(r.stderr)
    assert len([l for l in lines if NFS_WARNING in l]) == 1, r.stderr
    assert any("lock_acquire_timeout" in l for l in lines)


def test_local_file_system_has_no_warning(loop_dir, fake_nfs):
    """Control: the same machinery without the fake NFS type warns nothing."""
    r = fake_nfs([loop_dir, "--", "true"], nfs=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    i = fake_nfs(["--inspect", "--json", loop_dir], nfs=False)
    assert json.loads(i.stdout)["network_fs"] is None


# --- a lock leaked to a background process ----------------------------------------------


@pytest.fixture
def daemons():
    pids = []
    yield pids
    for pid in pids:
        kill_and_wait_gone(pid)


def test_leaked_lock_is_reported_and_inspect_names_the_real_holder(loop_dir, daemons):
    r = run([loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)])
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert r.returncode == 0, r.stderr
    lines = looplock_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert f"pid {daemon}" in lines[0] and "--close" in lines[0], lines[0]
    assert not lock_is_free(loop_dir), "the daemon keeps the lock"

    # --inspect: the kernel names looplock's (exited) pid; the report names
    # the daemon as the process really holding it.
    t = run(["--inspect", loop_dir])
    assert t.returncode == 0, t.stderr
    assert str(daemon) in t.stdout, t.stdout
    assert "-o/--close" in t.stdout or "--close" in t.stdout, t.stdout
    j = run(["--inspect", "--json", loop_dir])
    obj = json.loads(j.stdout)
    assert obj["kernel"]["held"] is True
    assert obj["kernel"]["fd_holder_pids"] == [daemon]
    assert obj["kernel"]["holder_pids"] and daemon not in obj["kernel"]["holder_pids"]

    kill_and_wait_gone(daemon)
    assert eventually(lambda: lock_is_free(loop_dir))
    obj = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    assert obj["kernel"]["held"] is False and obj["kernel"]["fd_holder_pids"] == []


def test_leaked_lock_json_event(loop_dir, daemons):
    r = run(["--log-format", "json", loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)])
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert r.returncode == 0, r.stderr
    (obj,) = [json.loads(l) for l in r.stderr.splitlines()]
    assert obj["event"] == "lock_leaked"
    assert obj["pids"] == [daemon]


def test_max_time_hint_tells_the_truth_about_a_leaked_lock(loop_dir, daemons):
    """--max-time ends the job's process group; a process the job started in
    a session of its own escapes it and keeps the inherited lock. The
    max_time_exceeded line then must not say the lock was released."""
    def ended_by_max_time(command):
        r = run(["--max-time", "1", "--kill-after", "0.5", "--log-format", "json", loop_dir, "--",
                 "sh", "-c", command])
        assert r.returncode == 124, r.stderr
        events = {json.loads(l)["event"]: json.loads(l) for l in r.stderr.splitlines()}
        return r, events

    r, events = ended_by_max_time(f"'{PY}' '{helper('spawn_daemon.py')}' {TIMEOUT}; exec sleep 60")
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert events["lock_leaked"]["pids"] == [daemon]
    hint = events["max_time_exceeded"]["hint"]
    assert "stays held" in hint and "released" not in hint, hint
    assert not lock_is_free(loop_dir)
    kill_and_wait_gone(daemon)
    assert eventually(lambda: lock_is_free(loop_dir))

    # The control: nothing left behind, and the lock was released.
    _, events = ended_by_max_time("exec sleep 60")
    assert "lock_leaked" not in events
    assert "the lock was released" in events["max_time_exceeded"]["hint"]
    assert lock_is_free(loop_dir)


def test_close_leaks_nothing_and_warns_nothing(loop_dir, daemons):
    r = run(["-o", loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)])
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert lock_is_free(loop_dir)
    obj = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    assert obj["kernel"]["held"] is False and obj["kernel"]["fd_holder_pids"] == []


def test_background_process_without_the_fd_is_no_leak(loop_dir, daemons):
    """Control: a background process that closed the inherited fd holds
    nothing, so there is no warning (the warning is about the lock, not about
    background processes)."""
    code = ("import os, subprocess, sys\nfd = int(os.environ['LOOPLOCK_FD'])\n"
            "p = subprocess.Popen(['sleep', sys.argv[1]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,"
            " stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)\nprint(p.pid, flush=True)\n")
    r = run([loop_dir, "--", PY, "-c", code, str(TIMEOUT)])
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert lock_is_free(loop_dir)


def test_leaked_lock_warning_is_not_hidden_by_quiet(loop_dir, daemons):
    """-q hides warnings, not this one: the lock stays held after looplock."""
    r = run(["-q", loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)])
    daemon = int(r.stdout)
    daemons.append(daemon)
    assert r.returncode == 0, r.stderr
    (line,) = looplock_lines(r.stderr)
    assert f"pid {daemon}" in line and "still holds" in line, line


def test_next_run_names_the_process_that_really_holds_the_lock(loop_dir, daemons):
    """looplock released normally, but a daemon its command started keeps
    the descriptor: the kernel still names looplock (which has exited); the
    next run's timeout line and incident row name the daemon."""
    first = start([loop_dir, "--", PY, helper("spawn_daemon.py"), str(TIMEOUT)], stdin=subprocess.DEVNULL)
    out, err = first.communicate(timeout=TIMEOUT)
    daemon = int(out)
    daemons.append(daemon)
    r = run(["-w", "0.2", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert f"by pid {daemon} (sleep), left holding the lock by looplock pid {first.pid}" in r.stderr, r.stderr
    (row,) = incident_rows(loop_dir)
    assert row["holder_pids"] == [daemon]
    assert row["holder"]["pid"] == first.pid


def test_next_run_names_what_a_killed_looplock_left_holding_the_lock(loop_dir, daemons):
    """looplock killed with KILL: its command (sh) dies with it (parent-death
    signal), but the sleep that sh started keeps the lock through the
    inherited descriptor. The record still says looplock holds it."""
    p = start(["-p", "blocking", loop_dir, "-c", "sleep 30 & echo $!; wait"], stdin=subprocess.DEVNULL)
    sleeper = int(read_line(p.stdout))
    daemons.append(sleeper)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=TIMEOUT)
    r = run(["-w", "0.2", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert (f"by pid {sleeper} (sleep), left holding the lock by looplock pid {p.pid} " in r.stderr
            and "which has exited" in r.stderr), r.stderr
    (row,) = incident_rows(loop_dir)
    assert row["holder_pids"] == [sleeper]
    assert row["holder"]["pid"] == p.pid and row["holder_alive"] is False


# --- a short incident write ---------------------------------------------------------


def test_a_row_cut_short_never_corrupts_the_next_one(loop_dir, holders):
    """RLIMIT_FSIZE cuts one row short (no newline); the next timeout's row
    still starts on a line of its own, and readers count the damaged line."""
    holders(loop_dir, tool="flock")
    incidents = loop_dir / INCIDENTS
    incidents.write_text("")
    limit = 60  # bytes: in the middle of the first row

    def small_files():
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([LOOPLOCK, "-w", "0.1", str(loop_dir), "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, preexec_fn=small_files)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert "cannot append the incident row" in r.stderr and "File too large" in r.stderr, r.stderr
    assert incidents.stat().st_size == limit and not incidents.read_bytes().endswith(b"\n")
    r = run(["-w", "0.1", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL, r.stderr
    lines = incidents.read_text().split("\n")
    assert len(lines[0]) == limit and lines[2] == ""
    row = json.loads(lines[1])
    assert row["error_code"] == "lock_acquire_timeout"
    obj = json.loads(run(["--inspect", "--json", loop_dir]).stdout)
    # Two rows; the newest is whole, so it is the only one read back.
    assert obj["incidents"]["count"] == 2 and obj["incidents"]["malformed"] == 0
    assert obj["incidents"]["examined"] == 1
    assert obj["incidents"]["latest"]["at"] == row["at"]


# --- calls whose failure must not go unnoticed (strace injects the failure) --------


def strace_inject(*injects, trace_children=False):
    """strace's command line that fails the given calls ("fcntl:error=EIO");
    strace tampers only with calls it traces."""
    names = ",".join(sorted({i.split(":")[0] for i in injects}))
    return ["strace", *(["-f"] if trace_children else []), "-qq", "-o", "/dev/null", "-e", f"trace={names}",
            *[a for i in injects for a in ("-e", f"inject={i}")]]


def strace_run(inject, args, trace_children=False, **kw):
    return subprocess.run([*strace_inject(inject, trace_children=trace_children), LOOPLOCK, *map(str, args)],
                          capture_output=True, text=True, timeout=TIMEOUT, **kw)


@pytest.mark.parametrize("mode", [["-F"], []], ids=["no-fork", "fork"])
def test_failing_f_setfd_never_runs_the_command_without_the_lock(loop_dir, mode):
    """Without F_SETFD the lock descriptor would close on exec: the command
    would run without the lock."""
    need_strace()
    marker = loop_dir / "ran"
    r = strace_run("fcntl:error=EIO", [*mode, loop_dir, "--", "touch", marker], trace_children=not mode)
    assert r.returncode == EX_OSERR, r.stderr
    assert "cannot pass the lock descriptor to the command" in r.stderr
    assert not marker.exists()


def test_failing_timer_settime_never_makes_the_wait_unbounded(loop_dir):
    need_strace()
    h = flock_holder(loop_dir / LOCK)
    try:
        r = strace_run("timer_settime:error=EINVAL", ["-w", "2", loop_dir, "--", "true"])
    finally:
        release(h)
    assert r.returncode == EX_OSERR, r.stderr
    assert "cannot arm the deadline timer" in r.stderr


def test_failing_timer_delete_leaves_no_timer_firing(loop_dir):
    """The timer is disarmed instead; looplock neither dies of SIGALRM nor
    passes the timer's SIGALRMs to the command."""
    need_strace()
    h = flock_holder(loop_dir / LOCK)
    p = subprocess.Popen([*strace_inject("timer_delete:error=EINVAL"), LOOPLOCK, "-v", "-w", "20", str(loop_dir), "--",
                          PY, SIGWAIT_HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        expect_stderr(p, "waiting for")
        release(h)
        assert read_line(p.stdout).strip() == "ready"
        time.sleep(0.3)  # a timer still firing every millisecond would show up here
        p.stdin.close()
        p.wait(timeout=TIMEOUT)
        got, err = p.stdout.read(), p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
        release(h)
    assert p.returncode == 0, err
    assert "SIGALRM" not in got


def test_failing_timer_delete_and_disarm_is_71(loop_dir):
    need_strace()
    h = flock_holder(loop_dir / LOCK)
    p = subprocess.Popen([*strace_inject("timer_delete:error=EINVAL", "timer_settime:error=EINVAL:when=2+"),
                          LOOPLOCK, "-v", "-w", "20", str(loop_dir),
                          "--", "touch", str(loop_dir / "ran")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_stderr(p, "waiting for")
        release(h)
        _, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
        release(h)
    assert p.returncode == EX_OSERR, err
    assert "cannot stop the deadline timer" in err
    assert not (loop_dir / "ran").exists()


def test_wait_answering_echild_does_not_hang_looplock(loop_dir):
    """wait(2) saying "no child" while the command runs: looplock stops (71)
    rather than wait forever holding the lock; the command goes with it."""
    need_strace()
    t0 = time.monotonic()
    r = strace_run("wait4:error=ECHILD", [loop_dir, "--", "sleep", "20"])
    assert r.returncode == EX_OSERR, r.stderr
    assert "lost track of the command" in r.stderr
    assert time.monotonic() - t0 < 15
    assert eventually(lambda: lock_is_free(loop_dir))


def test_a_failed_stat_after_the_command_is_not_a_vanished_dir(loop_dir, tmp_path):
    """The check after the command cannot stat DIR by its path (EIO): a
    warning, and the command's status, not "loop dir vanished mid-lock" (74)."""
    need_strace()
    trace = tmp_path / "trace"
    base = subprocess.run(["strace", "-qq", "-o", str(trace), "-e", "trace=newfstatat", LOOPLOCK, str(loop_dir),
                           "--", "true"], capture_output=True, text=True, timeout=TIMEOUT)
    assert base.returncode == 0, base.stderr
    calls = [l for l in trace.read_text().splitlines() if l.startswith("newfstatat(")]
    by_path = [i for i, l in enumerate(calls, 1) if l.startswith(f'newfstatat(AT_FDCWD, "{loop_dir}"')]
    assert len(by_path) == 2, calls  # after taking the lock, and after the command
    r = strace_run(f"newfstatat:error=EIO:when={by_path[1]}", [loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    assert "vanished mid-lock" not in r.stderr
    assert "cannot check whether" in r.stderr and "Input/output error" in r.stderr


@pytest.mark.skipif(SANITIZED, reason="AddressSanitizer's shadow memory does not fit under a small RLIMIT_DATA")
def test_allocation_failure_is_a_message_and_71_not_an_abort(loop_dir):
    """Copying a big command line fails under RLIMIT_DATA: before main's
    catch, that aborted (and could leave a core file)."""
    big = ["x" * 100_000] * 15

    def small_heap():
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, (512 * 1024, 512 * 1024))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    r = subprocess.run([LOOPLOCK, str(loop_dir), "--", "true", *big], capture_output=True, text=True,
                       timeout=TIMEOUT, preexec_fn=small_heap)
    assert r.returncode == EX_OSERR, (r.returncode, r.stderr[-500:])
    assert r.stderr == "looplock: out of memory\n"
    # The control: the same command line with room runs.
    assert run([loop_dir, "--", "true", *big]).returncode == 0
