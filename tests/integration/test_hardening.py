"""Hardening: looplock runs as root from cron in directories other users may
write to. Under bad input it must keep its contract: the documented exit
status, a clear "looplock: ..." message, no write outside DIR.

Every case here snapshots everything beside DIR (a sibling "outside" tree
with the targets of symlinks and hard links: names, types, sizes, mtimes,
contents) before and after, and checks nothing there changed.

Covers what test_exit_status.py, test_incidents.py, test_inspect.py and
test_records.py leave out: a symlink at the lock path under every mode (-s,
single_flight, -w 0, -F, --inspect), a dangling one, a character device (never
opened), DIR readable/searchable/writable combinations as another user, DIR
on a read-only mount, a hard-linked or FIFO incidents file, garbage / empty /
huge / binary lock file content replaced by the record, paths longer than
PATH_MAX, non-UTF-8 command arguments, environment and DIR names (byte-exact),
non-UTF-8 identities in incident rows and JSON log lines, and control
characters in DIR that must not forge log lines. (A symlinked incidents file
and non-UTF-8 identities in holder records are in test_incidents.py and
test_records.py.)
"""
import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (EX_CANTCREAT, EX_NOINPUT, EX_OSERR, EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, expect_line,
                      flock_holder, incident_rows, lock_is_free, release, run)

LOCK = ".state.lock"
INCIDENTS = ".state.lock.incidents.jsonl"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Prints its arguments (as raw bytes, hex-encoded), one per line.
ARGV_HEX = "import os, sys\nfor a in sys.argv[1:]:\n    print(os.fsencode(a).hex())\n"


# --- helpers -------------------------------------------------------------------


def snapshot(root, skip=()):
    """Everything under root (not following symlinks), except the subtrees in
    `skip`: {relative path: (type, mode, size, mtime_ns, content or link)}."""
    snap = {}
    root = Path(root)
    skip = {Path(s).resolve() for s in skip}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if (Path(dirpath) / d).resolve() not in skip]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.resolve() in skip and not p.is_symlink():
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                body = None
            snap[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size,
                                              st.st_mtime_ns, body)
    return snap


@pytest.fixture
def world(tmp_path):
    """DIR (tmp_path/loop) and a sibling tree tmp_path/outside with a precious
    file (and an old mtime); yields (loop_dir, outside). Tests wrap their runs
    in untouched()."""
    loop = tmp_path / "loop"
    loop.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"precious\n")
    (outside / "sub").mkdir()
    (outside / "sub" / "notes").write_bytes(b"do not touch\n")
    os.utime(outside / "precious", ns=(1_000_000_000, 1_000_000_000))
    yield loop, outside


@contextlib.contextmanager
def untouched(tmp_path, loop_dir):
    """Asserts that nothing under tmp_path outside loop_dir changed."""
    before = snapshot(tmp_path, skip=[loop_dir])
    yield
    after = snapshot(tmp_path, skip=[loop_dir])
    assert after == before, f"looplock changed something outside DIR: {diff(before, after)}"


def diff(a, b):
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


def assert_error(r, status, *words):
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    assert lines and all(l.startswith("looplock: ") for l in lines), err
    for w in words:
        assert w in lines[0], (w, err)


def nobody_can_run():
    if os.geteuid() != 0:
        pytest.skip("needs root to run looplock as uid 65534")
    if not shutil.which("setpriv"):
        pytest.skip("setpriv(1) is needed to run looplock as another user")
    probe = subprocess.run([*NOBODY, LOOPLOCK, "--version"], capture_output=True, timeout=TIMEOUT, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot run {LOOPLOCK}")


@pytest.fixture
def nobody_base(public_base):
    """A root-owned 0755 directory under /tmp that uid 65534 can search."""
    nobody_can_run()
    return public_base


def run_as_nobody(args, **kw):
    return subprocess.run([*NOBODY, LOOPLOCK, *[str(a) for a in args]], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/", **kw)


def bytes_run(argv, env=None, **kw):
    full = {k.encode(): v.encode() for k, v in os.environ.items()}
    if env:
        full.update(env)
    return subprocess.run([os.fsencode(a) if isinstance(a, (str, Path)) else a for a in argv],
                          capture_output=True, timeout=TIMEOUT, env=full, **kw)


# --- a symlink at the lock path --------------------------------------------------

MODES = {
    "default": [],
    "shared": ["-s"],
    "single_flight": ["-p", "single_flight"],
    "one_attempt": ["-w", "0"],
    "no_fork": ["-F"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_symlink_to_a_file_outside_is_refused_in_every_mode(tmp_path, world, mode):
    loop, outside = world
    target = outside / "precious"
    (loop / LOCK).symlink_to(target)
    marker = loop / "ran"
    with untouched(tmp_path, loop):
        r = run([*MODES[mode], loop, "--", "touch", marker])
        assert_error(r, EX_CANTCREAT, "unsafe lock file", "symbolic link")
        assert "looplock never follows one" in r.stderr or "Replace it" in r.stderr, r.stderr
        assert not marker.exists()
        # --inspect reads: it reports the link without following it.
        i = run(["--inspect", "--json", loop])
        assert i.returncode == 0, i.stderr
        obj = json.loads(i.stdout)
        assert obj["record"]["holder"] is None
        assert obj["warnings"], obj
    assert (loop / LOCK).is_symlink() and os.readlink(loop / LOCK) == str(target)
    assert target.read_bytes() == b"precious\n"


@pytest.mark.parametrize("mode", list(MODES))
def test_dangling_symlink_target_is_never_created(tmp_path, world, mode):
    loop, outside = world
    target = outside / "created-by-looplock"
    (loop / LOCK).symlink_to(target)
    with untouched(tmp_path, loop):
        r = run([*MODES[mode], loop, "--", "true"])
        assert_error(r, EX_CANTCREAT, "symbolic link")
        assert run(["--inspect", loop]).returncode == 0
    assert not os.path.lexists(target)


def test_symlink_to_a_directory_outside_creates_nothing_there(tmp_path, world):
    loop, outside = world
    (loop / LOCK).symlink_to(outside / "sub")
    with untouched(tmp_path, loop):
        assert_error(run([loop, "--", "true"]), EX_CANTCREAT, "symbolic link")
    assert sorted(os.listdir(outside / "sub")) == ["notes"]


# --- a character device at the lock path ------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_character_device_is_refused_and_never_opened(tmp_path, world):
    loop, _ = world
    dev = os.stat("/dev/null").st_rdev
    os.mknod(loop / LOCK, 0o666 | stat.S_IFCHR, dev)
    marker = loop / "ran"
    with untouched(tmp_path, loop):
        r = run([loop, "--", "touch", marker])
        assert_error(r, EX_CANTCREAT, "unsafe lock file", "character device")
        assert "Move it away" in r.stderr
        assert not marker.exists()
        i = run(["--inspect", "--json", loop])
        assert i.returncode == 0, i.stderr
        assert json.loads(i.stdout)["warnings"]
    assert stat.S_ISCHR((loop / LOCK).lstat().st_mode)

    # The device is never opened (a real device's open can have effects:
    # a tape rewinds, a watchdog starts). Seen through strace when present.
    if not shutil.which("strace"):
        pytest.skip("strace(1) is needed to see that the device is never opened (Debian package strace)")
    trace = tmp_path / "trace"
    for args in ([loop, "--", "true"], ["-s", loop, "--", "true"], ["--inspect", loop]):
        s = subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(trace),
                            LOOPLOCK, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)
        if s.returncode not in (0, EX_CANTCREAT):
            pytest.fail(f"strace run failed: {s.returncode} {s.stderr}")
        opens = [ln for ln in trace.read_text().splitlines() if '.state.lock"' in ln]
        assert opens == [], f"{args}: the device was opened: {opens}"


# --- DIR permissions, as another user -------------------------------------------


def make_dir(base, mode, with_lock_file, owner=65534):
    d = base / "loop"
    d.mkdir()
    if with_lock_file:
        (d / LOCK).write_bytes(b"")
        os.chown(d / LOCK, owner, owner)
    os.chown(d, owner, owner)
    os.chmod(d, mode)
    return d


def test_unreadable_but_searchable_dir_with_a_lock_file_works(nobody_base):
    """0111: no listing needed; the lock file is reached by name, so a run
    with an existing lock file locks it and writes its record."""
    d = make_dir(nobody_base, 0o111, with_lock_file=True)
    with untouched(nobody_base, d):
        r = run_as_nobody([d, "--", "sh", "-c", 'cat "$LOOPLOCK_DIR/.state.lock"'])
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        rec = json.loads(r.stdout)
        assert rec["agent_id"] == "nobody" or rec["agent_id"] == "65534"
        assert rec["released_at"] is None
        i = run_as_nobody(["--inspect", "--json", d])
        assert i.returncode == 0, i.stderr
        assert json.loads(i.stdout)["record"]["state"] == "valid"
    os.chmod(d, 0o755)
    assert json.loads((d / LOCK).read_text())["released_at"] is not None


def test_unreadable_but_searchable_dir_without_a_lock_file_is_73(nobody_base):
    d = make_dir(nobody_base, 0o111, with_lock_file=False)
    with untouched(nobody_base, d):
        r = run_as_nobody([d, "--", "touch", nobody_base / "ran"])
        assert_error(r, EX_CANTCREAT, "cannot create", "Permission denied")
        assert "permissions" in r.stderr
        i = run_as_nobody(["--inspect", d])
        assert i.returncode == 0, i.stderr
        assert "missing" in i.stdout
    os.chmod(d, 0o755)
    assert os.listdir(d) == []


def test_writable_and_searchable_but_unreadable_dir_works(nobody_base):
    """0311 (-wx): the lock file is created by name and the run succeeds."""
    d = make_dir(nobody_base, 0o311, with_lock_file=False)
    with untouched(nobody_base, d):
        r = run_as_nobody([d, "--", "true"])
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
    os.chmod(d, 0o755)
    assert json.loads((d / LOCK).read_text())["released_at"] is not None


@pytest.mark.parametrize("mode", [0o000, 0o600, 0o200], ids=["0000", "0600", "0200"])
@pytest.mark.parametrize("with_lock_file", [False, True], ids=["no-lock-file", "lock-file"])
def test_dir_without_search_permission(nobody_base, mode, with_lock_file):
    """Without x on DIR nothing in it can be reached: 73 (the lock file cannot
    be opened), naming the cause and the fix; --inspect gives the same status
    and hint (an error entry with --json), never a crash or a report of a free
    lock."""
    d = make_dir(nobody_base, mode, with_lock_file)
    marker = nobody_base / "ran"
    with untouched(nobody_base, d):
        r = run_as_nobody([d, "--", "touch", marker])
        assert_error(r, EX_CANTCREAT, ".state.lock", "Permission denied")
        assert "looplock needs search permission on DIR" in r.stderr
        assert "'chmod u+x' it" in r.stderr, r.stderr  # nobody owns DIR: the fix is its own
        assert not marker.exists()
        i = run_as_nobody(["--inspect", d])
        assert_error(i, EX_CANTCREAT, "Permission denied")
        assert "looplock needs search permission on DIR" in i.stderr
        assert i.stdout == ""
        j = run_as_nobody(["--inspect", "--json", d])
        assert j.returncode == EX_CANTCREAT
        entry = json.loads(j.stdout)
        assert entry["error"]["status"] == EX_CANTCREAT
        assert "search permission" in entry["error"]["hint"]
        # DIR given to root: nobody cannot chmod it, and is not told to.
        os.chown(d, 0, 0)
        r = run_as_nobody([d, "--", "touch", marker])
        assert r.returncode == EX_CANTCREAT and "'chmod u+x' it" not in r.stderr, r.stderr
        assert "uid 0's, mode" in r.stderr and "ask its owner" in r.stderr, r.stderr
    os.chmod(d, 0o755)
    assert os.listdir(d) == ([LOCK] if with_lock_file else [])
    if with_lock_file:
        assert (d / LOCK).read_bytes() == b""


# --- DIR on a read-only mount ---------------------------------------------------


def test_read_only_mount_with_a_lock_file_locks_and_warns_once(tmp_path, tmpfs):
    def prepare(mnt):
        (mnt / "loop").mkdir(mode=0o755)
        (mnt / "loop" / LOCK).write_bytes(b"")

    mnt = tmpfs(prepare=prepare, ro=True)
    d = mnt / "loop"
    probe = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\ntry:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\nexcept BlockingIOError:\n    print('held')\n"
    with untouched(tmp_path, d):
        # -o: only looplock holds the lock, so "held" proves looplock took it.
        r = run(["-o", d, "--", PY, "-c", probe, d / LOCK])
        assert r.returncode == 0, r.stderr
        assert r.stdout == "held\n"
        lines = r.stderr.splitlines()
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("looplock: ") and "read-only" in lines[0] and "record" in lines[0], lines
    assert (d / LOCK).read_bytes() == b""
    assert lock_is_free(d)


def test_read_only_mount_without_a_lock_file_is_73(tmp_path, tmpfs):
    mnt = tmpfs(prepare=lambda m: (m / "loop").mkdir(mode=0o755), ro=True)
    d = mnt / "loop"
    with untouched(tmp_path, d):
        r = run([d, "--", "touch", tmp_path / "ran"])
        assert_error(r, EX_CANTCREAT, "cannot create", "Read-only file system")
        i = run(["--inspect", d])
        assert i.returncode == 0, i.stderr
        # --check fails: every run exits 73, and --inspect says why and what to do.
        i = run(["--inspect", "--check", d])
        assert i.returncode == 1, i.stdout
        assert "every run exits 73: it does not exist, and DIR's file system is read-only" in i.stdout, i.stdout
        assert "Create it while the file system is writable" in i.stdout, i.stdout
        assert "missing, and no run can create it" in i.stdout and "the next run creates it" not in i.stdout
    assert not (tmp_path / "ran").exists()
    assert os.listdir(d) == []


def test_read_only_mount_with_a_ledger_and_incidents_inspect_names_the_mount_not_a_permission(tmp_path, tmpfs):
    def prepare(mnt):
        (mnt / "loop").mkdir(mode=0o755)
        assert run(["--once-per", "1m", "--operation", "t", mnt / "loop", "--", "true"]).returncode == 0
        (mnt / "loop" / INCIDENTS).write_bytes(b"")

    d = tmpfs(prepare=prepare, ro=True) / "loop"
    r = run(["--once-per", "1m", "--operation", "u", d, "--", "true"])
    assert r.returncode == EX_CANTCREAT and "Read-only file system" in r.stderr, r.stderr
    i = run(["--inspect", "--check", d])
    assert i.returncode == 1, i.stdout
    assert "every --once-per run exits 73 unless its slot was run: DIR's file system is read-only" in i.stdout
    assert "every incident row is lost (one warning each time): DIR's file system is read-only" in i.stdout
    assert "chgrp" not in i.stdout and "chmod" not in i.stdout, i.stdout
    # A metrics directory on it: the same, for the metrics.
    i = run(["--inspect", "--check", "--metrics-dir", d, d])
    assert i.returncode == 1 and "your runs cannot update the metrics" in i.stdout, i.stdout
    assert "its file system is read-only" in i.stdout and "chgrp" not in i.stdout, i.stdout


def test_read_only_mount_without_a_ledger_inspect_warns_that_once_per_cannot_record(tmp_path, tmpfs):
    """A lock file but no run ledger on a read-only mount: runs lock it, but
    every --once-per run exits 73, and --inspect says so beside the lost
    incident rows (it named only those)."""
    def prepare(mnt):
        (mnt / "loop").mkdir(mode=0o755)
        (mnt / "loop" / LOCK).write_bytes(b"")

    d = tmpfs(prepare=prepare, ro=True) / "loop"
    r = run(["--once-per", "1m", "--operation", "u", d, "--", "true"])
    assert r.returncode == EX_CANTCREAT and "Read-only file system" in r.stderr, r.stderr
    assert "remount it read-write" in r.stderr and "chmod" not in r.stderr, r.stderr
    i = run(["--inspect", "--check", d])
    assert i.returncode == 1, i.stdout
    assert "every --once-per run exits 73: it does not exist, and DIR's file system is read-only" in i.stdout, i.stdout
    assert "every incident row is lost (one warning each time): DIR's file system is read-only" in i.stdout


def test_read_only_mount_timeout_is_75_with_one_warning(tmp_path, tmpfs):
    def prepare(mnt):
        (mnt / "loop").mkdir(mode=0o755)
        (mnt / "loop" / LOCK).write_bytes(b"")

    d = tmpfs(prepare=prepare, ro=True) / "loop"
    h = flock_holder(d / LOCK)
    try:
        with untouched(tmp_path, d):
            t0 = time.monotonic()
            r = run(["-w", "0.3", d, "--", "true"])
            elapsed = time.monotonic() - t0
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    assert "lock_acquire_timeout" in r.stderr
    warnings = [l for l in r.stderr.splitlines() if "cannot append the incident row" in l]
    assert len(warnings) == 1 and "Read-only file system" in warnings[0], r.stderr
    assert all(l.startswith("looplock: ") for l in r.stderr.splitlines())


# --- the incidents file -----------------------------------------------------------


def time_out(loop, *extra):
    h = flock_holder(loop / LOCK)
    try:
        t0 = time.monotonic()
        r = run(["-w", "0.3", *extra, loop, "--", "true"])
        return r, time.monotonic() - t0
    finally:
        release(h)


def test_hard_linked_incidents_file_is_not_written_through(tmp_path, world):
    """A hard link is another name for a file outside DIR (a user who may
    write to DIR can make one to any file of theirs, or to any file at all
    where fs.protected_hardlinks is off): appending to it writes outside DIR.
    The timeout itself still happens on time with one warning."""
    loop, outside = world
    os.link(outside / "precious", loop / INCIDENTS)
    with untouched(tmp_path, loop):
        r, elapsed = time_out(loop)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    assert "lock_acquire_timeout" in r.stderr
    warnings = [l for l in r.stderr.splitlines() if "unsafe incidents file" in l]
    assert len(warnings) == 1 and "it has more than one hard link; the incident row was not written" in warnings[0]
    assert (outside / "precious").read_bytes() == b"precious\n"


def test_fifo_incidents_file_with_a_reader_gets_nothing(tmp_path, world):
    """A FIFO with a reader opens without blocking; looplock must notice it is
    no regular file, write nothing into it, and time out on time."""
    loop, _ = world
    fifo = loop / INCIDENTS
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with untouched(tmp_path, loop):
            r, elapsed = time_out(loop)
        try:
            leaked = os.read(rfd, 65536)
        except BlockingIOError:
            leaked = b""
    finally:
        os.close(rfd)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    assert leaked == b"", leaked
    warnings = [l for l in r.stderr.splitlines() if "unsafe incidents file" in l]
    assert len(warnings) == 1 and warnings[0].startswith("looplock: "), r.stderr
    assert "it is not a regular file" in warnings[0]


# --- odd lock file content ----------------------------------------------------------

CONTENT = {
    "garbage": b"this is not a holder record\n",
    "empty": b"",
    "huge": b"{" + b"x" * (1024 * 1024 + 4096) + b"}\n",
    "binary": bytes(range(256)) * 64,
    "nul": b"\0" * 8192,
    "half_record": b'{"schema":"file_lock_holder_v0","lock_id":"00',
}


@pytest.mark.parametrize("kind", list(CONTENT))
def test_odd_lock_file_content_is_replaced_by_the_record(tmp_path, world, kind):
    loop, _ = world
    lock = loop / LOCK
    lock.write_bytes(CONTENT[kind])
    ino = lock.stat().st_ino
    with untouched(tmp_path, loop):
        i = run(["--inspect", "--json", loop])
        assert i.returncode == 0, i.stderr
        assert json.loads(i.stdout)["record"]["state"] == ("empty" if kind == "empty" else "unreadable")
        assert lock.read_bytes() == CONTENT[kind], "inspect changed the file"
        r = run(["--agent", "fixer", loop, "--", "sh", "-c", 'cat "$LOOPLOCK_DIR/.state.lock"'])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    # Inside the critical section the file holds exactly the record.
    inside = r.stdout.encode()
    assert inside.endswith(b"\n") and inside.count(b"\n") == 1, inside[:200]
    rec = json.loads(inside)
    assert rec["agent_id"] == "fixer" and rec["released_at"] is None
    # After release: the released record, nothing else; same inode.
    after = lock.read_bytes()
    assert lock.stat().st_ino == ino
    assert lock.stat().st_size == len(after) < 1024
    assert after.count(b"\n") == 1 and json.loads(after)["released_at"] is not None
    obj = json.loads(run(["--inspect", "--json", loop]).stdout)
    assert obj["record"]["state"] == "valid"


@pytest.mark.parametrize("kind", ["garbage", "huge", "binary"])
def test_timeout_behind_odd_content_reports_no_holder_record(loop_dir, kind):
    lock = loop_dir / LOCK
    lock.write_bytes(CONTENT[kind])
    r, elapsed = time_out(loop_dir)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert 0.25 <= elapsed < 3.0, elapsed
    assert all(l.startswith("looplock: ") for l in r.stderr.splitlines()), r.stderr
    (row,) = incident_rows(loop_dir)
    assert row["holder"] is None and row["holder_alive"] is None
    assert lock.read_bytes() == CONTENT[kind]


# --- paths longer than PATH_MAX ---------------------------------------------------

SEG = "d" * 200  # NAME_MAX is 255


@pytest.fixture
def deep(tmp_path):
    """A directory whose absolute path is longer than PATH_MAX (4096), built
    with relative mkdir/chdir steps. Yields (base, segments, fd of the deepest
    directory, fd of the middle one)."""
    base = Path(os.path.realpath(tmp_path)) / "deep"
    base.mkdir()
    old = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    segs = []
    fds = []
    try:
        os.chdir(base)
        while len(str(base)) + sum(len(s) + 1 for s in segs) <= 4400:
            os.mkdir(SEG)
            os.chdir(SEG)
            segs.append(SEG)
            if len(segs) == 11:
                fds.append(os.open(".", os.O_RDONLY | os.O_DIRECTORY))
        fds.append(os.open(".", os.O_RDONLY | os.O_DIRECTORY))
    finally:
        os.fchdir(old)
        os.close(old)
    assert len(str(base)) + sum(len(s) + 1 for s in segs) > 4096
    try:
        yield base, segs, fds[-1], fds[0]
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(base)


def run_in(fd, args, **kw):
    return subprocess.run([LOOPLOCK, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT,
                          preexec_fn=lambda: os.fchdir(fd), **kw)


def test_dir_argument_longer_than_path_max_is_66(tmp_path, deep):
    base, segs, _, _ = deep
    rel = "/".join(segs)
    assert len(rel) > 4096
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with untouched(tmp_path, base):
            r = run_in(fd, [rel, "--", "touch", tmp_path / "ran"])
            assert_error(r, EX_NOINPUT, "cannot open loop directory", "File name too long")
            i = run_in(fd, ["--inspect", rel])
            assert i.returncode == EX_NOINPUT, i.stderr
            assert i.stderr.startswith("looplock: ") and "File name too long" in i.stderr
    finally:
        os.close(fd)
    assert not (tmp_path / "ran").exists()


def test_dir_component_longer_than_name_max_is_66(tmp_path):
    r = run([tmp_path / ("x" * 300), "--", "true"])
    assert_error(r, EX_NOINPUT, "File name too long")


def test_a_hold_of_a_dir_whose_absolute_path_exceeds_path_max_says_why_it_cannot(tmp_path, deep):
    """A plain run there works (below); a hold opens DIR by its absolute
    path, so it cannot: 66, and the hint says to give a shorter path (not to
    cd above it and give a relative one, which a hold makes absolute
    again)."""
    base, _, deepest, _ = deep
    with untouched(tmp_path, base):
        r = run_in(deepest, ["--hold", "--max-time", "10", "."])
    assert r.returncode == EX_NOINPUT and r.stdout == "", r.stderr
    assert "cannot hold loop directory " in r.stderr and "more than the system opens at once (4095)" in r.stderr
    assert "A hold opens DIR by its absolute path" in r.stderr and "relative path" not in r.stderr, r.stderr


@pytest.mark.parametrize("how", ["dot_from_inside", "relative_from_halfway"])
def test_dir_whose_absolute_path_exceeds_path_max_works(tmp_path, deep, how):
    """The arguments are short, the real path is > 4096 bytes: looplock must
    lock, record, export LOOPLOCK_DIR and time out as anywhere else; lock_id
    is still the SHA-256 of the canonical path (computable by other tools)."""
    base, segs, deepest, middle = deep
    full = str(base) + "/" + "/".join(segs)
    if how == "dot_from_inside":
        fd, arg = deepest, "."
    else:
        fd, arg = middle, "/".join(segs[11:])
    lock_id = hashlib.sha256((full + "/" + LOCK).encode()).hexdigest()[:16]
    with untouched(tmp_path, base):
        r = run_in(fd, [arg, "--", "sh", "-c",
                        'printf "%s\\n%s\\n" "$LOOPLOCK_DIR" "$LOOPLOCK_LOCK_ID"; cat "/proc/self/fd/$LOOPLOCK_FD"'])
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
        exported_dir, exported_id, raw = r.stdout.split("\n", 2)
        assert exported_dir == full
        assert exported_id == lock_id
        rec = json.loads(raw)
        assert rec["lock_id"] == lock_id
        assert SEG not in raw

        i = run_in(fd, ["--inspect", "--json", arg])
        assert i.returncode == 0, i.stderr
        assert json.loads(i.stdout)["lock_id"] == lock_id

        # A timeout there: 75 on time, one whole row.
        h = subprocess.Popen([LOOPLOCK, "-p", "blocking", arg, "--", "sh", "-c", "echo ready; read x"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: os.fchdir(fd))
        try:
            expect_line(h, "ready")
            t0 = time.monotonic()
            t = run_in(fd, ["-w", "0.3", arg, "--", "true"])
            elapsed = time.monotonic() - t0
        finally:
            release(h)
        assert t.returncode == EX_TEMPFAIL, t.stderr
        assert 0.25 <= elapsed < 3.0
        assert "lock_acquire_timeout" in t.stderr
    dirfd = os.open(".", os.O_RDONLY)
    try:
        os.fchdir(fd)
        rows = [json.loads(l) for l in Path(arg, INCIDENTS).read_text().splitlines()]
    finally:
        os.fchdir(dirfd)
        os.close(dirfd)
    assert len(rows) == 1 and rows[0]["lock_id"] == lock_id


# --- non-UTF-8 bytes -------------------------------------------------------------

ODD_ARGS = [b"\xff\xfe", b"caf\xc3\xa9", b"half\xe2\x82", b"", b"new\nline", b"-v", b"--", b"-c", b"--inspect",
            b"tab\there", b"\x1b[31mred", b"x" * 100_000, b"\xed\xa0\x80"]


def test_non_utf8_command_arguments_pass_through_byte_exact(tmp_path, world):
    loop, _ = world
    with untouched(tmp_path, loop):
        for opts in ([], ["-F"], ["-o"]):
            r = bytes_run([LOOPLOCK, *opts, loop, "--", PY, "-c", ARGV_HEX, *ODD_ARGS])
            assert r.returncode == 0, (opts, r.stderr)
            assert r.stderr == b""
            got = [bytes.fromhex(l) for l in r.stdout.decode().split("\n")[:-1]]
            assert got == ODD_ARGS, opts


def test_non_utf8_shell_command_passes_through_byte_exact(loop_dir):
    script = b"printf '%s' '\xff\xfe caf\xc3\xa9' | od -An -tx1"
    r = bytes_run([LOOPLOCK, loop_dir, b"-c", script])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [b"ff", b"fe", b"20", b"63", b"61", b"66", b"c3", b"a9"]


def test_non_utf8_environment_passes_through_byte_exact(loop_dir):
    code = "import os, sys\nsys.stdout.write(os.environb[b'ODD_VALUE'].hex())\n"
    value = b"\xff\x01\xc3(\n=x"
    r = bytes_run([LOOPLOCK, loop_dir, "--", PY, "-c", code], env={b"ODD_VALUE": value})
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(r.stdout.decode()) == value


def test_non_utf8_dir_name(tmp_path):
    d = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/loop\xff\xfe"))
    d.mkdir()
    code = "import os, sys\nsys.stdout.write(os.environb[b'LOOPLOCK_DIR'].hex())\n"
    r = bytes_run([LOOPLOCK, d, "--", PY, "-c", code])
    assert r.returncode == 0, r.stderr
    assert bytes.fromhex(r.stdout.decode()) == os.fsencode(os.path.realpath(d))
    raw = (d / LOCK).read_bytes()
    raw.decode("utf-8")  # strict
    assert json.loads(raw)["lock_id"] == hashlib.sha256(os.fsencode(os.path.realpath(d)) + b"/" + LOCK.encode()).hexdigest()[:16]
    # Its messages stay one "looplock: " line each, valid for a UTF-8 log.
    r = bytes_run([LOOPLOCK, d / "missing", "--", "true"])
    assert r.returncode == EX_NOINPUT
    lines = r.stderr.split(b"\n")[:-1]
    assert lines and all(l.startswith(b"looplock: ") for l in lines), r.stderr


def test_non_utf8_identity_in_incident_rows_and_json_lines(loop_dir):
    agent = b"agent\xff\xfe\n\"x"
    operation = b"op\xc3(\x1b"
    h = flock_holder(loop_dir / LOCK)
    try:
        r = bytes_run([LOOPLOCK, "--log-format", "json", "-w", "0.2", "--agent", agent, "--operation", operation,
                       loop_dir, "--", "true"])
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    for line in r.stderr.split(b"\n")[:-1]:
        json.loads(line.decode("utf-8"))  # strict UTF-8, one object a line
    raw = (loop_dir / INCIDENTS).read_bytes()
    (row,) = [json.loads(l) for l in raw.decode("utf-8").splitlines()]
    assert row["waiter"]["agent_id"] == agent.decode("utf-8", "replace")
    assert row["waiter"]["operation"] == operation.decode("utf-8", "replace")
    assert "\ufffd" in row["waiter"]["agent_id"] and "\ufffd" in row["waiter"]["operation"]


def test_non_utf8_command_name_gives_a_valid_operation(tmp_path, loop_dir):
    script = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/tick\xff.sh"))
    script.write_text('#!/bin/sh\ncat "$LOOPLOCK_DIR/.state.lock"\n')
    script.chmod(0o755)
    r = bytes_run([LOOPLOCK, loop_dir, "--", script])
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout.decode("utf-8"))
    assert rec["operation"] == "tick\ufffd.sh"
    i = bytes_run([LOOPLOCK, "--inspect", "--json", loop_dir])
    assert i.returncode == 0
    assert json.loads(i.stdout.decode("utf-8"))["record"]["holder"]["operation"] == "tick\ufffd.sh"


# --- control characters in DIR -------------------------------------------------------


@pytest.mark.parametrize("name", ["loop\nlooplock: FORGED all clear", "loop\x1b[2J\rX"], ids=["newline", "escape"])
def test_control_characters_in_dir_cannot_forge_log_lines(tmp_path, name):
    """The man page: every message starts with "looplock: ". A DIR name is as hostile
    as a holder identity (a loop over directories others may create), so it
    must not split a message into lines or carry raw control characters."""
    d = tmp_path / name
    d.mkdir()
    results = [run([d / "missing", "--", "true"]), run(["-v", d, "--", "true"]),
               run(["--inspect", d / "missing"])]
    h = flock_holder(d / LOCK)
    try:
        results.append(run(["-w", "0.1", d, "--", "true"]))
    finally:
        release(h)
    assert [r.returncode for r in results] == [EX_NOINPUT, 0, EX_NOINPUT, EX_TEMPFAIL]
    for r in results:
        for line in r.stderr.splitlines():
            assert line.startswith("looplock: "), f"forged line {line!r} in {r.stderr!r}"
            assert not line.startswith("looplock: FORGED"), f"forged line {line!r} in {r.stderr!r}"
        assert "\x1b" not in r.stderr and "\r" not in r.stderr, repr(r.stderr)


# --- who may hold the lock: a group shares a loop ------------------------------------

NOBODY_IN_GROUP = ["setpriv", "--reuid=65534", "--regid=65534", "--groups=65534"]


def test_a_group_shares_a_loop_through_a_lock_file_its_owner_made(nobody_base):
    """The man page's recipe: DIR's owner (root here) gives DIR to the group
    and creates the lock file 0660; a member (uid 65534, group 65534) can lock
    it. A lock file that another member made serves too while DIR is the
    group's to write (every member could replace it anyway); in a sticky
    DIR, where members cannot replace each other's files, it is refused (73),
    and the hint tells DIR's owner how to mend it."""
    d = nobody_base / "shared"
    d.mkdir()
    os.chown(d, 0, 65534)
    os.chmod(d, 0o2770)
    lock = d / LOCK
    subprocess.run(["install", "-m", "0660", "-g", "65534", "/dev/null", str(lock)], check=True, timeout=TIMEOUT)
    r = subprocess.run([*NOBODY_IN_GROUP, LOOPLOCK, str(d), "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    rec = json.loads(lock.read_text())
    assert rec["agent_id"] == "nobody" and rec["released_at"] is not None
    assert os.stat(lock).st_mode & 0o777 == 0o660  # never changed
    # Made by another member of the group (uid 65533): it serves while DIR is the group's to write.
    os.chown(lock, 65533, 65534)
    r = subprocess.run([*NOBODY_IN_GROUP, LOOPLOCK, str(d), "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    r = run([d, "--", "true"])  # DIR's owner too
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    # In a sticky DIR: refused, and said why, with the fix for DIR's owner.
    os.chmod(d, 0o3770)
    r = subprocess.run([*NOBODY_IN_GROUP, LOOPLOCK, str(d), "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert_error(r, EX_CANTCREAT, "owned by uid 65533, neither you nor DIR's owner")
    assert "ask DIR's owner (uid 0) to replace it" in r.stderr, r.stderr
    r = run([d, "--", "true"])
    assert_error(r, EX_CANTCREAT, "owned by uid 65533, neither you nor DIR's owner")
    assert "As DIR's owner, replace it with one of your own while nobody holds the lock" in r.stderr, r.stderr
    i = subprocess.run([*NOBODY_IN_GROUP, LOOPLOCK, "--inspect", "--check", str(d)], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd="/")
    assert i.returncode == 1 and "looplock refuses to lock it" in i.stdout, i.stdout + i.stderr


def test_a_holder_who_is_neither_owner_is_named(nobody_base):
    """Anyone who can read the lock file can take the lock: --inspect names a
    holder whose uid is neither the file's owner nor DIR's."""
    d = nobody_base / "loop"
    d.mkdir()
    os.chmod(d, 0o755)
    assert run([d, "--", "true"]).returncode == 0
    os.chmod(d / LOCK, 0o644)  # as earlier versions made it: readable by anyone
    probe = "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint('ready', flush=True)\nsys.stdin.read()\n"
    h = subprocess.Popen([*NOBODY, "/usr/bin/python3", "-c", probe, str(d / LOCK)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert h.stdout.readline().strip() == "ready"
        i = run(["--inspect", "--json", d])
        w = json.loads(i.stdout)["warnings"]
        assert any("any local user can take this lock" in x for x in w), w
        assert any(f"pid {h.pid} holds the lock as uid 65534" in x for x in w), w
        r = run(["-w", "0.1", d, "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        assert f"by pid {h.pid} (python3): no looplock record" in r.stderr, r.stderr
    finally:
        h.stdin.close()
        h.wait(timeout=TIMEOUT)


def test_the_inspect_hint_of_a_dir_with_odd_bytes_pastes_back_into_a_shell(tmp_path):
    """A DIR whose name holds bytes a terminal must not get is shown as
    $'...': the hint's command, pasted into a shell, inspects that very
    DIR."""
    d = os.path.join(os.fsencode(tmp_path), b"E\xff\x1bz")
    os.mkdir(d)
    h = flock_holder(os.fsdecode(d) + "/" + LOCK)
    try:
        r = bytes_run([LOOPLOCK, "-w", "0", d, "--", "true"])
    finally:
        release(h)
    assert r.returncode == EX_TEMPFAIL, r.stderr
    err = r.stderr.decode()
    hint = err.split("Run '", 1)[1].split("' to see", 1)[0]
    assert "$'" in hint and "\\xff\\x1bz'" in hint and "\x1b" not in err, err
    i = subprocess.run(["bash", "-c", hint.replace("looplock", LOOPLOCK, 1)], capture_output=True, timeout=TIMEOUT)
    assert i.returncode == 0 and b"kernel    free" in i.stdout, i
