"""--notify (looplock-events(7), NOTIFY): each event of the run delivered once and
in order to the operator's command, its JSON on stdin and LOOPLOCK_EVENT
set, by a relay that never delays a release or a hand-off; notifiers that
hang, fail or are missing; held_too_long; the notifier never holds the
lock. Real processes; the notifiers write a history, checked afterwards."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, EX_USAGE, LOOPLOCK, PY, TIMEOUT, expect_line, helper, run, start, wait_until)
from etcdtest import etcd, needs_etcd

RECORD = 'printf "%s %s\\n" "$LOOPLOCK_EVENT" "$(cat)" >> '


def history(path):
    p = Path(path)
    if not p.exists():
        return []
    return [(line.split(" ", 1)[0], json.loads(line.split(" ", 1)[1])) for line in p.read_text().splitlines()]


def events(path):
    return [name for name, _ in history(path)]


def test_each_event_is_delivered_once_in_order_with_its_json_and_name(loop_dir, tmp_path):
    log = tmp_path / "events"
    r = run(["--notify", RECORD + str(log), "--notify-on", "started,ended", "--operation", "tick", loop_dir, "--",
             "sh", "-c", "exit 3"])
    assert r.returncode == 3 and r.stderr == ""
    got = history(log)
    assert [name for name, _ in got] == ["started", "ended"]
    started, ended = got[0][1], got[1][1]
    assert started["event"] == "started" and started["operation"] == "tick" and started["pid"] == ended["pid"]
    assert ended["exit_status"] == 3 and ended["outcome"] == "failure" and "lock_id" in ended


def test_by_default_only_warnings_errors_and_held_too_long_are_notified(loop_dir, tmp_path, holders):
    log = tmp_path / "events"
    assert run(["--notify", RECORD + str(log), loop_dir, "--", "true"]).returncode == 0
    assert events(log) == []  # a healthy run says nothing
    h = holders(loop_dir, "flock")
    r = run(["-q", "--notify", RECORD + str(log), "-w", "0.2", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    [(name, line)] = history(log)
    assert name == "lock_acquire_timeout" and line["level"] == "error" and line["holder_pids"] == [h.pid]


def test_a_skip_is_notified_as_its_line_and_as_skipped(loop_dir, tmp_path, holders):
    log = tmp_path / "events"
    holders(loop_dir, "flock")
    r = run(["--notify", RECORD + str(log), "--notify-on", "noop-locked,skipped", "-p", "single_flight", loop_dir, "--",
             "true"])
    assert r.returncode == 0
    assert events(log) == ["noop-locked", "skipped"]


def test_a_hanging_notifier_is_killed_with_its_group_and_the_next_event_still_comes(loop_dir, tmp_path):
    log = tmp_path / "events"
    pids = tmp_path / "pids"
    notifier = (f'if [ "$LOOPLOCK_EVENT" = started ]; then sleep 60 & echo $! >> {pids}; wait; fi; '
                + RECORD + str(log))
    t0 = time.monotonic()
    r = run(["--notify", notifier, "--notify-on", "started,ended", "--notify-timeout", "0.5", loop_dir, "--", "true"])
    took = time.monotonic() - t0
    assert r.returncode == 0
    assert "--notify's command for started did not end within --notify-timeout 500ms" in r.stderr
    assert events(log) == ["ended"]  # started's notifier was KILLed before it wrote
    assert took < 30  # it did not wait for the sleep
    [sleeper] = [int(p) for p in pids.read_text().split()]
    wait_until(lambda: not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text()
               .rsplit(")", 1)[1].split()[0], "the notifier's group to be KILLed")


@pytest.mark.parametrize("command,why", [("echo first; echo said it >&2; exit 3", "exited with 3 (its last line: said it)"),
                                         ("no-such-notifier-anywhere", "exited with 127 (its last line: ")])
def test_a_failing_or_missing_notifier_is_a_warning_and_never_the_exit_status(loop_dir, command, why):
    r = run(["--notify", command, "--notify-on", "ended", loop_dir, "--", "sh", "-c", "exit 4"])
    assert r.returncode == 4
    assert f"--notify's command for ended {why}" in r.stderr
    assert "; looplock's exit status is the run's" in r.stderr


def test_a_failing_notifiers_json_warning_names_looplocks_pid_and_lock(loop_dir):
    p = start(["--log-format", "json", "--notify", "exit 5", "--notify-on", "started", loop_dir, "--", "true"],
              stdin=subprocess.DEVNULL)
    _, err = p.communicate(timeout=TIMEOUT)
    [line] = [json.loads(x) for x in err.splitlines() if '"notify_failed"' in x]
    assert line["pid"] == p.pid and line["lock_id"] and line["notified_event"] == "started"


def test_what_a_notifier_prints_never_reaches_looplocks_stdout_or_stderr(loop_dir):
    r = run(["--log-format", "json", "--notify", "echo PING-OK; echo noise >&2", "--notify-on", "started,ended",
             loop_dir, "--", "echo", '{"a":1}'])
    assert r.returncode == 0
    assert r.stdout == '{"a":1}\n'
    assert r.stderr == ""


def test_notify_timeout_inf_never_kills_a_notifier(loop_dir, tmp_path):
    log = tmp_path / "events"
    r = run(["--notify", "sleep 1; " + RECORD + str(log), "--notify-on", "started", "--notify-timeout", "inf",
             loop_dir, "--", "true"])
    assert r.returncode == 0 and r.stderr == ""
    assert events(log) == ["started"]


def test_a_command_that_cannot_run_still_ends_the_run_for_the_notifier(loop_dir, tmp_path):
    log = tmp_path / "events"
    r = run(["-q", "--notify", RECORD + str(log), "--notify-on", "started,command_not_found,ended", loop_dir, "--",
             "/nonexistent/command"])
    assert r.returncode == 127
    got = history(log)
    assert [name for name, _ in got] == ["started", "command_not_found", "ended"]
    assert got[-1][1]["exit_status"] == 127 and got[-1][1]["outcome"] == "error"


def test_a_signal_while_looplock_waits_for_its_last_notifier_ends_the_wait(loop_dir, tmp_path):
    log = tmp_path / "events"
    p = start(["--notify", "sleep 20; " + RECORD + str(log), "--notify-on", "ended", "--notify-timeout", "25",
               loop_dir, "--", PY, helper("wait_stdin.py")], start_new_session=True)
    expect_line(p)
    p.stdin.close()  # the job ends; looplock waits for the notifier of ended
    wait_until(lambda: any(Path(f"/proc/{c}/cmdline").exists() for c in _children(p.pid)), "the relay")
    time.sleep(0.3)
    t0 = time.monotonic()
    os.killpg(p.pid, signal.SIGTERM)
    p.wait(timeout=TIMEOUT)
    assert time.monotonic() - t0 < 15  # not the notifier's 20 s


def _children(pid):
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_slow_notifier_never_delays_the_release(loop_dir, tmp_path):
    """The notifier of 'ended' waits for a file that only the next holder's
    command creates: had looplock waited for it before releasing, the next
    holder could never run."""
    go = tmp_path / "go"
    notifier = f'while [ ! -e {go} ]; do sleep 0.02; done'
    first = start(["--notify", notifier, "--notify-on", "started", "--notify-timeout", "25", loop_dir, "--", "true"],
                  stdin=subprocess.DEVNULL)
    second = run(["-p", "blocking", loop_dir, "--", "touch", str(go)], timeout=20)
    assert second.returncode == 0
    assert first.wait(timeout=TIMEOUT) == 0
    assert "notify_failed" not in first.stderr.read()


def test_held_too_long_is_said_once_while_the_job_goes_on(loop_dir, tmp_path):
    log = tmp_path / "events"
    r = run(["--notify", RECORD + str(log), "--notify-after", "0.3", "--operation", "tick", loop_dir, "--", "sleep",
             "1.5"])
    assert r.returncode == 0
    assert r.stderr.count("held_too_long: tick has held the lock for ") == 1
    [(name, line)] = history(log)
    assert name == "held_too_long" and line["level"] == "warning" and line["held_ms"] >= 300
    # A job that ends first says nothing.
    log.unlink()
    r = run(["--notify", RECORD + str(log), "--notify-after", "5", loop_dir, "--", "true"])
    assert r.returncode == 0 and "held_too_long" not in r.stderr and events(log) == []


def test_the_notifier_never_holds_the_lock_nor_passes_for_nested(loop_dir, tmp_path):
    out = tmp_path / "out"
    notifier = (f'env | grep -c -E "^LOOPLOCK_(FD|HOLDER_PID|HOLDER_FD|ETCD_PASSWORD)=" >> {out}; '
                f'"{LOOPLOCK}" -n {loop_dir} -- true; echo "inner $?" >> {out}')
    r = run(["--notify", notifier, "--notify-on", "started", loop_dir, "--", PY, "-c",
             "import time; time.sleep(0.5)"], env={"LOOPLOCK_ETCD_PASSWORD": "sekret"})
    assert r.returncode == 0
    assert out.read_text().split("\n")[:2] == ["0", f"inner {EX_TEMPFAIL}"]


def test_looplock_killed_the_relay_delivers_what_it_has_and_ends(loop_dir, tmp_path):
    log = tmp_path / "events"
    p = start(["--notify", RECORD + str(log), "--notify-on", "started", loop_dir, "--", PY, helper("wait_stdin.py")])
    expect_line(p)
    wait_until(lambda: events(log) == ["started"], "started to be delivered")
    relays = [int(x) for x in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=TIMEOUT)
    for pid in relays:
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or
                   Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", "the relay to end")


BIG = "op-" + "x" * 70_000  # an event that does not fit in a pipe (64 KiB)


@pytest.mark.parametrize("notifier", ["sleep 30", "head -c 2000000 /dev/zero; sleep 30"],
                         ids=["reads_nothing", "prints_a_lot_and_reads_nothing"])
def test_notify_timeout_bounds_a_delivery_whatever_the_events_size(loop_dir, notifier):
    """The relay writes the event as the notifier reads it, and reads what it
    prints meanwhile: a 70 kB event to a notifier that never reads its
    stdin (and fills its stdout) is KILLed at --notify-timeout, never
    blocks the relay or looplock."""
    t0 = time.monotonic()
    r = run(["--notify", notifier, "--notify-on", "started", "--notify-timeout", "1", "--operation", BIG, loop_dir,
             "--", "true"])
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert "--notify's command for started did not end within --notify-timeout 1.0s" in r.stderr, r.stderr[-500:]
    assert took < 20, took  # the notifier's 30 s never waited for


def test_a_notifier_that_prints_a_lot_and_reads_its_large_event_is_delivered_whole(loop_dir, tmp_path):
    got = tmp_path / "got"
    r = run(["--notify", f"head -c 3000000 /dev/zero; cat > {got}", "--notify-on", "started", "--notify-timeout",
             "60", "--operation", BIG, loop_dir, "--", "true"])
    assert r.returncode == 0 and r.stderr == "", r.stderr[-500:]
    event = json.loads(got.read_text())
    assert event["event"] == "started"


def test_names_in_lines_and_events_are_clipped_as_records_clip_them(loop_dir, tmp_path, holders):
    log = tmp_path / "events"
    holders(loop_dir, "flock")
    r = run(["--notify", RECORD + str(log), "--notify-on", "noop-locked,skipped", "-p", "single_flight",
             "--operation", "y" * 100_000, loop_dir, "--", "true"])
    assert r.returncode == 0
    [line] = r.stderr.splitlines()
    assert "noop-locked" in line and len(line) < 2000, len(line)
    got = history(log)
    assert [name for name, _ in got] == ["noop-locked", "skipped"]
    assert got[1][1]["operation"] == "y" * 256


@pytest.mark.parametrize("exit_code", [None, "3"])
def test_a_wait_that_gives_up_ends_with_ended_its_exit_status_and_time_waited(loop_dir, tmp_path, holders,
                                                                              exit_code):
    log = tmp_path / "events"
    h = holders(loop_dir, "flock")
    extra = ["-E", exit_code] if exit_code else []
    r = run(["-q", "--notify", RECORD + str(log), "--notify-on", "lock_acquire_timeout,ended", "-w", "0.3", *extra,
             "--operation", "tick", loop_dir, "--", "true"])
    status = int(exit_code) if exit_code else EX_TEMPFAIL
    assert r.returncode == status
    got = history(log)
    assert [name for name, _ in got] == ["lock_acquire_timeout", "ended"]
    assert got[0][1]["exit_status"] == status and got[0][1]["holder_pids"] == [h.pid]
    ended = got[1][1]
    assert ended["outcome"] == "timeout" and ended["exit_status"] == status and ended["ran_ms"] == 0
    assert ended["waited_ms"] >= 300 and ended["operation"] == "tick"


def test_a_coalescing_waiter_that_gives_up_ends_with_what_it_absorbed(loop_dir, tmp_path, holders):
    log = tmp_path / "events"
    holders(loop_dir, "flock")
    waiter = start(["--notify", RECORD + str(log), "--notify-on", "ended", "-w", "3", "-p", "coalesce",
                    "--operation", "tick", "-v", loop_dir, "--", "true"], stdin=subprocess.DEVNULL)
    wait_until(lambda: "waiting for" in (waiter.stderr.readline() or ""), "the waiter to wait")
    r = run(["-p", "coalesce", "--operation", "tick", loop_dir, "--", "true"])
    assert "noop-coalesced" in r.stderr, r.stderr
    assert waiter.wait(timeout=TIMEOUT) == EX_TEMPFAIL
    [(name, ended)] = history(log)
    assert ended["outcome"] == "timeout" and ended["coalesced"] == 1, ended


def test_a_notifier_killed_by_a_signal_is_said_so(loop_dir):
    r = run(["--notify", "kill -9 $$", "--notify-on", "ended", loop_dir, "--", "true"])
    assert r.returncode == 0
    assert "--notify's command for ended was killed by signal 9 (KILL)" in r.stderr, r.stderr


@pytest.mark.parametrize("args,word", [(["-F", "--notify", "true"], "cannot be combined"),
                                       (["--notify", "true", "--notify-on", "lock_acquire_timout"], "no such event"),
                                       (["--notify", "true", "--notify-on", "notify_failed"], "never notifies"),
                                       (["--notify-on", "ended"], "--notify-on needs --notify COMMAND"),
                                       (["--notify", "true", "--notify-timeout", "0"], "invalid --notify-timeout '0': "),
                                       (["--notify", "true", "--notify-after", "0s"], "invalid --notify-after '0s': "),
                                       (["--notify", "true", "--notify-on", ""], "invalid --notify-on '': "),
                                       (["--notify", "true", "--notify-on", "ended,"], "invalid --notify-on 'ended,': "),
                                       (["--notify", "true", "--notify-on", "a,,b"], "invalid --notify-on")])
def test_usage_errors_never_notify(loop_dir, tmp_path, args, word):
    r = run([*args, loop_dir, "--", "true"])
    assert r.returncode == EX_USAGE and word in r.stderr


@pytest.mark.parametrize("_", [None], ids=["etcd"])
def test_with_etcd_events_come_from_looplock_etcd_too(request, loop_dir, tmp_path, _):
    for mark in needs_etcd:
        if mark.args and mark.args[0]:
            pytest.skip(mark.kwargs.get("reason", "etcd"))
    member = request.getfixturevalue("etcd")
    log = tmp_path / "events"
    r = run(["--etcd", member.url, "--lock-name", f"notify{os.getpid()}", "--notify", RECORD + str(log),
             "--notify-on", "started,ended", loop_dir, "--", "true"])
    assert r.returncode == 0, r.stderr
    got = history(log)
    assert [name for name, _ in got] == ["started", "ended"]
