"""Incident rows in DIR/.state.lock.incidents.jsonl (looplock-files(5)),
and the lines that report a timeout.

Covers: one well-formed row per timeout (every field) with a flock(1) holder
and with a looplock holder, monitor rows, no row for a single_flight skip or
a successful run, 16 simultaneous timeouts -> 16 whole rows, a failing append
(directory, dangling symlink, symlink to a file) that neither delays nor
changes the timeout, the holder named by the timeout line and by -v's
"waiting for" line, and --log-format json.
"""
import json
import os
import re
import time

import pytest

from conftest import EX_TEMPFAIL, PY, TIMEOUT, incident_rows, run, start, expected_lock_id

INCIDENTS = ".state.lock.incidents.jsonl"
ISO_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
ROW_FIELDS = ["schema", "at", "error_code", "lock_id", "policy", "deadline_ms", "waited_ms", "holder",
              "holder_alive", "holder_pids", "waiter", "operator_action"]
SECRET = "--password=hunter2-TOPSECRET"



def check_row(row, loop_dir, policy, deadline_ms):
    for k in ROW_FIELDS:
        assert k in row, f"row lacks {k}: {row}"
    assert row["schema"] == "file_lock_incident_v0"
    assert ISO_MS_Z.match(row["at"]), row
    assert row["error_code"] == "lock_acquire_timeout"
    assert row["lock_id"] == expected_lock_id(loop_dir)
    assert row["policy"] == policy
    assert row["deadline_ms"] == deadline_ms
    assert isinstance(row["waited_ms"], int) and row["waited_ms"] >= deadline_ms, row
    assert row["waited_ms"] < deadline_ms + 10_000, row
    assert isinstance(row["holder_pids"], list) and all(isinstance(p, int) for p in row["holder_pids"])
    assert row["holder_alive"] in (True, False, None)
    w = row["waiter"]
    assert isinstance(w, dict) and set(w) >= {"pid", "agent_id", "operation"}, w
    assert isinstance(w["pid"], int) and isinstance(w["agent_id"], str) and isinstance(w["operation"], str)
    action = row["operator_action"]
    assert isinstance(action, str) and action.strip(), row
    assert re.search(r"\b(never|not|don't)\b[^.;]*\bdelete\b[^.;]*\block file\b", action, re.I), action


def raw_incidents(loop_dir):
    p = loop_dir / INCIDENTS
    return p.read_bytes() if p.exists() else b""


def no_path_in(raw, *paths):
    text = raw.decode("utf-8", "replace")
    for p in paths:
        for form in {str(p), os.path.realpath(p)}:
            assert form not in text, f"absolute path {form} leaked into {text!r}"


@pytest.fixture
def status_py(tmp_path):
    p = tmp_path / "scripts" / "status.py"
    p.parent.mkdir()
    p.write_text("print('tick')\n")
    return p


def time_out(loop_dir, opts, cmd=("true",), **kw):
    """Starts a waiter that must time out; returns (pid, stderr, seconds)."""
    t0 = time.monotonic()
    proc = start([*opts, loop_dir, "--", *cmd], **kw)
    _, err = proc.communicate(timeout=TIMEOUT)
    elapsed = time.monotonic() - t0
    assert proc.returncode == EX_TEMPFAIL, err
    return proc.pid, err, elapsed


# --- one row per timeout -----------------------------------------------------


def test_timeout_behind_flock_holder_writes_one_row(tmp_path, loop_dir, holders, status_py):
    h = holders(loop_dir, tool="flock")
    pid, err, _ = time_out(loop_dir, ["-w", "0.3", "--agent", "cron-w"], cmd=(PY, str(status_py), "--tick", SECRET))
    raw = raw_incidents(loop_dir)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
    (row,) = incident_rows(loop_dir)
    check_row(row, loop_dir, "mutation", 300)
    assert row["holder"] is None
    assert row["holder_alive"] is None
    assert row["holder_pids"] == [h.pid]
    assert row["waiter"]["pid"] == pid
    assert row["waiter"]["agent_id"] == "cron-w"
    assert row["waiter"]["operation"] == "status.py"
    assert b"hunter2" not in raw
    no_path_in(raw, tmp_path, status_py)
    # The lock file was not touched by the waiter.
    assert (loop_dir / ".state.lock").read_bytes() == b""
    assert h.release() == 0


def test_timeout_behind_looplock_holder_writes_its_record(tmp_path, loop_dir, holders):
    h = holders(loop_dir, tool="looplock", extra=("--agent", "holder-agent", "--operation", "holder-op"))
    record = json.loads((loop_dir / ".state.lock").read_text())
    record.pop("check")  # the file's integrity check; rows carry the record's fields
    pid, _, _ = time_out(loop_dir, ["-w", "0.3", "--agent", "waiter-agent"], cmd=("sh", "-c", ": " + SECRET))
    (row,) = incident_rows(loop_dir)
    check_row(row, loop_dir, "mutation", 300)
    assert row["holder"] == record
    assert row["holder"]["pid"] == h.pid and row["holder"]["released_at"] is None
    assert row["holder_alive"] is True
    assert h.pid in row["holder_pids"]
    assert row["waiter"] == {"pid": pid, "agent_id": "waiter-agent", "operation": "sh"}
    raw = raw_incidents(loop_dir)
    assert b"hunter2" not in raw
    no_path_in(raw, tmp_path)
    assert h.release() == 0
    # A second timeout appends a second row; the first is left as it was.
    h2 = holders(loop_dir, tool="python")
    time_out(loop_dir, ["-w", "0"])
    rows = incident_rows(loop_dir)
    assert len(rows) == 2 and rows[0] == row
    check_row(rows[1], loop_dir, "mutation", 0)
    assert rows[1]["holder_pids"] == [h2.pid]
    # The record the released holder left is read as it is: released, so not
    # the holder the kernel names.
    assert rows[1]["holder"] is None or rows[1]["holder"]["released_at"] is not None
    h2.release()


@pytest.mark.parametrize("opts, deadline_ms", [(["-w", "0.2"], 200), ([], 1000)])
def test_monitor_timeout_row(loop_dir, holders, opts, deadline_ms):
    h = holders(loop_dir, tool="flock")
    pid, err, elapsed = time_out(loop_dir, ["-p", "monitor", *opts])
    assert elapsed >= deadline_ms / 1000 - 0.05
    (row,) = incident_rows(loop_dir)
    check_row(row, loop_dir, "monitor", deadline_ms)
    assert row["waiter"]["pid"] == pid
    assert row["holder_pids"] == [h.pid]
    assert "lock_acquire_timeout" in err
    h.release()


def test_no_row_for_single_flight_skip_or_success(loop_dir, holders):
    assert run([loop_dir, "--", "true"]).returncode == 0
    assert run(["-p", "monitor", loop_dir, "--", "true"]).returncode == 0
    assert not (loop_dir / INCIDENTS).exists()
    h = holders(loop_dir, tool="looplock")
    r = run(["-p", "single_flight", loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    assert "noop-locked" in r.stderr
    r = run(["-p", "single_flight", "--skip-exit-code", "3", loop_dir, "--", "true"])
    assert r.returncode == 3, r.stderr
    assert not (loop_dir / INCIDENTS).exists()
    assert h.release() == 0
    # Control: the same situation with a deadline does write a row.
    h = holders(loop_dir, tool="looplock")
    time_out(loop_dir, ["-w", "0"])
    assert len(incident_rows(loop_dir)) == 1
    h.release()


def test_sixteen_simultaneous_timeouts_write_sixteen_whole_rows(loop_dir, holders):
    h = holders(loop_dir, tool="looplock")
    procs = [start(["-w", "0.5", "--agent", f"waiter-{i:02d}-" + "x" * (i * 12), loop_dir, "--", "true"])
             for i in range(16)]
    for p in procs:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == EX_TEMPFAIL, err
    raw = raw_incidents(loop_dir)
    lines = raw.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 17, raw[:2000]
    rows = [json.loads(line) for line in lines[:-1]]
    for row in rows:
        check_row(row, loop_dir, "mutation", 500)
        assert h.pid in row["holder_pids"]
        i = int(row["waiter"]["agent_id"][7:9])
        assert row["waiter"]["agent_id"] == f"waiter-{i:02d}-" + "x" * (i * 12)
    assert sorted(r["waiter"]["pid"] for r in rows) == sorted(p.pid for p in procs)
    h.release()


def test_rotating_by_rename_during_fifty_timeouts_loses_no_row(loop_dir, holders):
    """The man page's rotation: rename the file while 50 waiters time out
    at once (each opens it with O_APPEND and writes its row with one
    write(2)); every row lands whole in one of the files. The control: a
    copy-and-truncate rotation (what the man page forbids) loses the rows
    written between its copy and its truncation."""
    h = holders(loop_dir, tool="flock")
    live = loop_dir / INCIDENTS
    # Their deadlines spread over a second (0.3 s to 1.3 s), so that the
    # rows are written while the file is renamed every 10 ms, also on a
    # machine fast enough to time 50 waiters out within one 10 ms step.
    procs = [start(["-w", f"{0.3 + i * 0.02:.2f}", "--agent", f"w{i:02d}", loop_dir, "--", "true"])
             for i in range(50)]
    rotated = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if live.exists():
                target = loop_dir / f"{INCIDENTS}.{len(rotated) + 1}"
                os.rename(live, target)
                rotated.append(target)
            time.sleep(0.01)
    finally:
        for p in procs:
            p.communicate(timeout=TIMEOUT)
    assert all(p.returncode == EX_TEMPFAIL for p in procs)
    assert len(rotated) >= 2, "the waiters' rows went to more than one file"
    rows = []
    for f in [*rotated, live]:
        if f.exists():
            raw = f.read_bytes()
            assert raw == b"" or raw.endswith(b"\n"), raw[-200:]
            rows += [json.loads(line) for line in raw.splitlines() if line]
    assert sorted(r["waiter"]["agent_id"] for r in rows) == [f"w{i:02d}" for i in range(50)]
    h.release()


def test_control_copy_and_truncate_loses_rows(loop_dir, holders):
    h = holders(loop_dir, tool="flock")
    live = loop_dir / INCIDENTS
    assert run(["-w", "0.1", "--agent", "before", loop_dir, "--", "true"]).returncode == EX_TEMPFAIL
    copy = live.read_bytes()  # the copy ...
    assert run(["-w", "0.1", "--agent", "between", loop_dir, "--", "true"]).returncode == EX_TEMPFAIL
    with open(live, "r+b") as f:  # ... and the truncation
        f.truncate(0)
    kept = [json.loads(line)["waiter"]["agent_id"] for line in (copy + live.read_bytes()).splitlines() if line]
    assert kept == ["before"]  # "between" is gone
    h.release()


# --- a failing append --------------------------------------------------------


UNSAFE_INCIDENTS = {"directory": "it is a directory", "dangling_symlink": "it is a symbolic link",
                    "symlink_to_file": "it is a symbolic link", "fifo": "it is not a regular file"}


@pytest.mark.parametrize("kind", list(UNSAFE_INCIDENTS))
def test_failing_append_still_times_out_on_time_and_inspect_warns_of_it(tmp_path, loop_dir, holders, kind):
    path = loop_dir / INCIDENTS
    target = tmp_path / "elsewhere.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "dangling_symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        target.write_bytes(b"precious\n")
        path.symlink_to(target)
    h = holders(loop_dir, tool="flock")
    _, err, elapsed = time_out(loop_dir, ["-w", "0.3"])
    assert 0.25 <= elapsed < 3.0, elapsed
    assert "lock_acquire_timeout" in err
    warnings = [ln for ln in err.splitlines() if "incident" in ln]
    assert len(warnings) == 1, err
    assert warnings[0].startswith("looplock: unsafe incidents file ") and UNSAFE_INCIDENTS[kind] in warnings[0]
    assert "the incident row was not written" in warnings[0]
    # --inspect says that every row is lost, and --check fails on it.
    r = run(["--inspect", "--check", "--json", loop_dir])
    assert r.returncode == 1, (r.stdout, r.stderr)
    (w,) = [x for x in json.loads(r.stdout)["warnings"] if INCIDENTS in x]
    assert "every incident row is lost" in w and UNSAFE_INCIDENTS[kind] in w and "Move it away" in w, w
    if kind == "directory":
        assert path.is_dir() and list(path.iterdir()) == []
    elif kind == "fifo":
        assert path.is_fifo()
    elif kind == "dangling_symlink":
        assert path.is_symlink() and not target.exists() and not os.path.lexists(target)
    else:
        assert path.is_symlink() and target.read_bytes() == b"precious\n"
    h.release()


def test_failing_append_keeps_the_conflict_exit_code(loop_dir, holders):
    (loop_dir / INCIDENTS).mkdir()
    h = holders(loop_dir, tool="python")
    r = run(["-w", "0.2", "-E", "42", loop_dir, "--", "true"])
    assert r.returncode == 42, r.stderr
    assert "lock_acquire_timeout" in r.stderr
    h.release()


# --- the lines that name the holder -------------------------------------------


def test_timeout_and_waiting_lines_name_the_looplock_holder(loop_dir, holders):
    h = holders(loop_dir, tool="looplock", extra=("--agent", "holder-agent-x", "--operation", "holder-op-y"))
    _, err, _ = time_out(loop_dir, ["-v", "-w", "0.3"])
    waiting = [ln for ln in err.splitlines() if "waiting for" in ln]
    timeout = [ln for ln in err.splitlines() if "lock_acquire_timeout" in ln]
    assert len(waiting) == 1 and len(timeout) == 1, err
    for line in waiting + timeout:
        assert line.startswith("looplock: ")
        assert re.search(rf"\b{h.pid}\b", line), line
        assert "holder-agent-x" in line and "holder-op-y" in line, line
    assert err.index(waiting[0]) < err.index(timeout[0])
    h.release()


def test_timeout_and_waiting_lines_name_a_flock_holder(loop_dir, holders):
    h = holders(loop_dir, tool="flock")
    _, err, _ = time_out(loop_dir, ["-v", "-w", "0.3"])
    lines = [ln for ln in err.splitlines() if "waiting for" in ln or "lock_acquire_timeout" in ln]
    assert len(lines) == 2, err
    for line in lines:
        assert re.search(rf"\b{h.pid}\b", line), line
    h.release()


def test_log_format_json_timeout(loop_dir, holders):
    (loop_dir / INCIDENTS).mkdir()  # also make the append fail: its warning is JSON too
    h = holders(loop_dir, tool="looplock", extra=("--agent", "json-holder"))
    _, err, _ = time_out(loop_dir, ["--log-format", "json", "-v", "-w", "0.3"])
    lines = err.splitlines()
    assert len(lines) >= 3, err  # waiting, the timeout, the append warning
    objs = []
    for line in lines:
        obj = json.loads(line)
        assert isinstance(obj, dict), line
        objs.append(obj)
    events = [o.get("event") for o in objs]
    (t,) = [o for o in objs if o.get("event") == "lock_acquire_timeout"]
    assert t["lock_id"] == expected_lock_id(loop_dir)
    assert t["policy"] == "mutation"
    assert isinstance(t["waited_ms"], int) and t["waited_ms"] >= 300
    assert h.pid in t["holder_pids"]
    assert any("incident" in json.dumps(o) for o in objs if o is not t), events
    h.release()


def test_hostile_holder_identity_cannot_forge_log_lines(loop_dir, holders):
    """The holder's agent/operation come from whoever wrote the record; the
    lines that name them must stay one "looplock: " line each (looplock(1): every
    message starts with "looplock: ") with no raw control characters."""
    h = holders(loop_dir, tool="looplock",
                extra=("--agent", "evil\nFORGED line: delete the lock file\x1b[2J", "--operation", "op\rFORGED"))
    _, err, _ = time_out(loop_dir, ["-v", "-w", "0.2"])
    for line in err.splitlines():
        assert line.startswith("looplock: "), f"forged stderr line {line!r} in {err!r}"
    assert "\x1b" not in err and "\r" not in err, repr(err)
    r = run(["-p", "single_flight", loop_dir, "--", "true"])
    assert r.returncode == 0
    for line in r.stderr.splitlines():
        assert line.startswith("looplock: "), f"forged stderr line {line!r} in {r.stderr!r}"
    # The row itself keeps the identity exactly (JSON escapes it).
    (row,) = incident_rows(loop_dir)
    assert row["holder"]["agent_id"] == "evil\nFORGED line: delete the lock file\x1b[2J"
    h.release()


def test_a_limit_below_a_millisecond_is_never_written_as_0_which_means_none(loop_dir):
    r = run(["--max-time", "0.4ms", loop_dir, "--", "sleep", "1"])
    assert r.returncode == 124, r.stderr
    assert "--max-time 1ms" in r.stderr, r.stderr
    assert incident_rows(loop_dir)[-1]["deadline_ms"] == 1
