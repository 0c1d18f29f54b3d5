"""--log-format json (looplock-events(7), LOG LINES): every line looplock writes to
stderr is one JSON object, usage errors included, with ts (UTC,
milliseconds), pid, level, an event name that tells the situation apart, the
lock_id once the run knows it, and the same keys for the same facts across
events. And the one message style of text lines: "looplock: ..." in
looplock's own words, never a library's."""
import json
import os
import re
import signal
import subprocess

import pytest

from conftest import LOOPLOCK, PY, helper, run

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def json_lines(stderr, pid=None):
    out = []
    for line in stderr.splitlines():
        obj = json.loads(line)  # every line is one JSON object
        assert TS.match(obj["ts"]), obj
        assert isinstance(obj["pid"], int) and (pid is None or obj["pid"] == pid), obj
        assert obj["level"] in ("error", "warning", "notice", "info"), obj
        assert re.fullmatch(r"[a-z][a-z_-]*", obj["event"]), obj
        assert isinstance(obj["message"], str) and not obj["message"].startswith("looplock: "), obj
        out.append(obj)
    return out


def one_event(args, **kw):
    r = run(["--log-format", "json", *args], **kw)
    lines = json_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    return r, lines[0]


@pytest.mark.parametrize("args,event", [
    (["--bogus", "DIR", "--", "true"], "usage_error"),
    (["-p", "bogus", "DIR", "--", "true"], "usage_error"),
    (["DIR"], "usage_error"),
    (["-w", "-1", "DIR", "--", "true"], "usage_error"),
])
def test_usage_errors_are_json_lines_too(loop_dir, args, event):
    r, obj = one_event([str(loop_dir) if a == "DIR" else a for a in args])
    assert r.returncode == 64
    assert (obj["level"], obj["event"]) == ("error", event)
    assert "hint" in obj


def test_each_failure_has_its_own_event(tmp_path, loop_dir):
    events = {}
    r, obj = one_event([tmp_path / "missing", "--", "true"])
    events["dir_missing"] = (r.returncode, obj)
    f = tmp_path / "file"
    f.write_text("")
    r, obj = one_event([f, "--", "true"])
    events["not_a_directory"] = (r.returncode, obj)
    (loop_dir / ".state.lock").symlink_to("/etc/passwd")
    r, obj = one_event([loop_dir, "--", "true"])
    events["unsafe_lock_file"] = (r.returncode, obj)
    os.unlink(loop_dir / ".state.lock")
    r, obj = one_event([loop_dir, "--", "/nonexistent/command"])
    events["command_not_found"] = (r.returncode, obj)
    r, obj = one_event([loop_dir, "--", "/etc/passwd"])
    events["command_not_executable"] = (r.returncode, obj)
    r, obj = one_event(["--etcd", "http://127.0.0.1:1", "-w", "0.2", loop_dir, "--", "true"])
    events["etcd_unreachable"] = (r.returncode, obj)
    expected = {"dir_missing": 66, "not_a_directory": 66, "unsafe_lock_file": 73, "command_not_found": 127,
                "command_not_executable": 126, "etcd_unreachable": 69}
    for event, (code, obj) in events.items():
        assert obj["event"] == event and code == expected[event], (event, code, obj)
    # Once DIR is open, lines carry its lock_id.
    assert "lock_id" not in events["dir_missing"][1]
    assert re.fullmatch(r"[0-9a-f]{16}", events["command_not_found"][1]["lock_id"])


def test_a_skip_and_a_timeout_name_their_holder_with_the_same_keys(loop_dir, holders):
    h = holders(loop_dir)
    _, skip = one_event(["-p", "single_flight", loop_dir, "--", "true"])
    _, timeout = one_event(["-w", "0.1", loop_dir, "--", "true"])
    assert (skip["event"], skip["level"]) == ("noop-locked", "notice")
    assert (timeout["event"], timeout["level"]) == ("lock_acquire_timeout", "error")
    for obj in (skip, timeout):
        assert obj["holder_pids"] == [h.pid]
        assert obj["holder"]["pid"] == h.pid and obj["holder"]["schema"] == "file_lock_holder_v0"
        assert obj["policy"] in ("single_flight", "mutation") and len(obj["lock_id"]) == 16
    assert timeout["waited_ms"] >= 100 and timeout["deadline_ms"] == 100


def test_verbose_lines_and_released_with_its_status(loop_dir):
    r = run(["--log-format", "json", "-v", loop_dir, "--", "sh", "-c", "exit 3"])
    assert r.returncode == 3
    lines = json_lines(r.stderr)
    assert [o["event"] for o in lines] == ["acquired", "released"]
    released = lines[-1]
    assert released["exit_status"] == 3 and isinstance(released["ran_ms"], int)
    assert all(o["lock_id"] == lines[0]["lock_id"] for o in lines)


def test_max_time_and_kill_after_events(loop_dir):
    r = run(["--log-format", "json", "--max-time", "0.2", "--kill-after", "0.2", loop_dir, "-c",
             "trap '' TERM; sleep 5"])
    assert r.returncode == 124
    events = [o["event"] for o in json_lines(r.stderr)]
    assert events == ["kill_after", "max_time_exceeded"], events


def test_a_leaked_lock_event(loop_dir):
    r = run(["--log-format", "json", "-q", loop_dir, "--", PY, helper("spawn_daemon.py"), "30"])
    daemon = int(r.stdout)
    try:
        (obj,) = json_lines(r.stderr)
        assert (obj["event"], obj["level"], obj["pids"]) == ("lock_leaked", "warning", [daemon])
    finally:
        os.kill(daemon, signal.SIGKILL)


# --- the text style ---------------------------------------------------------------------


@pytest.mark.parametrize("args,first", [
    (["--bogus", "DIR", "--", "true"], "looplock: unknown option '--bogus'"),
    (["--bogus=1", "DIR", "--", "true"], "looplock: unknown option '--bogus'"),
    (["-Z", "DIR", "--", "true"], "looplock: unknown option '-Z'"),
    (["--quiet=yes", "DIR", "--", "true"], "looplock: option '--quiet' takes no value"),
    (["DIR", "-p"], "looplock: option '-p' needs a value"),
    (["DIR"], "looplock: missing '--' before the command"),
    ([], "looplock: missing DIR"),
])
def test_messages_are_looplocks_own(loop_dir, args, first):
    r = run([str(loop_dir) if a == "DIR" else a for a in args])
    assert r.returncode == 64
    lines = r.stderr.splitlines()
    assert lines[0] == first, r.stderr
    for line in lines:
        assert line.startswith("looplock: ") and not line.startswith("looplock: looplock")
        assert "Usage:" not in line and "\u2018" not in line and "\u2019" not in line, line


@pytest.mark.parametrize("name", ["l space", "it's", "d$x"])
def test_a_hint_names_dir_so_that_it_pastes_into_a_shell(tmp_path, name):
    """The hint's command, pasted into sh, inspects DIR itself: quoted when
    DIR's name holds a space, an apostrophe or what sh would expand."""
    loop = tmp_path / name
    loop.mkdir()
    (loop / ".state.lock").touch()
    holder = subprocess.Popen(["flock", str(loop / ".state.lock"), "sh", "-c", "echo ready; read x"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = run(["-n", loop, "--", "true"])
        assert r.returncode == 75
        hint = re.search(r"Run '(.*)' to see the holder", r.stderr).group(1)
        pasted = subprocess.run(["sh", "-c", hint.replace("looplock ", f"'{LOOPLOCK}' ", 1)], capture_output=True,
                                text=True, timeout=30)
        assert pasted.returncode == 0, (hint, pasted.stderr)
        assert f"lock      {loop}/.state.lock" in pasted.stdout
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
