"""looplock --inspect [--json] DIR (looplock-inspect(7)).

Covers: a free lock with no file (inspect creates nothing), a live looplock
holder, a free lock after a release, a record left by a SIGKILLed holder, a
reused pid, a flock(1) holder, garbage / binary / huge lock file content,
--stale-after, the incident count and latest row, the exit status (0 held or
free, 66 without DIR), the --json object's keys, and that inspect never
changes anything (lock file bytes and mtime, directory listing, a holder
still holding).
"""
import json
import os
import re
import signal
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import (EX_CANTCREAT, EX_NOINPUT, EX_TEMPFAIL, Holder, LOOPLOCK, NO_PROC, PID_NS, PY, TIMEOUT, eventually,
                      expect_line, expected_lock_id, helper, incident_rows, lock_is_free, need_no_proc,
                      need_pid_namespace, read_record, run, running, start, wait_until)

LOCK = ".state.lock"
INCIDENTS = ".state.lock.incidents.jsonl"



def snapshot(loop_dir):
    """What inspect must leave exactly as it was."""
    snap = {"listing": sorted(os.listdir(loop_dir))}
    for name in os.listdir(loop_dir):
        p = loop_dir / name
        st = p.lstat()
        snap[name] = (st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink,
                      p.read_bytes() if p.is_file() and not p.is_symlink() else None)
    return snap


def inspect(loop_dir, *opts, cwd=None):
    """Runs --inspect and --inspect --json; checks both exit 0, that the JSON
    is one object on one line, and that nothing changed. Returns (obj, text)."""
    before = snapshot(loop_dir)
    t = run(["--inspect", *opts, loop_dir], cwd=cwd)
    j = run(["--inspect", "--json", *opts, loop_dir], cwd=cwd)
    after = snapshot(loop_dir)
    assert t.returncode == 0, t.stderr
    assert j.returncode == 0, j.stderr
    assert t.stdout.strip(), "the text report is empty"
    assert j.stdout.endswith("\n") and j.stdout.count("\n") == 1, j.stdout
    obj = json.loads(j.stdout)
    check_keys(obj, loop_dir)
    assert after == before, "inspect changed the loop directory"
    return obj, t.stdout


def check_keys(obj, loop_dir):
    assert isinstance(obj, dict)
    assert set(obj) >= {"lock_file", "lock_id", "exists", "kernel", "record", "incidents", "warnings",
                        "operator_action"}, obj
    assert set(obj["kernel"]) >= {"held", "mode", "holder_pids"}, obj
    assert set(obj["record"]) >= {"state", "holder", "released", "age_ms", "pid_alive", "same_process"}, obj
    assert set(obj["incidents"]) >= {"count", "malformed", "latest"}, obj
    assert obj["lock_file"].endswith(LOCK)
    assert obj["lock_id"] == expected_lock_id(loop_dir)
    assert isinstance(obj["exists"], bool)
    # held is null exactly when the kernel's view is unknown (never "free" then).
    assert isinstance(obj["kernel"]["held"], bool) or (obj["kernel"]["held"] is None and obj["kernel"]["unknown"])
    assert isinstance(obj["kernel"]["holder_pids"], list)
    assert obj["kernel"]["mode"] in (("exclusive", "shared") if obj["kernel"]["held"] else (None,))
    assert isinstance(obj["warnings"], list) and all(isinstance(w, str) for w in obj["warnings"])
    assert isinstance(obj["operator_action"], str) and obj["operator_action"]
    assert isinstance(obj["incidents"]["count"], int) and isinstance(obj["incidents"]["malformed"], int)


def pid_start(pid):
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()[19]


def iso(dt):
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def forged_record(loop_dir, **fields):
    rec = {"schema": "file_lock_holder_v0", "lock_id": expected_lock_id(loop_dir), "pid": os.getpid(),
           "pid_start": pid_start(os.getpid()), "agent_id": "forger", "operation": "forge.py",
           "policy": "mutation", "acquired_at": iso(datetime.now(timezone.utc)), "released_at": None}
    rec.update(fields)
    return rec


def write_lock(loop_dir, data):
    """Writes DIR/.state.lock as looplock creates it: mode 0660 (a file other
    users can read is warned about)."""
    p = loop_dir / LOCK
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    os.chmod(p, 0o660)


@pytest.fixture
def forged_holder():
    """A Python holder that writes a record (helpers/hold_record.py)."""
    made = []

    def make(loop_dir, record):
        proc = subprocess.Popen([PY, helper("hold_record.py"), str(loop_dir / LOCK), json.dumps(record)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        expect_line(proc, "ready")
        h = Holder(proc)
        made.append(h)
        return h

    yield make
    for h in made:
        h.kill()


# --- free, held, released --------------------------------------------------------


def test_free_lock_without_a_file_creates_nothing(loop_dir):
    obj, text = inspect(loop_dir)
    assert not (loop_dir / LOCK).exists()
    assert os.listdir(loop_dir) == []
    assert obj["exists"] is False
    assert (obj["kernel"]["held"], obj["kernel"]["mode"], obj["kernel"]["holder_pids"]) == (False, None, [])
    assert obj["record"]["holder"] is None
    assert obj["incidents"]["count"] == 0 and obj["incidents"]["latest"] is None
    assert obj["warnings"] == []
    assert "free" in text


def test_live_looplock_holder(loop_dir, holders):
    h = holders(loop_dir, tool="looplock", extra=("--agent", "live-agent"))
    obj, text = inspect(loop_dir)
    assert obj["exists"] is True
    assert obj["kernel"]["held"] is True and obj["kernel"]["mode"] == "exclusive"
    assert h.pid in obj["kernel"]["holder_pids"]
    rec = obj["record"]
    assert rec["state"] == "valid"
    in_file = json.loads((loop_dir / LOCK).read_text())
    assert in_file.pop("check")  # the file's integrity check; the report carries the record's fields
    assert rec["holder"] == in_file
    assert rec["holder"]["pid"] == h.pid and rec["holder"]["agent_id"] == "live-agent"
    assert rec["released"] is False
    assert rec["pid_alive"] is True and rec["same_process"] is True
    assert isinstance(rec["age_ms"], int) and 0 <= rec["age_ms"] < 600_000
    assert obj["warnings"] == []
    assert str(h.pid) in obj["operator_action"]
    assert re.search(rf"\b{h.pid}\b", text) and "live-agent" in text
    # inspect took nothing: the holder still holds, and releases normally.
    assert not lock_is_free(loop_dir)
    assert h.proc.poll() is None
    assert h.release() == 0
    assert lock_is_free(loop_dir)


def test_shared_holders(loop_dir, holders):
    a = holders(loop_dir, tool="looplock", shared=True)
    b = holders(loop_dir, tool="flock", shared=True)
    obj, _ = inspect(loop_dir)
    assert obj["kernel"]["held"] is True and obj["kernel"]["mode"] == "shared"
    assert {a.pid, b.pid} <= set(obj["kernel"]["holder_pids"])
    assert not lock_is_free(loop_dir)
    a.release(), b.release()


def test_free_after_a_normal_release(loop_dir):
    assert run(["--agent", "done-agent", loop_dir, "--", "true"]).returncode == 0
    obj, text = inspect(loop_dir)
    assert obj["exists"] is True
    assert (obj["kernel"]["held"], obj["kernel"]["mode"], obj["kernel"]["holder_pids"]) == (False, None, [])
    assert obj["record"]["state"] == "valid"
    assert obj["record"]["released"] is True
    assert obj["record"]["holder"]["agent_id"] == "done-agent"
    assert obj["record"]["holder"]["released_at"] is not None
    assert obj["warnings"] == []
    assert "free" in text


# --- disagreements -----------------------------------------------------------------


def test_record_left_by_a_killed_holder(loop_dir, holders):
    h = holders(loop_dir, tool="looplock", extra=("--agent", "doomed"))
    children = Path(f"/proc/{h.pid}/task/{h.pid}/children").read_text().split()
    assert children, "the holder's command is not running"
    h.proc.send_signal(signal.SIGKILL)
    h.proc.wait(timeout=TIMEOUT)
    # Its command dies too (parent-death signal), so the kernel frees the lock.
    assert eventually(lambda: not any(running(int(c)) for c in children)), "the command outlived looplock"
    assert eventually(lambda: lock_is_free(loop_dir))
    obj, text = inspect(loop_dir)
    assert obj["kernel"]["held"] is False
    rec = obj["record"]
    assert rec["state"] == "valid" and rec["released"] is False
    assert rec["holder"]["pid"] == h.pid and rec["holder"]["agent_id"] == "doomed"
    assert rec["pid_alive"] is False
    crashed = [w for w in obj["warnings"] if re.search(r"crash|killed", w, re.I)]
    assert crashed and str(h.pid) in crashed[0], obj["warnings"]
    assert re.search(r"crash|killed", text, re.I), text


def test_reused_pid_in_a_stale_record(loop_dir):
    # The record names a live process (this test) but with another start time.
    write_lock(loop_dir, json.dumps(forged_record(loop_dir, pid_start="1")) + "\n")
    obj, text = inspect(loop_dir)
    assert obj["kernel"]["held"] is False
    assert obj["record"]["state"] == "valid"
    assert obj["record"]["pid_alive"] is True
    assert obj["record"]["same_process"] is False
    reused = [w for w in obj["warnings"] if re.search(r"reuse", w, re.I)]
    assert reused and str(os.getpid()) in reused[0], obj["warnings"]
    assert re.search(r"reuse", text, re.I), text


def test_reused_pid_while_another_process_holds(loop_dir, forged_holder):
    h = forged_holder(loop_dir, forged_record(loop_dir, pid_start="1", keep_pid=True))
    obj, _ = inspect(loop_dir)
    assert obj["kernel"]["held"] is True and obj["kernel"]["holder_pids"] == [h.pid]
    assert obj["record"]["same_process"] is False
    assert any(re.search(r"reuse", w, re.I) for w in obj["warnings"]), obj["warnings"]
    assert not lock_is_free(loop_dir)
    assert h.release() == 0


def test_control_matching_record_has_no_reuse_warning(loop_dir):
    write_lock(loop_dir, json.dumps(forged_record(loop_dir)) + "\n")
    obj, _ = inspect(loop_dir)
    assert obj["record"]["same_process"] is True
    assert not any(re.search(r"reuse", w, re.I) for w in obj["warnings"]), obj["warnings"]


def test_flock_holder_without_record(loop_dir, holders):
    h = holders(loop_dir, tool="flock")
    obj, text = inspect(loop_dir)
    assert obj["kernel"]["held"] is True and obj["kernel"]["mode"] == "exclusive"
    assert obj["kernel"]["holder_pids"] == [h.pid]
    assert obj["record"]["holder"] is None
    assert obj["record"]["state"] == "empty"
    no_record = [w for w in obj["warnings"] if "record" in w and str(h.pid) in w]
    assert no_record, obj["warnings"]
    assert str(h.pid) in obj["operator_action"]
    assert re.search(rf"\b{h.pid}\b", text)
    assert not lock_is_free(loop_dir)
    assert h.release() == 0


GARBAGE = {
    "text": b"not a record at all\n",
    "truncated": b'{"schema":"file_lock_holder_v0","lock_id":"0123',
    "binary": bytes(range(256)) * 16,
    "nul_bytes": b"\0" * 4096,
    "wrong_schema": b'{"schema":"something_else","pid":1}\n',
    "json_array": b"[1, 2, 3]\n",
    "two_records": None,  # filled in by the test: a whole record twice
    "huge": b"{" + b" " * (1024 * 1024 + 100) + b"}\n",
    "huge_after_record": None,
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_lock_file_is_reported_unreadable(loop_dir, kind):
    content = GARBAGE[kind]
    whole = (json.dumps(forged_record(loop_dir)) + "\n").encode()
    if kind == "two_records":
        content = whole + whole
    elif kind == "huge_after_record":
        content = whole + b"x" * (2 * 1024 * 1024)
    write_lock(loop_dir, content)
    obj, text = inspect(loop_dir)
    assert obj["exists"] is True
    assert obj["record"]["state"] == "unreadable"
    assert obj["record"]["holder"] is None
    assert obj["warnings"], "unreadable content must be reported"
    assert "warning" in text
    assert (loop_dir / LOCK).read_bytes() == content


def test_garbage_while_held_by_python(loop_dir, holders):
    write_lock(loop_dir, b"\xff\xfe garbage {")
    h = holders(loop_dir, tool="python")
    obj, _ = inspect(loop_dir)
    assert obj["kernel"]["held"] is True and obj["kernel"]["holder_pids"] == [h.pid]
    assert obj["record"]["state"] == "unreadable"
    assert not lock_is_free(loop_dir)
    h.release()


# --- --stale-after ---------------------------------------------------------------


def test_stale_after(loop_dir, forged_holder):
    old = iso(datetime.now(timezone.utc) - timedelta(minutes=10))
    h = forged_holder(loop_dir, forged_record(loop_dir, acquired_at=old, agent_id="slow-agent"))
    obj, _ = inspect(loop_dir, "--stale-after", "1s")
    assert obj["kernel"]["holder_pids"] == [h.pid]
    rec = obj["record"]
    assert rec["holder"]["pid"] == h.pid and rec["pid_alive"] is True and rec["same_process"] is True
    assert rec["age_ms"] >= 600_000
    stale = [w for w in obj["warnings"] if str(h.pid) in w]
    assert len(obj["warnings"]) == 1 and stale, obj["warnings"]
    # Control: under the default (2h) and a long --stale-after, no warning.
    obj, _ = inspect(loop_dir)
    assert obj["warnings"] == [], obj["warnings"]
    obj, _ = inspect(loop_dir, "--stale-after", "1h")
    assert obj["warnings"] == [], obj["warnings"]
    assert not lock_is_free(loop_dir)
    assert h.release() == 0


def test_a_record_from_the_future_is_said_not_shown_as_0ms_ago(loop_dir, forged_holder):
    """A holder record whose acquired_at lies 3 s ahead of this host's clock
    (the clock that wrote it was ahead): the text says how far ahead, not
    "0ms ago", and a warning says why --stale-after cannot judge it."""
    ahead = iso(datetime.now(timezone.utc) + timedelta(seconds=3))
    h = forged_holder(loop_dir, forged_record(loop_dir, acquired_at=ahead))
    obj, text = inspect(loop_dir)
    assert obj["record"]["age_ms"] < 0, obj["record"]
    assert "from now, by this host's clock" in text and "0ms ago" not in text, text
    assert any("the hold began" in w and "from now" in w for w in obj["warnings"]), obj["warnings"]
    assert h.release() == 0


def test_stale_after_default_is_hours(loop_dir, forged_holder):
    old = iso(datetime.now(timezone.utc) - timedelta(hours=3))
    h = forged_holder(loop_dir, forged_record(loop_dir, acquired_at=old))
    obj, text = inspect(loop_dir)
    assert len(obj["warnings"]) == 1 and str(h.pid) in obj["warnings"][0], obj["warnings"]
    assert "warning" in text
    h.release()


# --- incidents ------------------------------------------------------------------


def test_incident_count_and_latest_row(loop_dir, holders):
    h = holders(loop_dir, tool="flock")
    for agent in ("first-waiter", "second-waiter"):
        r = run(["-w", "0.1", "--agent", agent, loop_dir, "--", "true"])
        assert r.returncode == EX_TEMPFAIL, r.stderr
    rows = incident_rows(loop_dir)
    assert len(rows) == 2
    obj, text = inspect(loop_dir)
    assert obj["incidents"]["count"] == 2
    assert obj["incidents"]["malformed"] == 0
    assert obj["incidents"]["latest"] == rows[-1]
    assert obj["incidents"]["latest"]["waiter"]["agent_id"] == "second-waiter"
    assert re.search(r"incidents\s+2\b", text), text
    assert str(rows[-1]["waiter"]["pid"]) in text
    assert not lock_is_free(loop_dir)
    h.release()

    # A malformed line is counted as such; latest stays the last whole row.
    with open(loop_dir / INCIDENTS, "ab") as f:
        f.write(b'{"schema":"file_lock_incident_v0","at":\n')
    obj, _ = inspect(loop_dir)
    assert obj["incidents"]["malformed"] == 1
    assert obj["incidents"]["latest"] == rows[-1]

    # --incidents N: the newest N valid rows, oldest first, one line each.
    obj = json.loads(run(["--inspect", "--json", "--incidents", "5", loop_dir]).stdout)
    assert obj["incidents"]["recent"] == rows  # both, oldest first
    assert obj["incidents"]["count"] == 3 and obj["incidents"]["examined"] == 3 and obj["incidents"]["malformed"] == 1
    r = run(["--inspect", "--incidents", "2", loop_dir])
    lines = [line for line in r.stdout.splitlines() if line.startswith("incident  ")]
    assert len(lines) == 2, r.stdout
    assert f"pid {rows[0]['waiter']['pid']} " in lines[0] and f"pid {rows[1]['waiter']['pid']} " in lines[1], lines
    for bad in (["--inspect", "--incidents", "0", loop_dir], ["--inspect", "--incidents", "x", loop_dir],
                ["--incidents", "2", loop_dir, "--", "true"]):
        r = run(bad)
        assert r.returncode == 64, (bad, r.stderr)


# --- exit status and arguments ---------------------------------------------------------


def test_missing_dir_exits_66(tmp_path):
    r = run(["--inspect", tmp_path / "nope"])
    assert r.returncode == EX_NOINPUT, r.stderr
    assert r.stderr.startswith("looplock: ")
    assert r.stdout == ""
    # --json: an entry a pipeline can index, with its error.
    r = run(["--inspect", "--json", tmp_path / "nope"])
    assert r.returncode == EX_NOINPUT, r.stderr
    assert r.stderr.startswith("looplock: ")
    entry = json.loads(r.stdout)
    assert entry["lock_file"] == f"{tmp_path / 'nope'}/.state.lock"
    assert entry["error"]["status"] == EX_NOINPUT and entry["error"]["event"] == "dir_missing"
    assert not (tmp_path / "nope").exists()
    f = tmp_path / "file"
    f.write_text("")
    assert run(["--inspect", f]).returncode == EX_NOINPUT


def test_relative_and_trailing_slash_dir(tmp_path, loop_dir, holders):
    h = holders(loop_dir, tool="looplock")
    r1 = run(["--inspect", "--json", "loop"], cwd=tmp_path)
    r2 = run(["--inspect", "--json", str(loop_dir) + "/"])
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    o1, o2 = json.loads(r1.stdout), json.loads(r2.stdout)
    assert o1["lock_id"] == o2["lock_id"] == expected_lock_id(loop_dir)
    assert h.pid in o1["kernel"]["holder_pids"] and h.pid in o2["kernel"]["holder_pids"]
    h.release()


def test_hostile_identity_cannot_forge_report_lines(loop_dir, holders):
    agent = "evil\naction    delete the lock file\x1b[2J"
    h = holders(loop_dir, tool="looplock", extra=("--agent", agent, "--operation", "op\rwarning   forged"))
    obj, text = inspect(loop_dir)
    assert obj["record"]["holder"]["agent_id"] == agent  # JSON keeps it exactly
    assert "\x1b" not in text and "\r" not in text, repr(text)
    actions = [ln for ln in text.splitlines() if ln.startswith("action")]
    assert len(actions) == 1 and "delete the lock file" not in actions[0].replace("Never delete the lock file", ""), text
    h.release()


# --- what inspect cannot see ---------------------------------------------------------
#
# It says "unknown", never "free", and names why; a live holder seen from
# another pid namespace, or without a readable start time, is described as
# such, not as gone.


def inspect_json_via(prefix, loop_dir):
    r = subprocess.run([*prefix, LOOPLOCK, "--inspect", "--json", str(loop_dir)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    check_keys(obj, loop_dir)
    return obj


def assert_unknown(obj, why):
    assert obj["kernel"]["held"] is None, obj["kernel"]
    assert why in obj["kernel"]["unknown"], obj["kernel"]
    assert obj["operator_action"].startswith("unknown"), obj["operator_action"]
    assert any("unknown" in w for w in obj["warnings"]), obj["warnings"]


def test_unreadable_proc_locks_is_unknown_not_free(loop_dir, holders):
    """Five descriptors: stdio, DIR and the lock file; /proc/locks cannot be opened."""
    holders(loop_dir, tool="flock")
    obj = inspect_json_via(["prlimit", "--nofile=5"], loop_dir)
    assert_unknown(obj, "cannot read /proc/locks: Too many open files")
    r = subprocess.run(["prlimit", "--nofile=5", LOOPLOCK, "--inspect", str(loop_dir)], capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert "kernel    unknown (cannot read /proc/locks: Too many open files)" in r.stdout, r.stdout
    assert "free" not in r.stdout, r.stdout


def test_no_proc_is_unknown_not_free(loop_dir, holders):
    need_no_proc()
    holders(loop_dir, tool="flock")
    assert_unknown(inspect_json_via(NO_PROC, loop_dir), "cannot read /proc/locks")


def test_a_holder_outside_the_pid_namespace_is_unknown_not_free(loop_dir, holders):
    need_pid_namespace()
    holders(loop_dir, tool="flock")
    assert_unknown(inspect_json_via(PID_NS, loop_dir), "pid namespace of its own")
    # The control: from here the same lock is seen held.
    assert inspect(loop_dir)[0]["kernel"]["held"] is True


@pytest.mark.parametrize("where", ["here", "own_namespace"])
def test_a_looplock_holder_outside_the_pid_namespace_has_an_unconfirmed_record_not_a_stale_one(loop_dir, where):
    """Seen from a pid namespace of its own, the holder's pid is unknown, not
    gone: its record is "unconfirmed" and no warning calls it stale or its
    pid reused, also when the holder wrote its record as pid 1 of a pid
    namespace of its own (pid 1 here is another process). Before, it was
    "stale (not the holder)", pointing the operator the wrong way."""
    need_pid_namespace()
    prefix = PID_NS if where == "own_namespace" else []
    p = subprocess.Popen([*prefix, LOOPLOCK, "-p", "blocking", str(loop_dir), "--", PY, helper("wait_stdin.py")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(p, "ready")
        obj = inspect_json_via(PID_NS, loop_dir)
        assert obj["record"]["status"] == "unconfirmed", obj["record"]
        assert not any("stale" in w or "reuse" in w for w in obj["warnings"]), obj["warnings"]
    finally:
        Holder(p).release()


def test_holder_index_files_seen_from_a_pid_namespace_are_unknown_not_free(loop_dir):
    """--holders 2 with a holder outside: from a pid namespace of its own the
    kernel lists no holder of its index file, which is therefore unknown,
    not free (before: "0 of 1 index files held", "held": false)."""
    need_pid_namespace()
    p = subprocess.Popen([LOOPLOCK, "--holders", "2", str(loop_dir), "--", PY, helper("wait_stdin.py")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(p, "ready")
        obj = inspect_json_via(PID_NS, loop_dir)
        assert [x["held"] for x in obj["holder_indexes"]] == [None], obj["holder_indexes"]
        assert obj["holder_indexes"][0]["record_status"] == "unconfirmed", obj["holder_indexes"]
        t = subprocess.run([*PID_NS, LOOPLOCK, "--inspect", str(loop_dir)], capture_output=True, text=True,
                           timeout=TIMEOUT)
        assert "1 index file (--holders); which are held is unknown" in t.stdout, t.stdout
        assert inspect(loop_dir)[0]["holder_indexes"][0]["held"] is True  # the control: seen held from here
    finally:
        Holder(p).release()


def test_a_holder_whose_record_was_written_in_a_pid_namespace_is_alive(loop_dir, holders):
    """A containerised looplock writes its pid as seen inside (1); from here
    that holder has another pid, found through NSpid and the start time."""
    need_pid_namespace()
    p = subprocess.Popen([*PID_NS, LOOPLOCK, "-p", "blocking", str(loop_dir), "--", PY, helper("wait_stdin.py")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(p, "ready")
        obj, text = inspect(loop_dir)
        assert obj["record"]["holder"]["pid"] == 1
        assert obj["record"]["pid_alive"] is True and obj["record"]["same_process"] is True
        assert "in its own pid namespace" in obj["record"]["pid_note"]
        assert not any(re.search(r"reuse|dead", w) for w in obj["warnings"]), obj["warnings"]
        assert "alive, same process, pid 1 in its own pid namespace" in text, text
    finally:
        Holder(p).release()


def test_a_record_without_a_start_time_is_not_a_reused_pid(loop_dir, forged_holder):
    """Written where /proc could not be read: the start time is empty. The
    holder is alive and holds the lock: no "pid reused" warning."""
    h = forged_holder(loop_dir, forged_record(loop_dir, blank_start=True))
    obj, text = inspect(loop_dir)
    assert obj["record"]["holder"]["pid"] == h.pid and obj["record"]["holder"]["pid_start"] == ""
    assert obj["record"]["pid_alive"] is True and obj["record"]["same_process"] is None
    assert obj["warnings"] == [], obj["warnings"]
    assert "alive (its start time cannot be compared)" in text, text
    # A timeout behind it names it as the live holder, too.
    r = run(["-w", "0.1", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    assert incident_rows(loop_dir)[-1]["holder_alive"] is True


def test_json_has_one_entry_per_dir_in_order_errors_included(tmp_path, loop_dir):
    """`--inspect --json /nonexistent D` printed one element: a pipeline could
    not index the output by argument."""
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "file-not-dir").write_text("")
    r = run(["--inspect", "--json", tmp_path / "nope", loop_dir, tmp_path / "file-not-dir", other])
    assert r.returncode == EX_NOINPUT, r.stderr
    entries = json.loads(r.stdout)
    assert [e["lock_file"] for e in entries] == [f"{p}/.state.lock" for p in
                                                 (tmp_path / "nope", loop_dir, tmp_path / "file-not-dir", other)]
    assert [("error" in e) for e in entries] == [True, False, True, False]
    assert entries[2]["error"]["event"] == "not_a_directory"
    assert entries[1]["lock_id"] == expected_lock_id(loop_dir)


def test_a_lock_file_other_users_can_read_is_warned_about(loop_dir):
    """flock(2) needs only a read descriptor: any local user who can read the
    lock file can take the lock and stall every run."""
    r = run([loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    assert os.stat(loop_dir / LOCK).st_mode & 0o777 == 0o660 & ~current_umask()
    obj, _ = inspect(loop_dir)
    assert obj["warnings"] == [], obj["warnings"]
    os.chmod(loop_dir / LOCK, 0o644)  # as earlier versions created it
    obj, text = inspect(loop_dir)
    assert any("any local user can take this lock" in w and f"chmod o-rw {loop_dir}/.state.lock" in w
               for w in obj["warnings"]), obj["warnings"]
    assert run(["--inspect", "--check", loop_dir]).returncode == 1
    # A run says nothing about it, and never changes the mode.
    r = run([loop_dir, "--", "true"])
    assert (r.returncode, r.stderr) == (0, "")
    assert os.stat(loop_dir / LOCK).st_mode & 0o777 == 0o644


def current_umask():
    old = os.umask(0)
    os.umask(old)
    return old


@pytest.mark.parametrize("how", ["two-links", "foreign-owner"])
def test_check_fails_what_every_run_refuses(loop_dir, how):
    """A lock file that every run refuses (73) is a warning, and --check
    fails: it said "action none: the lock is free" and exited 0."""
    assert run([loop_dir, "--", "true"]).returncode == 0
    if how == "two-links":
        os.link(loop_dir / LOCK, loop_dir / "another-name")
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the lock file to another user")
        os.chown(loop_dir / LOCK, 65534, 65534)
    r = run([loop_dir, "--", "echo", "ran"])
    assert r.returncode == EX_CANTCREAT and r.stdout == "", r.stderr
    obj, text = inspect(loop_dir)
    refused = [w for w in obj["warnings"] if "looplock refuses to lock it (every run exits 73)" in w]
    assert refused, obj["warnings"]
    assert ("2 hard links" in refused[0]) if how == "two-links" else ("owned by uid 65534" in refused[0])
    assert obj["operator_action"].startswith("every run refuses this lock file (exit 73): ")
    assert "looplock refuses to lock it" in text
    assert run(["--inspect", "--check", loop_dir]).returncode == 1


def test_check_passes_after_an_ordinary_no_fork_run(loop_dir):
    """-F leaves no release behind by design: its record says no_fork, and
    --check stays green (it failed with "the holder crashed")."""
    r = run(["-F", loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    assert read_record(loop_dir)["no_fork"] is True
    obj, text = inspect(loop_dir)
    assert obj["warnings"] == [], obj["warnings"]
    assert obj["record"]["status"] == "ended"
    assert "ended (an -F run writes no release)" in text
    assert run(["--inspect", "--check", loop_dir]).returncode == 0
    # A looplock that did not end normally is still one: --check fails.
    h = start([loop_dir, "--", PY, helper("wait_stdin.py")])
    expect_line(h, "ready")
    os.kill(h.pid, signal.SIGKILL)
    h.wait(timeout=TIMEOUT)
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free")
    assert run(["--inspect", "--check", loop_dir]).returncode == 1
