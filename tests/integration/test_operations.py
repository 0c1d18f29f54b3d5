"""Operations (looplock(1), OPTIONS; looplock-files(5), METRICS;
looplock-inspect(7)):
silent healthy skips with -q, --metrics-dir (node_exporter textfiles checked
with prometheus_client's parser, counters that lose nothing when many runs end
at once), --max-time, --inspect on several directories with the processes
waiting and --check, and the status line of a wait on a terminal.

Handshakes instead of sleeps: holders print "ready", waiters are seen blocked
in /proc/locks before the test goes on; every subprocess has a timeout.
"""
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import termios
import threading
import time

import pytest

from conftest import (EX_NOINPUT, EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, blocked_waiters, expect_line,
                      helper, incident_rows, lock_is_free, run, running, start, wait_until)

parser = pytest.importorskip("prometheus_client.parser", reason="python3-prometheus-client is not installed")

EX_MAX_TIME = 124
OUTCOMES = {"success", "failure", "signaled", "skipped", "timeout", "lease_lost", "max_time", "error"}
GAUGES = {"looplock_last_start_timestamp_seconds", "looplock_last_success_timestamp_seconds",
          "looplock_last_exit_status", "looplock_last_duration_seconds", "looplock_last_wait_seconds"}


# --- quiet skips -------------------------------------------------------------------


def test_a_quiet_single_flight_skip_prints_nothing(loop_dir, holders):
    holders(loop_dir, tool="flock")
    marker = loop_dir / "ran"
    for _ in range(3):  # as cron would, every minute
        r = run(["-q", "-p", "single_flight", loop_dir, "--", "touch", marker])
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert not marker.exists()
    # Without -q the line stays; --log-format json without -q still tells it.
    r = run(["-p", "single_flight", loop_dir, "--", "true"])
    assert "noop-locked" in r.stderr
    r = run(["--log-format", "json", "-p", "single_flight", loop_dir, "--", "true"])
    assert json.loads(r.stderr)["event"] == "noop-locked"


def test_quiet_still_prints_a_timeout(loop_dir, holders):
    holders(loop_dir, tool="flock")
    r = run(["-q", "-w", "0.1", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    assert "lock_acquire_timeout" in r.stderr


# --- --metrics-dir -------------------------------------------------------------------


def families(text):
    """{name: [samples]} through the real parser of the textfile format."""
    out = {}
    for fam in parser.text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def prom_file(metrics):
    files = list(metrics.glob("looplock_*.prom"))
    assert len(files) == 1, files
    return files[0]


def runs_by(text):
    """{(operation, outcome): count}"""
    return {(s.labels["operation"], s.labels["outcome"]): s.value for s in families(text)["looplock_runs_total"]}


def test_metrics_file_after_one_run(loop_dir, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    before = time.time()
    r = run(["--metrics-dir", metrics, loop_dir, "--", "sh", "-c", "sleep 0.2"])
    assert r.returncode == 0, r.stderr
    f = prom_file(metrics)
    record = json.loads((loop_dir / ".state.lock").read_text())
    assert f.name == f"looplock_{record['lock_id']}.prom"
    text = f.read_text()
    assert "# HELP looplock_runs_total" in text and "# TYPE looplock_runs_total counter" in text
    fam = families(text)
    assert set(fam) >= {"looplock_runs_total"} | GAUGES
    runs = fam["looplock_runs_total"]
    assert {s.labels["outcome"] for s in runs} == OUTCOMES
    for s in runs:
        assert s.labels["lock_id"] == record["lock_id"] and s.labels["loop"] == "loop"
        assert s.labels["operation"] == "sh"
        assert s.value == (1 if s.labels["outcome"] == "success" else 0)
    gauge = {name: fam[name][0].value for name in GAUGES}
    assert before - 1 <= gauge["looplock_last_start_timestamp_seconds"] <= time.time()
    assert gauge["looplock_last_success_timestamp_seconds"] >= gauge["looplock_last_start_timestamp_seconds"]
    assert gauge["looplock_last_exit_status"] == 0
    assert 0.15 <= gauge["looplock_last_duration_seconds"] < 10
    assert 0 <= gauge["looplock_last_wait_seconds"] < 5
    # Nothing but the file is left in the directory for the collector to read.
    assert [p.name for p in metrics.iterdir() if p.suffix == ".prom"] == [f.name]
    assert not [p for p in metrics.iterdir() if p.name.endswith(".tmp")]


def test_metrics_count_every_outcome_and_carry_over(loop_dir, tmp_path, holders):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    m = ["--metrics-dir", metrics]
    assert run([*m, loop_dir, "--", "true"]).returncode == 0
    assert run([*m, loop_dir, "--", "sh", "-c", "exit 3"]).returncode == 3
    assert run([*m, loop_dir, "--", "sh", "-c", "kill -TERM $$"]).returncode == -15
    assert run([*m, "--max-time", "0.1", loop_dir, "--", "sleep", "5"]).returncode == EX_MAX_TIME
    assert run([*m, loop_dir, "--", "/nonexistent/command"]).returncode == 127
    h = holders(loop_dir, tool="flock")
    assert run([*m, "-w", "0.1", loop_dir, "--", "true"]).returncode == EX_TEMPFAIL
    assert run([*m, "-p", "single_flight", loop_dir, "--", "true"]).returncode == 0
    h.release()
    text = prom_file(metrics).read_text()
    got = {k: v for k, v in runs_by(text).items() if v}
    assert got == {("true", "success"): 1, ("sh", "failure"): 1, ("sh", "signaled"): 1, ("sleep", "max_time"): 1,
                   ("command", "error"): 1, ("true", "timeout"): 1, ("true", "skipped"): 1}, got
    status = {s.labels["operation"]: s.value for s in families(text)["looplock_last_exit_status"]}
    assert status["sh"] == 128 + 15 and status["true"] == 0 and status["sleep"] == EX_MAX_TIME


def test_the_environment_names_the_metrics_dir(loop_dir, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    r = run([loop_dir, "--", "true"], env={"LOOPLOCK_METRICS_DIR": str(metrics)})
    assert r.returncode == 0, r.stderr
    prom_file(metrics)


def test_names_that_are_not_utf8_or_too_long_keep_one_series_each_and_every_count(loop_dir, tmp_path):
    """The label of an operation is valid UTF-8 of at most 256 bytes: names
    that only differ beyond that share its series; a run never writes a
    second series of the same labels, and none of their counts is lost."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    bad = os.fsdecode(b"tick\xff")
    for op in [bad] * 4 + ["o" * 300 + "1", "o" * 300 + "2", "other"]:
        r = run(["--metrics-dir", metrics, "--operation", op, loop_dir, "--", "true"])
        assert (r.returncode, r.stderr) == (0, ""), r
    text = prom_file(metrics).read_text(errors="surrogateescape")
    runs = [s for s in families(text)["looplock_runs_total"] if s.labels["outcome"] == "success"]
    assert sorted((s.labels["operation"], s.value) for s in runs) == sorted(
        [("tick\ufffd", 4), ("o" * 256, 2), ("other", 1)]), runs
    lines = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(lines) == len(set(lines)), "a series written twice"


def test_an_unwritable_metrics_dir_is_one_warning_never_another_status(loop_dir, tmp_path):
    missing = tmp_path / "missing"
    r = run(["--metrics-dir", missing, loop_dir, "--", "sh", "-c", "exit 5"])
    assert r.returncode == 5
    (line,) = r.stderr.splitlines()
    assert line.startswith("looplock: cannot update the metrics: cannot open the metrics directory"), line
    assert lock_is_free(loop_dir)
    # -q hides it, like any warning.
    r = run(["-q", "--metrics-dir", missing, loop_dir, "--", "true"])
    assert (r.returncode, r.stderr) == (0, "")


def test_hostile_operation_names_stay_valid_label_values(loop_dir, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    name = b'a"b\\c\nd\xff' + b"x" * 400
    r = subprocess.run([LOOPLOCK, "--metrics-dir", str(metrics), "--operation", name, str(loop_dir), "--",
                        "true"], capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    (s,) = [s for s in families(prom_file(metrics).read_text())["looplock_runs_total"] if s.value]
    assert s.labels["operation"].startswith('a"b\\c\nd\ufffd') and len(s.labels["operation"].encode()) <= 260


def test_many_runs_ending_at_once_lose_no_increment(loop_dir, tmp_path, holders):
    """A holder, 16 single_flight skippers and 4 timed-out waiters all end at
    about the same time; meanwhile a reader parses every version of the file
    it sees (renamed into place whole, never half-written)."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    m = ["--metrics-dir", str(metrics)]
    holder = start([*m, "-p", "blocking", loop_dir, "--", PY, helper("wait_stdin.py")])
    expect_line(holder, "ready")
    seen, bad, stop = [0], [], threading.Event()

    def reader():
        while not stop.is_set():
            for f in metrics.glob("looplock_*.prom"):
                try:
                    text = f.read_text()
                except FileNotFoundError:
                    continue
                try:
                    families(text)
                    seen[0] += 1
                except Exception as e:  # noqa: BLE001 - any parse failure is the finding
                    bad.append((e, text))

    t = threading.Thread(target=reader)
    t.start()
    try:
        procs = [subprocess.Popen([LOOPLOCK, *m, "-p", "single_flight", str(loop_dir), "--", "true"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(16)]
        procs += [subprocess.Popen([LOOPLOCK, *m, "-w", "0.5", str(loop_dir), "--", "true"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(4)]
        codes = [p.wait(timeout=TIMEOUT) for p in procs]
        holder.stdin.close()
        assert holder.wait(timeout=TIMEOUT) == 0
    finally:
        stop.set()
        t.join(timeout=TIMEOUT)
    assert codes == [0] * 16 + [EX_TEMPFAIL] * 4
    assert not bad, bad[:1]
    assert seen[0] > 0
    got = {k: v for k, v in runs_by(prom_file(metrics).read_text()).items() if v}
    assert got == {("true", "skipped"): 16, ("true", "timeout"): 4, ("wait_stdin.py", "success"): 1}, got


# --- --max-time ------------------------------------------------------------------------


def test_max_time_ends_a_term_ignoring_job_and_exits_124(loop_dir, tmp_path, procs):
    pid_file = tmp_path / "pid"
    job = f"trap '' TERM; sh -c 'trap \"\" TERM; echo $$ > {pid_file}; exec sleep 30' & wait"
    t0 = time.monotonic()
    p = procs.start(["--max-time", "0.5", "--kill-after", "0.5", loop_dir, "-c", job])
    assert p.wait(timeout=TIMEOUT) == EX_MAX_TIME
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 10, elapsed
    grandchild = int(pid_file.read_text())
    assert not running(grandchild), "the lock was released before the whole job had ended"
    assert lock_is_free(loop_dir)
    err = p.stderr.read()
    assert "max_time_exceeded" in err and "KILL was needed" in err, err
    (row,) = incident_rows(loop_dir)
    assert row["error_code"] == "max_time_exceeded"
    assert row["deadline_ms"] == 500 and row["killed"] is True
    assert 900 <= row["ran_ms"] < 10_000 and row["waited_ms"] == row["ran_ms"]
    assert row["holder"]["pid"] == p.pid and row["holder"]["operation"] == "sh"
    assert json.loads((loop_dir / ".state.lock").read_text())["released_at"] is not None


def test_max_time_with_a_job_that_obeys_term(loop_dir):
    r = run(["--max-time", "0.3", loop_dir, "--", "sleep", "20"])
    assert r.returncode == EX_MAX_TIME, r.stderr
    (row,) = incident_rows(loop_dir)
    assert row["killed"] is False and "TERM sufficed" in r.stderr


def test_max_time_terms_a_job_that_ignored_a_forwarded_int(loop_dir, procs):
    """An INT forwarded earlier (and ignored) does not stand in for
    --max-time's own TERM: the job still gets it, long before the KILL that
    --kill-after 30 would send."""
    job = "trap 'echo int' INT; trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"
    p = procs.start(["--max-time", "1.5", "--kill-after", "30", loop_dir, "-c", job])
    expect_line(p, "ready")
    os.kill(p.pid, signal.SIGINT)
    expect_line(p, "int")
    assert p.wait(timeout=TIMEOUT) == EX_MAX_TIME
    assert p.stdout.read().split() == ["term"]
    (row,) = incident_rows(loop_dir)
    assert row["error_code"] == "max_time_exceeded" and row["killed"] is False
    assert 0 <= row["ran_after_term_ms"] < 10_000
    # --inspect says the job ran that long (it said "waited").
    text = run(["--inspect", loop_dir]).stdout
    assert re.search(r"max_time_exceeded: pid \d+ \(sh\) ran \d", text), text
    assert "waited" not in text


def test_durations_of_centuries_are_deadlines_that_never_come(loop_dir, procs):
    """Just below "inf": the deadline saturates instead of overflowing into
    the past (which would TERM, or KILL, at once)."""
    centuries = "9223372036"  # seconds, about 292 years
    r = run(["--max-time", centuries, loop_dir, "--", "sleep", "0.3"])
    assert r.returncode == 0, r.stderr
    job = "trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.05; done"
    p = procs.start(["--kill-after", centuries, loop_dir, "-c", job])
    expect_line(p, "ready")
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=TIMEOUT) == 3, p.stderr.read()
    assert p.stdout.read().split() == ["term"]


def test_a_command_within_max_time_is_untouched(loop_dir):
    r = run(["--max-time", "20", loop_dir, "--", "sh", "-c", "exit 3"])
    assert r.returncode == 3
    assert incident_rows(loop_dir) == []


# --- --inspect on several directories, waiters, --check ------------------------------


def test_inspect_shows_a_waiters_long_names_as_its_records_will_hold_them(tmp_path, holders, procs):
    """A waiter's --agent and --operation are shown as it will record them:
    cut to 256 bytes, not whole."""
    d = tmp_path / "held"
    d.mkdir()
    holders(d)
    waiter = procs.start(["--agent", "a" * 3000, "--operation", "o" * 3000, "-w", "30", d, "--", "true"])
    wait_until(lambda: waiter.pid in blocked_waiters(d / ".state.lock"), "the waiter to block")
    (w,) = json.loads(run(["--inspect", "--json", d]).stdout)["waiters"]
    assert len(w["operation"].encode()) <= 256 and w["operation"].startswith("o" * 200), len(w["operation"])
    assert len(w["agent_id"].encode()) <= 256 and w["agent_id"].startswith("a" * 200), len(w["agent_id"])


def test_inspect_three_dirs_with_waiters_and_check(tmp_path, holders, procs):
    dirs = [tmp_path / n for n in ("free", "held", "stale")]
    for d in dirs:
        d.mkdir()
    held, stale = dirs[1], dirs[2]
    holders(held)
    waiter = procs.start(["--agent", "ci", "-w", "30", held, "--", PY, "/x/deploy.py", "--secret-token"])
    wait_until(lambda: waiter.pid in blocked_waiters(held / ".state.lock"), "the waiter to block")
    # A record left by a holder that is gone: a warning.
    rec = {"schema": "file_lock_holder_v0", "lock_id": "0" * 16, "pid": 4_194_300, "pid_start": "1",
           "agent_id": "a", "operation": "o", "policy": "mutation", "acquired_at": "2026-11-30T17:00:00.000Z",
           "released_at": None}
    (stale / ".state.lock").write_text(json.dumps(rec) + "\n")

    r = run(["--inspect", "--json", *dirs])
    assert r.returncode == 0, r.stderr
    reports = json.loads(r.stdout)
    assert [rep["lock_file"] for rep in reports] == [str(d / ".state.lock") for d in dirs]
    free, busy, old = reports
    assert free["kernel"]["held"] is False and free["waiters"] == [] and free["warnings"] == []
    assert busy["kernel"]["held"] is True
    (w,) = busy["waiters"]
    assert w["pid"] == waiter.pid and w["command"] == "looplock" and w["mode"] == "exclusive"
    assert (w["agent_id"], w["operation"]) == ("ci", "deploy.py")
    assert isinstance(w["waiting_at_most_ms"], int) and 0 <= w["waiting_at_most_ms"] < 60_000
    assert "--secret-token" not in r.stdout
    assert old["warnings"], old

    t = run(["--inspect", *dirs])
    assert t.returncode == 0
    assert t.stdout.count("lock      ") == 3 and "\n\nlock      " in t.stdout
    assert f"waiting   pid {waiter.pid} (looplock: agent ci, operation deploy.py), exclusive, has waited at most" in t.stdout

    # --check: 1 because one report warns; 0 for the others alone.
    assert run(["--inspect", "--check", *dirs]).returncode == 1
    assert run(["--inspect", "--check", free_dir := dirs[0], held]).returncode == 0, free_dir
    # One object for one DIR, an array for several.
    assert isinstance(json.loads(run(["--inspect", "--json", dirs[0]]).stdout), dict)


def test_inspect_a_missing_dir_among_others(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    r = run(["--inspect", "--json", good, tmp_path / "missing"])
    assert r.returncode == EX_NOINPUT
    entries = json.loads(r.stdout)
    assert len(entries) == 2 and "error" not in entries[0]
    assert entries[1]["error"]["status"] == EX_NOINPUT
    assert "does not exist" in r.stderr


def test_check_counts_an_unknown_kernel_view_as_a_warning(loop_dir, holders):
    holders(loop_dir, tool="flock")
    r = subprocess.run(["prlimit", "--nofile=5", LOOPLOCK, "--inspect", "--check", str(loop_dir)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 1, r.stdout


# --- waiting on a terminal ----------------------------------------------------------------


def read_pty(master, until, timeout=TIMEOUT):
    """Reads the pty master until `until` (bytes) appears; returns all read."""
    data, end = b"", time.monotonic() + timeout
    while until not in data:
        left = end - time.monotonic()
        if left <= 0 or not select.select([master], [], [], left)[0]:
            raise AssertionError(f"{until!r} not seen; got {data!r}")
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def wide_pty():
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 300, 0, 0))
    return master, slave


def test_a_wait_on_a_terminal_shows_one_status_line(loop_dir, holders):
    h = holders(loop_dir)
    master, slave = wide_pty()
    try:
        p = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "echo", "ran"], stdin=slave,
                             stdout=slave, stderr=slave)
    finally:
        os.close(slave)
    try:
        first = read_pty(master, b"\x1b[K")
        assert re.match(rb"\rlooplock: waiting 1\.\ds \(no deadline\) for ", first), first
        assert f"for pid {h.pid} (agent ".encode() in first
        assert f"on {loop_dir}/.state.lock".encode() in first
        second = read_pty(master, b"\x1b[K")  # rewritten in place, not a new line
        assert re.match(rb"\rlooplock: waiting [12]\.\ds", second), second
        assert b"\n" not in first + second
        h.release()
        rest = read_pty(master, b"ran")
        assert b"\r\x1b[K" in rest  # erased before the command's output
        assert p.wait(timeout=TIMEOUT) == 0
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


def test_at_80_columns_the_path_is_cut_never_the_holder(tmp_path, holders):
    """The line was cut before the holder's pid, which is the point of it."""
    d = tmp_path / "srv" / "loops" / "nightly-build-with-a-long-name"
    d.mkdir(parents=True)
    h = holders(d, tool="flock")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        p = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(d), "--", "true"], stdin=slave, stdout=slave,
                             stderr=slave)
    finally:
        os.close(slave)
    try:
        line = read_pty(master, b"\x1b[K").split(b"\r")[-1].replace(b"\x1b[K", b"")
        assert len(line) <= 79, line
        assert f"for pid {h.pid} (flock): no looplock record".encode() in line, line
        # The path is cut from its start, or left out: here it does not fit at all.
        assert b"/srv/loops" not in line, line
        h.release()
        assert p.wait(timeout=TIMEOUT) == 0
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


def test_a_bounded_wait_says_how_long_is_left(loop_dir, holders):
    holders(loop_dir)
    master, slave = wide_pty()
    try:
        p = subprocess.Popen([LOOPLOCK, "-w", "3", str(loop_dir), "--", "true"], stdin=slave, stdout=slave,
                             stderr=slave)
    finally:
        os.close(slave)
    try:
        line = read_pty(master, b"left")
        assert re.search(rb"waiting 1\.\ds \([12]\.\ds left\) for ", line), line
        assert p.wait(timeout=TIMEOUT) == EX_TEMPFAIL
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)


@pytest.mark.parametrize("how", ["not-a-terminal", "quiet"])
def test_no_status_line_without_a_terminal_or_with_quiet(loop_dir, holders, how):
    h = holders(loop_dir)
    if how == "quiet":
        master, slave = os.openpty()
        p = subprocess.Popen([LOOPLOCK, "-q", "-p", "blocking", str(loop_dir), "--", "true"], stdin=slave,
                             stdout=slave, stderr=slave)
        os.close(slave)
    else:
        p = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "true"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    wait_until(lambda: p.pid in blocked_waiters(loop_dir / ".state.lock"), "the waiter to block")
    time.sleep(1.6)  # past the moment a status line would be drawn
    h.release()
    assert p.wait(timeout=TIMEOUT) == 0
    if how == "quiet":
        os.set_blocking(master, False)
        try:
            out = os.read(master, 65536)
        except OSError:
            out = b""
        os.close(master)
    else:
        out = p.stderr.read()
    assert out == b"", out
