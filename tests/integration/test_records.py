"""The holder record inside DIR/.state.lock (looplock-files(5)).

Covers: the schema and every field while held (read from inside the command
and from outside), pid / pid_start against /proc, the UTC timestamp form,
agent_id and operation defaults (never a path, never another argument),
released_at after a normal release, lock_id (stable, computable, independent
of how DIR is spelled), hostile agent ids and invalid UTF-8, shared locks
(no record), a read-only lock file (locks, warns once), -F (released_at stays
null) and that a concurrent reader never sees a record mixed from two runs.
"""
import calendar
import hashlib
import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import LOOPLOCK, PY, TIMEOUT, expect_line, helper, lock_is_free, read_record, run, start, expected_lock_id

FIELDS = {
    "schema": str,
    "lock_id": str,
    "pid": int,
    "pid_start": str,
    "agent_id": str,
    "operation": str,
    "policy": str,
    "acquired_at": str,
    "released_at": (str, type(None)),
}
ISO_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
SECRET = "--token=hunter2-TOPSECRET-9f8e7d"


def pid_start(pid):
    """Field 22 (starttime) of /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()[19]



def user_name():
    return pwd.getpwuid(os.getuid()).pw_name


def iso_to_epoch(s):
    t = time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")
    return calendar.timegm(t) + int(s[20:23]) / 1000


def check_shape(rec):
    """Every field the man page documents, with its type, and nothing malformed."""
    assert isinstance(rec, dict), rec
    for k, t in FIELDS.items():
        assert k in rec, f"record lacks {k}: {rec}"
        assert isinstance(rec[k], t) and not isinstance(rec[k], bool), f"{k} has the wrong type: {rec}"
    assert rec["schema"] == "file_lock_holder_v0"
    assert re.fullmatch(r"[0-9a-f]{16}", rec["lock_id"]), rec
    assert rec["pid"] > 0
    assert re.fullmatch(r"\d+", rec["pid_start"]), rec
    assert ISO_MS_Z.match(rec["acquired_at"]), rec
    if rec["released_at"] is not None:
        assert ISO_MS_Z.match(rec["released_at"]), rec
        assert rec["released_at"] >= rec["acquired_at"], rec


def no_path_in(raw, *paths):
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    for p in paths:
        for form in {str(p), os.path.realpath(p)}:
            assert form not in text, f"absolute path {form} leaked into {text!r}"


SHOW = r'''
import json, os, sys
stat = open(f"/proc/{os.getppid()}/stat").read()
print(json.dumps({
    "raw": open(os.path.join(os.environ["LOOPLOCK_DIR"], ".state.lock")).read(),
    "ppid": os.getppid(),
    "ppid_start": stat[stat.rindex(")") + 2:].split()[19],
    "lock_id_env": os.environ.get("LOOPLOCK_LOCK_ID"),
}))
'''


@pytest.fixture
def status_py(tmp_path):
    """A loop script at an absolute path that reports the record it runs under."""
    p = tmp_path / "scripts" / "status.py"
    p.parent.mkdir()
    p.write_text(SHOW)
    return p


def run_show(loop_dir, cmd, opts=(), env=None):
    proc = start([*opts, loop_dir, "--", *cmd], env=env)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    return proc.pid, json.loads(out), err


# --- the record while held ---------------------------------------------------


def test_record_read_from_inside_the_command(loop_dir, status_py, monkeypatch):
    monkeypatch.delenv("LOOPLOCK_AGENT", raising=False)
    before = time.time()
    pid, shown, _ = run_show(loop_dir, [PY, str(status_py), "--tick", SECRET])
    after = time.time()
    raw = shown["raw"]
    assert raw.endswith("\n") and raw.count("\n") == 1, repr(raw)
    rec = json.loads(raw)
    check_shape(rec)
    assert rec["pid"] == pid == shown["ppid"]
    assert rec["pid_start"] == shown["ppid_start"]
    assert rec["released_at"] is None
    assert rec["policy"] == "mutation"
    assert rec["agent_id"] == user_name()
    assert rec["operation"] == "status.py"
    assert rec["lock_id"] == expected_lock_id(loop_dir) == shown["lock_id_env"]
    # acquired_at is UTC (with generous slack for a busy machine).
    assert before - 5 <= iso_to_epoch(rec["acquired_at"]) <= after + 5
    assert "hunter2" not in raw and "--tick" not in raw
    no_path_in(raw, loop_dir, status_py)

    # After the normal release: the same record with released_at set.
    after_rec = read_record(loop_dir)
    check_shape(after_rec)
    assert after_rec["released_at"] is not None
    assert after_rec["released_at"] >= after_rec["acquired_at"]
    assert {k: v for k, v in after_rec.items() if k not in ("released_at", "check")} == {
        k: v for k, v in rec.items() if k not in ("released_at", "check")
    }
    # Both versions carry a matching check (the man page: readers can validate).
    assert check_matches(raw.encode()) and check_matches((loop_dir / ".state.lock").read_bytes())


def test_record_read_from_outside_while_held(loop_dir, holders):
    h = holders(loop_dir, tool="looplock", extra=("--agent", "outside-agent"))
    raw = (loop_dir / ".state.lock").read_bytes()
    rec = json.loads(raw)
    check_shape(rec)
    assert rec["pid"] == h.pid
    assert rec["pid_start"] == pid_start(h.pid)
    assert rec["released_at"] is None
    assert rec["policy"] == "blocking"
    assert rec["agent_id"] == "outside-agent"
    assert rec["operation"] == "wait_stdin.py"
    assert rec["lock_id"] == expected_lock_id(loop_dir)
    no_path_in(raw, loop_dir, helper("wait_stdin.py"))

    assert h.release() == 0
    done = read_record(loop_dir)
    check_shape(done)
    assert done["released_at"] is not None and done["released_at"] >= done["acquired_at"]
    assert done["pid"] == h.pid and done["acquired_at"] == rec["acquired_at"]


@pytest.mark.parametrize("policy", ["mutation", "monitor", "single_flight", "blocking"])
def test_policy_field(loop_dir, status_py, policy):
    _, shown, _ = run_show(loop_dir, [PY, str(status_py)], opts=("-p", policy))
    assert json.loads(shown["raw"])["policy"] == policy


def test_agent_id_defaults_and_override(loop_dir, status_py, monkeypatch):
    monkeypatch.delenv("LOOPLOCK_AGENT", raising=False)
    _, shown, _ = run_show(loop_dir, [PY, str(status_py)])
    assert json.loads(shown["raw"])["agent_id"] == user_name()

    _, shown, _ = run_show(loop_dir, [PY, str(status_py)], env={"LOOPLOCK_AGENT": "cron-nightly"})
    assert json.loads(shown["raw"])["agent_id"] == "cron-nightly"

    _, shown, _ = run_show(loop_dir, [PY, str(status_py)], opts=("--agent", "ci-42"),
                           env={"LOOPLOCK_AGENT": "cron-nightly"})
    assert json.loads(shown["raw"])["agent_id"] == "ci-42"


CAT_LOCK = 'cat "$LOOPLOCK_DIR/.state.lock"'


@pytest.mark.parametrize(
    "cmd_kind, expected",
    [
        ("python_script", "status.py"),
        ("python_unbuffered_script", "status.py"),
        ("abs_binary", "cat"),
        ("sh_dash_c", "sh"),
        ("looplock_dash_c", "sh"),
        ("explicit", "nightly-tick"),
    ],
)
def test_operation_is_a_base_name_without_arguments(loop_dir, status_py, cmd_kind, expected):
    lock = loop_dir / ".state.lock"
    opts = []
    if cmd_kind == "python_script":
        tail = ["--", PY, str(status_py), "--tick", SECRET]
    elif cmd_kind == "python_unbuffered_script":
        tail = ["--", PY, "-u", str(status_py), SECRET]
    elif cmd_kind == "abs_binary":
        secret_file = loop_dir.parent / "hunter2-TOPSECRET"
        secret_file.write_text("")
        tail = ["--", shutil.which("cat"), str(lock), str(secret_file)]
    elif cmd_kind == "sh_dash_c":
        tail = ["--", "sh", "-c", f"{CAT_LOCK} # {SECRET}"]
    elif cmd_kind == "looplock_dash_c":
        tail = ["-c", f"{CAT_LOCK} # {SECRET}"]
    else:
        opts = ["--operation", "nightly-tick"]
        tail = ["--", PY, str(status_py), SECRET]
    r = run([*opts, loop_dir, *tail])
    assert r.returncode == 0, r.stderr
    out = r.stdout
    raw = json.loads(out)["raw"] if out.startswith('{"raw"') else out
    rec = json.loads(raw)
    assert rec["operation"] == expected
    assert "/" not in rec["operation"]
    assert "hunter2" not in raw and "TOPSECRET" not in raw
    no_path_in(raw, loop_dir, status_py, shutil.which("cat"))


# --- lock_id -----------------------------------------------------------------


def lock_id_via(args_dir, cwd=None):
    r = subprocess.run([LOOPLOCK, str(args_dir), "--", "true"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=cwd)
    assert r.returncode == 0, r.stderr
    d = Path(cwd or ".") / args_dir
    return json.loads((d / ".state.lock").read_text())["lock_id"]


def test_lock_id_is_stable_and_computable(tmp_path, loop_dir):
    expected = expected_lock_id(loop_dir)
    assert lock_id_via(loop_dir) == expected
    assert lock_id_via(loop_dir) == expected  # another run, another process
    link = tmp_path / "via-link"
    link.symlink_to(loop_dir)
    assert lock_id_via(link) == expected
    assert lock_id_via(str(loop_dir) + "/") == expected
    assert lock_id_via(str(loop_dir) + "//") == expected
    assert lock_id_via("loop", cwd=tmp_path) == expected
    assert lock_id_via("./loop/../loop/", cwd=tmp_path) == expected
    # A record written through any of these spellings has no path in it.
    no_path_in((loop_dir / ".state.lock").read_bytes(), loop_dir, link)

    other = tmp_path / "other"
    other.mkdir()
    assert lock_id_via(other) == expected_lock_id(other) != expected


# --- hostile identities ------------------------------------------------------


HOSTILE = [
    b'quote"s and \'single\'',
    b"new\nline\r\nand\ttab",
    b"back\\slash\\\\ and \\u0000 literal",
    b"ctl\x01\x02\x1b[31m\x7f\x1f",
    b"bad\xffutf8\xfe",
    b"cut\xe2\x82(",
    b"surrogate\xed\xa0\x80z",
    b"overlong\xc0\xafz",
    b'}{"schema":"file_lock_holder_v0","pid":1}',
    "ünïcødé ✓ 漢字".encode(),
]


def bytes_run(argv, env=None):
    full = {k.encode(): v.encode() for k, v in os.environ.items()}
    if env:
        full.update(env)
    return subprocess.run(argv, capture_output=True, timeout=TIMEOUT, env=full)


@pytest.mark.parametrize("agent", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_agent_id_stays_valid_json(loop_dir, agent):
    lock = loop_dir / ".state.lock"
    r = bytes_run([LOOPLOCK.encode(), b"--agent", agent, b"--operation", agent, bytes(loop_dir), b"--",
                   b"cat", bytes(lock)])
    assert r.returncode == 0, r.stderr
    expected = agent.decode("utf-8", "replace")
    for raw in (r.stdout, lock.read_bytes()):  # while held, and after release
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
        text = raw.decode("utf-8")  # strict: valid UTF-8 throughout
        rec = json.loads(text)
        check_shape(rec)
        assert rec["agent_id"] == expected
        assert rec["operation"] == expected


def test_hostile_agent_id_from_environment(loop_dir):
    agent = b'env"agent\n\xff\\'
    r = bytes_run([LOOPLOCK.encode(), bytes(loop_dir), b"--", b"true"], env={b"LOOPLOCK_AGENT": agent})
    assert r.returncode == 0, r.stderr
    rec = json.loads((loop_dir / ".state.lock").read_bytes().decode("utf-8"))
    assert rec["agent_id"] == agent.decode("utf-8", "replace")


# --- when no record is written -----------------------------------------------


def test_shared_lock_writes_no_record(loop_dir):
    lock = loop_dir / ".state.lock"
    r = run(["-s", loop_dir, "--", "sh", "-c", 'wc -c < "$LOOPLOCK_DIR/.state.lock"'])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"
    assert lock.read_bytes() == b""

    # A previous (released) record is left exactly as it was.
    assert run(["--agent", "writer", loop_dir, "--", "true"]).returncode == 0
    before = lock.read_bytes()
    mtime = lock.stat().st_mtime_ns
    r = run(["-s", "--agent", "reader", loop_dir, "--", "cat", lock])
    assert r.returncode == 0, r.stderr
    assert r.stdout.encode() == before
    assert lock.read_bytes() == before
    assert lock.stat().st_mtime_ns == mtime
    assert json.loads(before)["agent_id"] == "writer"


@pytest.fixture
def nobody_dir():
    """A loop dir owned by uid 65534 in a directory that user can reach."""
    if not shutil.which("setpriv"):
        pytest.skip("setpriv(1) is needed to run looplock as another user")
    if os.getuid() != 0:
        pytest.skip("needs root to hand a directory to uid 65534")
    base = tempfile.mkdtemp(prefix="looplock-ro-", dir="/tmp")
    os.chmod(base, 0o755)
    d = Path(base) / "loop"
    d.mkdir()
    os.chown(d, 65534, 65534)
    try:
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(argv):
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]


def test_read_only_lock_file_still_locks_and_warns_once(nobody_dir):
    lock = nobody_dir / ".state.lock"
    lock.write_bytes(b"")
    os.chown(lock, 65534, 65534)
    os.chmod(lock, 0o444)
    probe = subprocess.run(as_nobody(["sh", "-c", f"echo x >> {lock}"]), capture_output=True, timeout=TIMEOUT)
    if probe.returncode == 0:
        pytest.skip("uid 65534 can write a 0444 file here (capabilities?)")

    proc = subprocess.Popen(
        as_nobody([LOOPLOCK, "-p", "blocking", str(nobody_dir), "--", "sh", "-c", "echo ready; read x; echo done"]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(proc, "ready")
        assert not lock_is_free(nobody_dir), "a read-only lock file must still be locked"
        out, err = proc.communicate("\n", timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert "done" in out
    warnings = [ln for ln in err.splitlines() if "record" in ln]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("looplock: ")
    assert "read-only" in warnings[0] or "read only" in warnings[0], warnings[0]
    assert lock.read_bytes() == b""
    assert lock_is_free(nobody_dir)


def test_no_fork_record_is_never_released(loop_dir):
    lock = loop_dir / ".state.lock"
    proc = start(["-F", "--agent", "execd", loop_dir, "--", "cat", lock])
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    inside = json.loads(out)
    check_shape(inside)
    assert inside["pid"] == proc.pid  # exec in place: the command is looplock's pid
    assert inside["released_at"] is None
    after = read_record(loop_dir)
    assert after == inside  # no release rewrite, ever
    assert after["released_at"] is None


# --- a concurrent reader ------------------------------------------------------

AGENT_RE = re.compile(r"^run(\d+)-len(\d+)-(p*)$")


CHECK_KEY = b',"check":"'


def with_check(rec):
    """The record as looplock writes it: compact JSON whose last field,
    "check", is the first 16 hex digits of the SHA-256 of the text before it."""
    body = json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode()[:-1]
    return body + CHECK_KEY + hashlib.sha256(body).hexdigest()[:16].encode() + b'"}\n'


def check_matches(raw):
    """What a validating reader does first (the man page: readers validate): the
    record's check must match the text before it."""
    text = raw.rstrip(b"\n").rstrip(b" ")
    at = text.rfind(CHECK_KEY)
    if at < 0 or not text.endswith(b'"}'):
        return False
    return text[at + len(CHECK_KEY):-2] == hashlib.sha256(text[:at]).hexdigest()[:16].encode()


def classify(raw, pid_to_run, lock_id):
    """'empty'; 'partial' when a validating reader can tell (it does not
    parse, its check does not match, or it is not a record with every field
    of the right type); 'valid' for a whole record, which must then be
    self-consistent: an AssertionError means a record mixed from two runs
    that no reader could tell apart."""
    if raw == b"":
        return "empty"
    try:
        rec = json.loads(raw.decode("utf-8"))
        check_shape(rec)
    except (UnicodeDecodeError, ValueError, AssertionError):
        return "partial"
    if not check_matches(raw):
        return "partial"
    m = AGENT_RE.match(rec["agent_id"])
    assert m, f"agent_id mixed from two records: {rec}"
    n = int(m.group(1))
    assert len(m.group(3)) == int(m.group(2)), f"agent_id padding mixed: {rec}"
    assert rec["operation"] == f"op{n}", f"operation from another run: {rec}"
    assert pid_to_run.get(rec["pid"]) == n, f"pid from another run: {rec}"
    assert rec["lock_id"] == lock_id and rec["policy"] == "blocking", rec
    return "valid"


def test_checker_detects_mixed_records():
    """Control: the classifier used below does catch records mixed from two
    runs (so the concurrency test can fail)."""
    pid_to_run = {101: 1, 202: 2}
    lid = "0123456789abcdef"

    def rec(n, pid, pad, op=None):
        return {"schema": "file_lock_holder_v0", "lock_id": lid, "pid": pid, "pid_start": "5",
                "agent_id": f"run{n}-len{pad}-" + "p" * pad, "operation": op or f"op{n}",
                "policy": "blocking", "acquired_at": "2026-01-01T00:00:00.000Z", "released_at": None}

    good = with_check(rec(1, 101, 3))
    assert classify(good, pid_to_run, lid) == "valid"
    assert classify(b"", pid_to_run, lid) == "empty"
    assert classify(good[:40], pid_to_run, lid) == "partial"
    assert classify(good + good[10:], pid_to_run, lid) == "partial"
    # Valid JSON that is no whole record: a validating reader rejects it.
    assert classify(json.dumps({"schema": "file_lock_holder_v0", "pid": 101}).encode(), pid_to_run, lid) == "partial"
    for bad in (rec(1, 202, 3), rec(1, 101, 3, op="op2"), dict(rec(1, 101, 3), agent_id="run1-len3-pppppp")):
        with pytest.raises(AssertionError):
            classify(with_check(bad), pid_to_run, lid)
    # A torn read: run 2's record started over run 1's, equal lengths, so it
    # is valid JSON with every field; the check gives it away.
    one, two = with_check(rec(1, 101, 3)), with_check(rec(2, 202, 3))
    cut = two.index(b"op2")
    torn = two[:cut] + one[cut:]
    assert json.loads(torn)["operation"] == "op1" and json.loads(torn)["pid"] == 202
    assert classify(torn, pid_to_run, lid) == "partial"


RUNS = 150 if os.environ.get("LOOPLOCK_SANITIZED") == "1" else 500

READER = r"""
import json, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
seen, reads = set(), 0
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    for _ in range(100):
        seen.add(os.pread(fd, 65536, 0))
    reads += 100
json.dump({"reads": reads, "seen": [s.hex() for s in seen]}, sys.stdout)
"""


def test_concurrent_reader_never_sees_a_mixed_record(tmp_path, loop_dir):
    """A reader process reads the lock file as fast as it can while 500 short
    runs (150 in the ASan+UBSan build, where a run costs ten times as much) (4 at a time, agent ids of different lengths) write and release their
    records. Every distinct content it saw must be empty, unparseable
    (partial), or one whole record whose fields all come from one run."""
    lock = loop_dir / ".state.lock"
    lid = expected_lock_id(loop_dir)
    pid_to_run = {}

    def one(i):
        pad = (i * 37) % 150
        agent = f"run{i}-len{pad}-" + "p" * pad
        p = subprocess.Popen([LOOPLOCK, "-p", "blocking", "--agent", agent, "--operation", f"op{i}", str(loop_dir),
                              "--", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        pid_to_run[p.pid] = i
        _, err = p.communicate(timeout=TIMEOUT)
        return p.returncode, err

    assert one(0)[0] == 0  # the file exists and holds a record before reading starts
    stop = tmp_path / "stop-reading"
    reader = subprocess.Popen([PY, "-c", READER, str(lock), str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        expect_line(reader, "ready")
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(1, RUNS + 1)))
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=TIMEOUT)
    assert all(rc == 0 for rc, _ in results), [e for rc, e in results if rc != 0][:3]
    report = json.loads(out)
    kinds = {"empty": 0, "partial": 0, "valid": 0}
    runs_seen = set()
    for raw in map(bytes.fromhex, report["seen"]):
        k = classify(raw, pid_to_run, lid)
        kinds[k] += 1
        if k == "valid":
            runs_seen.add(json.loads(raw)["operation"])
    # The check is only meaningful if the reader really raced the writers.
    assert report["reads"] > 1000, report["reads"]
    assert len(runs_seen) >= 20, (kinds, len(runs_seen))
    final = read_record(loop_dir)
    assert final["released_at"] is not None and AGENT_RE.match(final["agent_id"])
