"""The recipes in examples/ do what they say, run against the built looplock.

Their placeholders are replaced for the test: /usr/bin/looplock (where the
Debian package installs it; /usr/local/bin/looplock or a bare `looplock` too)
by $LOOPLOCK, /srv/loops/nightly by a temporary loop dir, and the loop's
status.py by helpers/fake_status.py, which logs each call with whether the
loop's lock was held while it ran. scripts/deb verifies the systemd units as
shipped, against the installed package.
"""
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (LOOPLOCK, PY, ROOT, TIMEOUT, expect_line, fds_on, lock_is_free, read_record, running,
                      wait_until)
from conftest import blocked_waiters as waiting_pids

EXAMPLES = ROOT / "examples"
FAKE_STATUS = ROOT / "tests" / "integration" / "helpers" / "fake_status.py"
LOOP_PLACEHOLDER = "/srv/loops/nightly"
PACKAGE_LOOPLOCK = "/usr/bin/looplock"  # the Debian package's path, used by the examples


@pytest.fixture
def site(tmp_path):
    """A loop dir, a log for fake_status.py, a bin dir whose `looplock` is
    the built one, and a work dir with scripts/status.py (the fake)."""

    class Site:
        loop = tmp_path / "nightly"
        log = tmp_path / "status.log"
        bin = tmp_path / "bin"
        work = tmp_path / "work"

        def env(self, **extra):
            env = {
                "PATH": f"{self.bin}:/usr/bin:/bin",
                "HOME": str(tmp_path),
                "FAKE_STATUS_LOOP": str(self.loop),
                "FAKE_STATUS_LOG": str(self.log),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
            env.update(extra)
            return env

        def substitute(self, text):
            text = text.replace("/usr/local/bin/looplock", LOOPLOCK).replace(PACKAGE_LOOPLOCK, LOOPLOCK)
            text = text.replace("/srv/loops/scripts/status.py", str(FAKE_STATUS))
            return text.replace(LOOP_PLACEHOLDER, str(self.loop))

        def calls(self):
            if not self.log.exists():
                return []
            return [json.loads(line) for line in self.log.read_text().splitlines()]

        def iterations(self):
            p = self.loop / ".state.loop"
            return json.loads(p.read_text())["iteration_count"] if p.exists() else 0

    s = Site()
    s.loop.mkdir()
    s.bin.mkdir()
    (s.bin / "looplock").symlink_to(LOOPLOCK)
    (s.work / "scripts").mkdir(parents=True)
    (s.work / "scripts" / "status.py").symlink_to(FAKE_STATUS)
    return s


def sh_c(command, env, cwd=None, timeout=TIMEOUT):
    return subprocess.run(["sh", "-c", command], env=env, cwd=cwd, capture_output=True, text=True,
                          errors="replace", timeout=timeout)


def assert_under_lock(call, site):
    """fake_status.py ran as the command of a looplock holding site.loop."""
    assert call["lock_held"] is True, call
    assert call.get("LOOPLOCK_FD"), call
    assert call["LOOPLOCK_DIR"] == os.path.realpath(site.loop), call


def test_fake_status_sees_an_unlocked_loop(site):
    """The control: run bare, fake_status.py reports the lock free (so the
    lock_held checks below can fail)."""
    r = subprocess.run([PY, str(FAKE_STATUS), "--tick"], env=site.env(), capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    [call] = site.calls()
    assert call["lock_held"] is False
    assert "LOOPLOCK_FD" not in call


# -- crontab -------------------------------------------------------------------


def crontab_entries():
    """(environment, [(time fields, command)]) of examples/crontab."""
    env, jobs = {}, []
    for line in (EXAMPLES / "crontab").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", line)
        if m:
            env[m.group(1)] = m.group(2)
            continue
        fields = line.split(None, 5)
        assert len(fields) == 6, f"not a crontab line: {line!r}"
        for f in fields[:5]:
            assert re.fullmatch(r"[0-9*/,-]+", f), f"bad time field {f!r} in {line!r}"
        jobs.append((fields[:5], fields[5]))
    return env, jobs


def test_crontab_jobs_run_under_the_lock(site, holders):
    cron_env, jobs = crontab_entries()
    assert cron_env.get("PATH") == "/usr/bin:/bin"
    tick = [cmd for _, cmd in jobs if "--tick" in cmd]
    monitor = [cmd for _, cmd in jobs if "single_flight" in cmd]
    assert len(tick) == 1 and len(monitor) == 1, jobs
    for cmd in tick + monitor:  # the package's looplock, by its full path
        assert cmd.startswith(PACKAGE_LOOPLOCK + " "), cmd
    # cron's environment: only what the crontab sets (plus HOME and the fake's),
    # with the metrics directory in the test's site.
    assert cron_env.get("LOOPLOCK_METRICS_DIR"), "the crontab sets a metrics directory"
    metrics = site.loop.parent / "metrics"
    metrics.mkdir()
    env = site.env(**dict(cron_env, LOOPLOCK_METRICS_DIR=str(metrics)))
    assert env["PATH"] == "/usr/bin:/bin"  # looplock must be called by its full path

    r = sh_c(site.substitute(tick[0]), env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = sh_c(site.substitute(monitor[0]), env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    tick_call, monitor_call = site.calls()
    assert tick_call["argv"] == ["--tick"] and monitor_call["argv"] == ["--check-gate"]
    for call in (tick_call, monitor_call):
        assert_under_lock(call, site)
    assert site.iterations() == 1
    assert read_record(site.loop)["agent_id"] == "cron"
    assert lock_is_free(site.loop)

    # While something else holds the lock, the monitor is an ordinary skip,
    # and silent: cron mails nothing. The metrics file tells it.
    h = holders(site.loop, tool="flock")
    for _ in range(3):
        r = sh_c(site.substitute(monitor[0]), env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert len(site.calls()) == 2  # the monitor's command did not run
    h.release()
    (prom,) = metrics.glob("looplock_*.prom")
    text = prom.read_text()
    tick_op, monitor_op = operation_of(tick[0]), operation_of(monitor[0])
    assert re.search(rf'looplock_runs_total\{{[^}}]*operation="{monitor_op}",outcome="skipped"\}} 3\n', text), text
    for op in (tick_op, monitor_op):
        assert re.search(rf'looplock_runs_total\{{[^}}]*operation="{op}",outcome="success"\}} 1\n', text), text



MAN_PAGE = ROOT / "man" / "looplock.1.scd"  # its EXAMPLES: the cron lines
METRICS_PAGE = ROOT / "man" / "looplock-files.5.scd"  # its METRICS: the alert rules


def no_tick_alert():
    """looplock-files(5)'s "no successful tick" rule, as (label selector,
    threshold) of its expression time() - looplock_last_success_timestamp_seconds{...} > N."""
    m = re.search(r"- alert: LoopNoSuccessfulTick\n\s+expr: time\(\) - "
                  r"looplock_last_success_timestamp_seconds\{([^}]*)\} > (\d+)\n", METRICS_PAGE.read_text())
    assert m, "looplock-files(5)'s LoopNoSuccessfulTick rule has another shape: update this test"
    return dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))), int(m.group(2))


def alert_fires(prom_text, selector, threshold, now):
    """Evaluates time() - looplock_last_success_timestamp_seconds{selector} > threshold
    at time() = now on the samples of a textfile (parsed as Prometheus does):
    the values for which it holds. Asserts the selector selects a series (a
    rule that selects nothing never fires either)."""
    from prometheus_client.parser import text_string_to_metric_families
    selected = [s.value for f in text_string_to_metric_families(prom_text) for s in f.samples
                if s.name == "looplock_last_success_timestamp_seconds"
                and all(s.labels.get(k) == v for k, v in selector.items())]
    assert selected, f"no series matches {selector}:\n{prom_text}"
    return [now - v for v in selected if now - v > threshold]


def operation_of(cmd):
    m = re.search(r" --operation (\S+) ", cmd)
    return m and m.group(1)


def test_crontab_a_failing_tick_fires_the_alert_though_the_monitor_passes(site, tmp_path):
    """The tick and the monitor of examples/crontab, as shipped, each in its
    own metrics series: after a failing tick and a passing monitor,
    looplock-files(5)'s "no successful tick for an hour" alert fires
    (evaluated on the textfile's samples). With the old crontab (no --operation: both lines are
    status.py) and its rule (operation="status.py"), the monitor's success
    refreshed the tick's series and the same evaluation stayed silent."""
    pytest.importorskip("prometheus_client.parser", reason="python3-prometheus-client is not installed")
    cron_env, jobs = crontab_entries()
    [tick] = [cmd for _, cmd in jobs if "--tick" in cmd]
    [monitor] = [cmd for _, cmd in jobs if "--check-gate" in cmd]
    selector, threshold = no_tick_alert()
    assert operation_of(tick) and operation_of(monitor) and operation_of(tick) != operation_of(monitor)
    assert selector == {"operation": operation_of(tick)}, "looplock-files(5)'s alert selects the crontab's tick"

    def run_both(lines, name):
        metrics = tmp_path / name
        metrics.mkdir()
        env = site.env(**dict(cron_env, LOOPLOCK_METRICS_DIR=str(metrics), FAKE_STATUS_FAIL="--tick"))
        # The fake under the name status.py, so the default operation is the real one's.
        lines = [site.substitute(cmd.replace("/srv/loops/scripts/status.py", str(site.work / "scripts" / "status.py")))
                 for cmd in lines]
        r = sh_c(lines[0], env)
        assert r.returncode == 1, r.stderr  # the tick failed, and looplock says so by its status
        r = sh_c(lines[1], env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")  # the monitor passed, silently
        now = time.time()
        (prom,) = metrics.glob("looplock_*.prom")
        return prom.read_text(), now

    text, now = run_both([tick, monitor], "shipped")
    assert re.search(rf'operation="{operation_of(tick)}",outcome="failure"\}} 1\n', text), text
    assert re.search(rf'operation="{operation_of(monitor)}",outcome="success"\}} 1\n', text), text
    # No tick has succeeded: the tick's last success is 0, an hour ago and more.
    assert alert_fires(text, selector, threshold, now), text

    # The old crontab: the same lines without --operation.
    old = [re.sub(r" --operation \S+", "", cmd) for cmd in (tick, monitor)]
    assert not any(operation_of(cmd) for cmd in old)
    text, now = run_both(old, "old")
    assert re.search(r'operation="status.py",outcome="failure"\} 1\n', text), text  # one series for both
    assert not alert_fires(text, {"operation": "status.py"}, threshold, now), text



def man_cron_lines():
    """The crontab lines of looplock(1)'s EXAMPLES (five time fields, then
    the command)."""
    examples = re.search(r"^# EXAMPLES\n(.*?)(?=^# )", MAN_PAGE.read_text(), re.S | re.M).group(1)
    out = []
    for block in re.findall(r"```\n(.*?)```", examples, re.S):
        for line in block.splitlines():
            fields = line.split(None, 5)
            if len(fields) == 6 and all(re.fullmatch(r"[0-9*/,-]+", f) for f in fields[:5]):
                out.append(fields[5])
    return out


def test_man_page_cron_monitor_is_silent_when_it_skips(site, tmp_path, holders):
    """looplock(1)'s cron monitor skips while the lock is held with status 0
    and no output at all (cron mails whatever a job prints)."""
    [monitor] = [cmd for cmd in man_cron_lines() if "single_flight" in cmd]
    script = tmp_path / "monitor.sh"
    script.write_text("#!/bin/sh\necho monitor ran\n")
    script.chmod(0o755)
    cmd = site.substitute(monitor).replace("/srv/loops/scripts/monitor.sh", str(script))
    env = site.env()  # a bare `looplock` is the built one, from site.bin
    r = sh_c(cmd, env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "monitor ran\n", "")  # the control: it runs when free
    h = holders(site.loop, tool="flock")
    r = sh_c(cmd, env)
    h.release()
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), cmd


# -- systemd -------------------------------------------------------------------


SERVICE = EXAMPLES / "systemd" / "looplock-nightly.service"
TIMER = EXAMPLES / "systemd" / "looplock-nightly.timer"


def unit_values(path, key):
    return [line.split("=", 1)[1] for line in path.read_text().splitlines() if line.startswith(key + "=")]


def unit_seconds(span):
    """A systemd time span ("4min", "1min 30s", "60") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    parts = re.findall(r"(\d+)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+\s*[a-z]*)+\s*", span), f"not a time span: {span!r}"
    return sum(int(n) * units[u] for n, u in parts)


def timer_period_seconds():
    """The period of the timer's OnCalendar=*:0/N (every N minutes)."""
    [calendar] = unit_values(TIMER, "OnCalendar")
    m = re.fullmatch(r"\*:0/(\d+)", calendar)
    assert m, f"unexpected OnCalendar={calendar}"
    return int(m.group(1)) * 60


def service_env(site):
    """The unit's environment, its metrics directory in the test's site."""
    env = site.env()
    for value in unit_values(SERVICE, "Environment"):
        for assignment in shlex.split(value):
            k, v = assignment.split("=", 1)
            env[k] = v
    if "LOOPLOCK_METRICS_DIR" in env:
        metrics = site.loop.parent / "unit-metrics"
        metrics.mkdir(exist_ok=True)
        env["LOOPLOCK_METRICS_DIR"] = str(metrics)
    return env


def test_systemd_units_verify(site, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    units = tmp_path / "units"
    units.mkdir()
    for name in ("looplock-nightly.service", "looplock-nightly.timer"):
        (units / name).write_text(site.substitute((EXAMPLES / "systemd" / name).read_text()))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", *sorted(map(str, units.iterdir()))],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    # The check can fail: a unit whose ExecStart is not executable does.
    broken = units / "looplock-nightly.service"
    broken.write_text(broken.read_text().replace(LOOPLOCK, str(tmp_path / "no-such-looplock")))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(broken)],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0


def test_systemd_service_execstart_ticks_under_the_lock(site):
    [exec_start] = unit_values(SERVICE, "ExecStart")
    assert exec_start.startswith(PACKAGE_LOOPLOCK + " ")
    env = service_env(site)
    r = subprocess.run(shlex.split(site.substitute(exec_start)), env=env, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    [call] = site.calls()
    assert call["argv"] == ["--tick"]
    assert_under_lock(call, site)
    assert site.iterations() == 1
    assert read_record(site.loop)["agent_id"] == "systemd-nightly"


def test_systemd_service_bounds_a_tick_below_the_timer_period():
    """Type=oneshot runs until ExecStart exits. looplock's --max-time ends a
    hung tick (TERM, KILL --kill-after later: 5 s by default) after the lock
    wait; TimeoutStartSec is the backstop above all of that and below the
    timer's period, so that a hung tick fails instead of holding up every
    later one."""
    assert unit_values(SERVICE, "Type") == ["oneshot"]
    [bound] = unit_values(SERVICE, "TimeoutStartSec")
    [exec_start] = unit_values(SERVICE, "ExecStart")
    wait = float(re.search(r" -w (\S+) ", exec_start).group(1))
    max_time = unit_seconds(re.search(r" --max-time (\S+) ", exec_start).group(1))
    kill_after = 5
    assert wait + max_time + kill_after < unit_seconds(bound) < timer_period_seconds(), (bound, wait, max_time)


def test_systemd_stop_at_the_bound_ends_the_ticks_job(site):
    """What systemd does when TimeoutStartSec passes (KillMode=mixed: TERM to
    looplock alone, in the service's own session) ends the tick's command
    within TimeoutStopSec, and the lock is free again."""
    assert unit_values(SERVICE, "KillMode") == ["mixed"]
    [stop] = unit_values(SERVICE, "TimeoutStopSec")
    [exec_start] = unit_values(SERVICE, "ExecStart")
    proc = subprocess.Popen(shlex.split(site.substitute(exec_start)), env=service_env(site) | {"FAKE_STATUS_HANG": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        expect_line(proc)
        [call] = site.calls()
        assert_under_lock(call, site)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=min(unit_seconds(stop), TIMEOUT))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGTERM, proc.stderr.read()
    assert not running(call["pid"])
    assert lock_is_free(site.loop)


# -- the crontab and the timer together -------------------------------------------


def crontab_tick():
    _, jobs = crontab_entries()
    [tick] = [cmd for _, cmd in jobs if "--tick" in cmd]
    return tick


def test_crontab_tick_skips_a_slot_already_run_silently(site):
    """The crontab's tick line as shipped: a second firing in the same slot
    skips (exit 0) and prints nothing, so cron mails nothing; the control,
    the same line without -q, says noop-already-run."""
    cron_env, _ = crontab_entries()
    env = site.env(**{k: v for k, v in cron_env.items() if k != "LOOPLOCK_METRICS_DIR"})
    tick = site.substitute(crontab_tick())
    for _ in range(2):
        r = sh_c(tick, env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
    assert [c["argv"] for c in site.calls()] == [["--tick"]]
    r = sh_c(tick.replace(" -q ", " ", 1), env)
    assert r.returncode == 0 and "noop-already-run" in r.stderr, r


@pytest.mark.parametrize("first", ["crontab", "timer"])
def test_the_timer_and_the_crontab_run_each_slot_once_between_them(site, first):
    """The systemd unit's ExecStart and the crontab's tick line, as shipped,
    fire the same slot 0.3 s apart, in either order: status.py --tick runs
    once, and both exit 0 without a word."""
    cron_env, _ = crontab_entries()
    unit_env = service_env(site)
    # Both count in one metrics directory (the test's in place of the real one).
    [shipped] = [v.split("=", 1)[1] for v in unit_values(SERVICE, "Environment") if "LOOPLOCK_METRICS_DIR=" in v]
    assert cron_env["LOOPLOCK_METRICS_DIR"] == shipped, (cron_env, shipped)
    metrics = Path(unit_env["LOOPLOCK_METRICS_DIR"])
    cron = (shlex.split(site.substitute(crontab_tick())), site.env(**dict(cron_env, LOOPLOCK_METRICS_DIR=str(metrics))))
    timer = (shlex.split(site.substitute(exec_start_of_unit())), dict(unit_env, LOOPLOCK_METRICS_DIR=str(metrics)))
    a, b = (cron, timer) if first == "crontab" else (timer, cron)
    p = subprocess.Popen(a[0], env=a[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)  # the second scheduler fires 0.3 s later
        r = subprocess.run(b[0], env=b[1], capture_output=True, text=True, timeout=TIMEOUT)
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
    assert p.returncode == 0 and r.returncode == 0, (err, r.stderr)
    assert [c["argv"] for c in site.calls()] == [["--tick"]], site.calls()
    assert site.iterations() == 1
    if first == "crontab":
        assert err == "", err  # the crontab's line is quiet
    else:
        assert r.stderr == "", r.stderr  # the crontab's line skipped, silently
    # One series: the slot's success and the other's skip, whoever had the slot.
    text = next(metrics.glob("looplock_*.prom")).read_text()
    assert re.search(r'looplock_runs_total\{[^}]*operation="tick",outcome="success"\} 1\n', text), text
    assert re.search(r'looplock_runs_total\{[^}]*operation="tick",outcome="skipped"\} 1\n', text), text


def exec_start_of_unit():
    [exec_start] = unit_values(SERVICE, "ExecStart")
    return exec_start


def looplock_invocations():
    """Every looplock command line in examples/ (commented crontab lines,
    continued lines and docstrings included): (file, tokens after
    "looplock")."""
    found = []
    for path in sorted(EXAMPLES.rglob("*")):
        if not path.is_file():
            continue
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            m = re.search(r"(?:^|[\s/])looplock (?=-|\S+ -)", line)
            if not m or "--inspect" in line:
                continue
            text = line[m.end():]
            while text.endswith("\\") and i < len(lines):
                text = text[:-1] + " " + lines[i].strip()
                i += 1
            tokens = None
            for _ in range(8):  # a quoted command over several lines
                try:
                    tokens = shlex.split(text, comments=False)
                    break
                except ValueError:
                    if i >= len(lines):
                        break
                    text += "\n" + lines[i]
                    i += 1
            if tokens and ("--" in tokens or "-c" in tokens):
                found.append((path.relative_to(ROOT), tokens))
    return found


def option_value(tokens, name):
    own = tokens[:tokens.index("--")] if "--" in tokens else tokens[:tokens.index("-c")]
    return own[own.index(name) + 1] if name in own else None


def command_of(tokens):
    """The command a looplock line runs, by script name: the interpreter
    (python3, py -3) left out and each path cut to its last part, so that
    scripts/status.py in a CI checkout and /srv/loops/scripts/status.py in
    cron are one command."""
    if "--" not in tokens:
        return ("-c", tokens[tokens.index("-c") + 1])
    words = tokens[tokens.index("--") + 1:]
    if words[:1] == ["python3"]:
        words = words[1:]
    elif words[:2] == ["py", "-3"]:
        words = words[2:]
    return tuple(re.split(r"[/\\]", w)[-1] for w in words)


def test_lines_running_the_same_command_carry_the_same_operation_and_once_per():
    """A tick fired by two schedulers (cron, the timer, a CI job) runs once
    per slot, and is one series for the alert, only if both give the same
    --operation and --once-per: every looplock line of examples/ that runs
    the same script with the same arguments agrees on both."""
    runs = {}
    for path, tokens in looplock_invocations():
        runs.setdefault(command_of(tokens), []).append((str(path), option_value(tokens, "--operation"),
                                                        option_value(tokens, "--once-per")))
    ticks = runs[("status.py", "--tick")]
    assert {p for p, _, _ in ticks} >= {"examples/crontab", "examples/systemd/looplock-nightly.service",
                                        "examples/ci/gitlab-ci.yml", "examples/ci/github-actions.yml",
                                        "examples/ci/github-actions-hold.yml"}, ticks
    for command, seen in runs.items():
        assert len({(op, once) for _, op, once in seen}) == 1, (command, seen)
    # The check can fail: the unit as it was before it named the slot, and
    # the GitLab job as it was, by the path of a CI checkout.
    for old in ("/usr/bin/looplock -w 30 --max-time 3m /srv/loops/nightly -- python3 /srv/loops/scripts/status.py --tick",
                'looplock -w 120 --agent "gitlab-$CI_JOB_ID" --operation nightly-tick /srv/loops/nightly -- '
                'python3 scripts/status.py --tick'):
        tokens = shlex.split(old.split("looplock ", 1)[1])
        assert command_of(tokens) == ("status.py", "--tick")
        assert (option_value(tokens, "--operation"), option_value(tokens, "--once-per")) != (ticks[0][1], ticks[0][2])


# -- wrap-status.sh --------------------------------------------------------------


def test_wrap_status_runs_each_group_in_one_critical_section(site):
    script = EXAMPLES / "wrap-status.sh"
    assert os.access(script, os.X_OK)
    r = subprocess.run(["sh", str(script), str(site.loop)], env=site.env(STATUS_PY=str(FAKE_STATUS)),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    calls = site.calls()
    assert [c["argv"] for c in calls] == [
        ["--approve", "--loop", "nightly"], ["--tick"], ["--check-gate"], ["--report"]]
    for call in calls:
        assert_under_lock(call, site)
    # Each pair ran inside one hold (the same looplock), the two pairs in two.
    assert calls[0]["LOOPLOCK_HOLDER_PID"] == calls[1]["LOOPLOCK_HOLDER_PID"]
    assert calls[2]["LOOPLOCK_HOLDER_PID"] == calls[3]["LOOPLOCK_HOLDER_PID"]
    assert calls[0]["LOOPLOCK_HOLDER_PID"] != calls[2]["LOOPLOCK_HOLDER_PID"]
    assert calls[0]["LOOPLOCK_POLICY"] == "mutation" and calls[2]["LOOPLOCK_POLICY"] == "monitor"
    assert site.iterations() == 1
    assert read_record(site.loop)["operation"] == "check-gate"


def blocked_waiters(lock_path):
    """How many flock waiters /proc/locks lists as blocked on lock_path."""
    ino = os.stat(lock_path).st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and "FLOCK" in line and line.split()[-3].endswith(f":{ino}"))


def test_wrap_status_waits_for_another_holder(site, holders):
    """While another process holds the lock, no status.py call runs; once it
    lets go, the script's critical sections run."""
    h = holders(site.loop, tool="flock")
    proc = subprocess.Popen(["sh", str(EXAMPLES / "wrap-status.sh"), str(site.loop)],
                            env=site.env(STATUS_PY=str(FAKE_STATUS)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 10
        while blocked_waiters(site.loop / ".state.lock") == 0:  # looplock is waiting
            assert time.monotonic() < end, "wrap-status.sh never waited for the lock"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        assert site.calls() == []
        h.release()
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert len(site.calls()) == 4
    for call in site.calls():
        assert_under_lock(call, site)


# -- CI snippets ---------------------------------------------------------------------


def ci_commands(doc, kind):
    """The run:/script: commands of a workflow or a .gitlab-ci.yml."""
    out = []
    if kind == "github":
        for job in doc["jobs"].values():
            out += [step["run"] for step in job["steps"] if "run" in step]
    else:
        for name, job in doc.items():
            if isinstance(job, dict) and "script" in job:
                out += list(job["script"]) + list(job.get("after_script", []))
    return out


@pytest.mark.parametrize("name,kind", [("github-actions.yml", "github"), ("gitlab-ci.yml", "gitlab")])
def test_ci_snippet_is_valid_and_runs(site, name, kind):
    yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed")
    doc = yaml.safe_load((EXAMPLES / "ci" / name).read_text())
    commands = ci_commands(doc, kind)
    wrapped = [c for c in commands if re.search(r"\blooplock\b", c) and "--inspect" not in c]
    assert wrapped, f"no looplock command in {name}"
    operations = []
    for c in wrapped:
        assert re.search(r"\blooplock\b.* -- ", c, re.S), f"looplock without '--' in {name}: {c!r}"
        m = re.search(r"\blooplock\b.* --operation (\S+) .* -- ", c, re.S)
        assert m, f"looplock without --operation in {name}: {c!r}"
        operations.append(m.group(1))
    for c in commands:
        text = site.substitute(c).replace("${{ github.run_id }}", "4242")
        r = sh_c(text, site.env(CI_JOB_ID="4242"), cwd=site.work)
        assert r.returncode == 0, (c, r.stderr)
    calls = site.calls()
    assert calls, "the job ran no status.py"
    for call in calls:
        assert_under_lock(call, site)
    assert site.iterations() == 1
    record = read_record(site.loop)
    assert record["agent_id"] in ("gha-4242", "gitlab-4242")
    assert record["operation"] == operations[-1] != "sh"
    # Fired again inside the slot (as cron's tick would be): the tick skips
    # with 0, and the job passes.
    for c in commands:
        text = site.substitute(c).replace("${{ github.run_id }}", "4243")
        r = sh_c(text, site.env(CI_JOB_ID="4243"), cwd=site.work)
        assert r.returncode == 0, (c, r.stderr)
        if "--tick" in c:
            assert "noop-already-run: tick already ran in this slot" in r.stderr, r.stderr
    assert site.iterations() == 1


# -- python/loop_lock.py --------------------------------------------------------------

LOOP_LOCK_DIR = EXAMPLES / "python"


def python_code(body):
    return f"import sys; sys.path.insert(0, {str(LOOP_LOCK_DIR)!r})\nfrom loop_lock import _loop_lock\n{body}"


def run_py(code, args=(), timeout=TIMEOUT, under=None):
    """Runs Python `code` (under looplock ARGS... -- when `under` is given)."""
    cmd = [PY, "-c", code, *args]
    if under is not None:
        cmd = [LOOPLOCK, *under, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_loop_lock_excludes_other_holders(loop_dir, holders):
    code = python_code(
        "import os\n"
        "try:\n"
        "    with _loop_lock(sys.argv[1], timeout=0.3):\n"
        "        print('got it')\n"
        "except TimeoutError:\n"
        "    print('timeout')\n")
    for tool in ("looplock", "flock", "python"):
        h = holders(loop_dir, tool=tool)
        r = run_py(code, [loop_dir])
        assert r.stdout == "timeout\n", (tool, r.stdout, r.stderr)
        h.release()
        r = run_py(code, [loop_dir])
        assert r.stdout == "got it\n", (tool, r.stdout, r.stderr)
    # And it excludes looplock while it holds the lock.
    holder = subprocess.Popen(
        [PY, "-c", python_code("with _loop_lock(sys.argv[1]):\n print('ready', flush=True); sys.stdin.read()"),
         str(loop_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        expect_line(holder)
        r = subprocess.run([LOOPLOCK, "-p", "single_flight", str(loop_dir), "--", "true"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0 and "noop-locked" in r.stderr, r.stderr
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
    assert lock_is_free(loop_dir)


def test_loop_lock_under_looplock_uses_the_inherited_fd(loop_dir):
    """Nested under looplock for the same dir it runs at once (a deadlock
    would hit the timeout), inside looplock's hold, and leaves the lock to
    looplock (the fd stays open and locked after the block)."""
    code = python_code(
        "import fcntl, os\n"
        "fd_env = int(os.environ['LOOPLOCK_FD'])\n"
        "with _loop_lock(sys.argv[1]) as fd:\n"
        "    print('inside', fd == fd_env)\n"
        "fd = os.open(os.path.join(sys.argv[1], '.state.lock'), os.O_RDONLY)\n"
        "try:\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('released')\n"
        "except BlockingIOError:\n"
        "    print('still held')\n")
    r = run_py(code, [loop_dir], timeout=10, under=["-p", "blocking", str(loop_dir)])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "inside True\nstill held\n"
    # Through a symlink to the loop dir too (LOOPLOCK_DIR is canonical).
    link = loop_dir.parent / "link"
    link.symlink_to(loop_dir)
    r = run_py(code, [link], timeout=10, under=["-p", "blocking", str(link)])
    assert r.stdout == "inside True\nstill held\n", r.stderr
    # The script form says which way it took the lock.
    script = [PY, str(LOOP_LOCK_DIR / "loop_lock.py"), str(loop_dir)]
    r = subprocess.run([LOOPLOCK, str(loop_dir), "--", *script], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stdout.startswith("inherited fd "), r.stdout + r.stderr
    r = subprocess.run(script, capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and r.stdout.startswith("opened fd "), r.stdout + r.stderr


def test_loop_lock_ignores_looplock_env_for_another_loop(tmp_path):
    """Under looplock for loop A, _loop_lock(B) takes B's lock itself, and a
    copied LOOPLOCK_FD that does not hold the lock is not trusted."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    code = python_code(
        "import fcntl, os\n"
        "with _loop_lock(sys.argv[1]) as fd:\n"
        "    print('own fd', fd != int(os.environ.get('LOOPLOCK_FD', -1)))\n")
    r = run_py(code, [b], timeout=10, under=[str(a)])
    assert r.stdout == "own fd True\n", r.stderr
    # A forged environment naming an fd of the right file that holds no lock.
    forged = python_code(
        "import os\n"
        "fd = os.open(os.path.join(sys.argv[1], '.state.lock'), os.O_RDONLY | os.O_CREAT)\n"
        "os.environ.update(LOOPLOCK_FD=str(fd), LOOPLOCK_DIR=os.path.realpath(sys.argv[1]))\n"
        "with _loop_lock(sys.argv[1]) as lock_fd:\n"
        "    print('own fd', lock_fd != fd)\n")
    r = run_py(forged, [a], timeout=10)
    assert r.stdout == "own fd True\n", r.stderr


def test_naive_loop_lock_deadlocks_under_looplock(loop_dir):
    """The reason for the inherited-fd check: a _loop_lock that opens the
    lock file again waits for its own parent looplock, forever."""
    naive = (
        "import fcntl, os, sys\n"
        "fd = os.open(os.path.join(sys.argv[1], '.state.lock'), os.O_RDWR | os.O_CREAT)\n"
        "print('locking', flush=True)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('got it', flush=True)\n")
    proc = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", PY, "-c", naive, str(loop_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        expect_line(proc, "locking")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)  # the correct version finishes at once (above)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=TIMEOUT)
    assert "got it" not in out


# -- python/loop_lock.py nesting without the descriptor ---------------------------------

# examples/python/loop_lock.py as it was when it trusted LOOPLOCK_FD alone:
# the tests below run it in the same setups to show that it waited for its
# own parent there (so that they can fail).
FD_ONLY_LOOP_LOCK_DIR = ROOT / "tests" / "integration" / "helpers" / "loop_lock_fd_only"

NESTED_CHILD = """\
import fcntl, os, sys
sys.path.insert(0, {module_dir!r})
from loop_lock import _loop_lock
lock = os.path.join(sys.argv[1], '.state.lock')
try:
    own = os.stat(lock).st_ino == os.fstat(int(os.environ['LOOPLOCK_FD'])).st_ino
except (KeyError, ValueError, OSError):
    own = False
print('locking', flush=True)
with _loop_lock(sys.argv[1]) as fd:
    probe = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print('inside, lock free', flush=True)
    except BlockingIOError:
        print('inside, lock held, fd', fd, flush=True)
print('LOOPLOCK_FD open:', own, flush=True)
"""

# Runs the child through subprocess.run, which closes every descriptor but
# 0, 1 and 2 (close_fds=True, no pass_fds).
SUBPROCESS_PARENT = """\
import subprocess, sys
r = subprocess.run([sys.executable, sys.argv[1], sys.argv[2]], timeout=30)
sys.exit(r.returncode)
"""


def start_nested(setup, module_dir, loop, tmp_path):
    """looplock LOOP running the nested child with `module_dir`'s loop_lock,
    either directly under `looplock -o` or under `looplock` through a
    parent.py that starts it with subprocess.run."""
    child = tmp_path / "child.py"
    child.write_text(NESTED_CHILD.format(module_dir=str(module_dir)))
    if setup == "-o":
        cmd = [LOOPLOCK, "-o", "-p", "blocking", str(loop), "--", PY, str(child), str(loop)]
    else:
        parent = tmp_path / "parent.py"
        parent.write_text(SUBPROCESS_PARENT)
        cmd = [LOOPLOCK, "-p", "blocking", str(loop), "--", PY, str(parent), str(child), str(loop)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def end_group(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.communicate(timeout=TIMEOUT)


@pytest.mark.parametrize("setup", ["-o", "subprocess"])
def test_loop_lock_nests_without_the_descriptor(loop_dir, tmp_path, setup):
    """Under `looplock -o` and in a child started by subprocess.run, the
    descriptor is gone; _loop_lock finds the ancestor looplock that holds the
    lock and runs at once inside its hold."""
    proc = start_nested(setup, LOOP_LOCK_DIR, loop_dir, tmp_path)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        end_group(proc)
    assert proc.returncode == 0, out + err
    assert out == "locking\ninside, lock held, fd None\nLOOPLOCK_FD open: False\n", out + err
    assert lock_is_free(loop_dir)
    # The script form names the looplock that holds the lock for it.
    script = [PY, str(LOOP_LOCK_DIR / "loop_lock.py"), str(loop_dir)]
    proc = subprocess.Popen([LOOPLOCK, "-o", str(loop_dir), "--", *script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert (proc.returncode, out) == (0, f"held by ancestor pid {proc.pid}\n"), err


@pytest.mark.parametrize("setup", ["-o", "subprocess"])
def test_fd_only_loop_lock_waits_for_its_parent_without_the_descriptor(loop_dir, tmp_path, setup):
    """The same setups with the LOOPLOCK_FD-only check: the child opens the
    lock file again and sleeps in flock(2) behind its own ancestor, for good."""
    proc = start_nested(setup, FD_ONLY_LOOP_LOCK_DIR, loop_dir, tmp_path)
    waiting = set()
    try:
        expect_line(proc, "locking")
        lock = loop_dir / ".state.lock"
        end = time.monotonic() + TIMEOUT
        while not waiting:  # the child sleeps in flock(2)
            assert time.monotonic() < end, "the fd-only child never waited for the lock"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
            waiting = waiting_pids(lock)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)  # it would wait as long as its parent holds the lock: forever
        assert waiting_pids(lock) == waiting
    finally:
        for pid in waiting:  # first, or it gets the lock once its ancestors are killed
            os.kill(pid, signal.SIGKILL)
        out, _ = end_group(proc)
    assert "inside" not in out


def looplock_fd(pid, loop):
    """The descriptor through which looplock PID holds LOOP's lock (by /proc)."""
    lock = Path(loop) / ".state.lock"
    for fd in fds_on(pid, lock):
        if "FLOCK  ADVISORY  WRITE" in Path(f"/proc/{pid}/fdinfo/{fd}").read_text():
            return fd
    raise AssertionError(f"pid {pid} holds no descriptor locked on {lock}")


TRY_LOCK = python_code(
    "try:\n"
    "    with _loop_lock(sys.argv[1], timeout=0.3) as fd:\n"
    "        print('inside', fd)\n"
    "except TimeoutError:\n"
    "    print('timeout')\n")


def try_lock_with(loop, env):
    """_loop_lock(LOOP, timeout=0.3) in a child with LOOPLOCK_* from `env`
    only (nothing inherited from this test's own environment)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLOCK_")}
    r = subprocess.run([PY, "-c", TRY_LOCK, str(loop)], env=base | env, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_forged_holder_environment_never_bypasses_the_lock(tmp_path, holders):
    """LOOPLOCK_HOLDER_PID/FD that name a holder of the lock which is not an
    ancestor, a live ancestor (this test) whose descriptor does not hold the
    lock or holds another loop's, or a looplock that has exited (a copied
    environment): _loop_lock waits for the lock like anyone (and times out
    while another process holds it)."""
    loop, other = tmp_path / "loop", tmp_path / "other"
    loop.mkdir()
    other.mkdir()
    lock = loop / ".state.lock"
    env_of = lambda pid, fd: {"LOOPLOCK_HOLDER_PID": str(pid), "LOOPLOCK_HOLDER_FD": str(fd),
                              "LOOPLOCK_FD": str(fd), "LOOPLOCK_DIR": os.path.realpath(loop)}

    # A copied environment: the variables of a looplock run that has ended.
    r = subprocess.run([LOOPLOCK, str(loop), "--", "env"], capture_output=True, text=True, timeout=TIMEOUT)
    copied = dict(line.split("=", 1) for line in r.stdout.splitlines() if line.startswith("LOOPLOCK_"))
    assert {"LOOPLOCK_HOLDER_PID", "LOOPLOCK_HOLDER_FD", "LOOPLOCK_FD"} <= copied.keys(), r.stdout
    assert not running(int(copied["LOOPLOCK_HOLDER_PID"]))

    h = holders(loop, tool="looplock")  # a live holder that is no ancestor of the children
    sibling = env_of(h.pid, looplock_fd(h.pid, loop))
    unlocked = os.open(lock, os.O_RDONLY)  # this test: an ancestor, its fd on the lock file holds nothing
    elsewhere = os.open(other / ".state.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(elsewhere, fcntl.LOCK_EX)  # ... and another loop's lock, held
    try:
        for name, env in [("copied", copied), ("sibling", sibling), ("unlocked", env_of(os.getpid(), unlocked)),
                          ("other loop", env_of(os.getpid(), elsewhere))]:
            assert try_lock_with(loop, env) == "timeout\n", name
        h.release()
        # The control: the same shape of environment, from an ancestor that
        # really holds the lock (this test, through `unlocked` now), nests.
        fcntl.flock(unlocked, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert try_lock_with(loop, env_of(os.getpid(), unlocked)) == "inside None\n"
        fcntl.flock(unlocked, fcntl.LOCK_UN)
        assert try_lock_with(loop, env_of(os.getpid(), unlocked)).startswith("inside ")  # its own lock now
    finally:
        os.close(unlocked)
        os.close(elsewhere)


def test_loop_lock_creates_the_lock_file_for_owner_and_group_only(tmp_path):
    """0660 less the umask, as looplock creates it: flock(2) needs only a
    read descriptor, so a lock file that others can read is one that any
    local user can hold and stall every run with."""
    code = python_code(
        "import os\n"
        "os.umask(int(sys.argv[2], 8))\n"
        "with _loop_lock(sys.argv[1]):\n"
        "    pass\n"
        "print(oct(os.stat(os.path.join(sys.argv[1], '.state.lock')).st_mode & 0o777))\n")
    for umask, mode in (("0", "0o660"), ("022", "0o640"), ("002", "0o660")):
        loop = tmp_path / f"loop-{umask}"
        loop.mkdir()
        r = run_py(code, [loop, umask])
        assert (r.returncode, r.stdout) == (0, mode + "\n"), (umask, r.stderr)


# -- python/warned_tick.py ------------------------------------------------------

WARNED_TICK = EXAMPLES / "python" / "warned_tick.py"


def warned_tick(loop_dir, *looplock_args, items=400):
    return subprocess.run([LOOPLOCK, *looplock_args, str(loop_dir), "--", PY, str(WARNED_TICK), str(loop_dir),
                           str(items), "0.05"], capture_output=True, text=True, timeout=TIMEOUT)


def test_warned_tick_checkpoints_before_max_time_and_the_next_tick_resumes(loop_dir):
    """20 s of work under --max-time 2s: warned 1 s before the TERM, the tick
    finishes its item, saves where it got to and exits 0; the next tick
    starts there. The control: without --warn-before, --max-time ends it
    (124) and nothing is saved."""
    r = warned_tick(loop_dir, "--max-time", "2s", "--warn-before", "1s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("checkpointed at item "), r.stdout
    done = int(r.stdout.split()[-1])
    assert 0 < done < 400 and int((loop_dir / "tick.checkpoint").read_text()) == done
    assert "sent USR1 to the job" in r.stderr
    r = warned_tick(loop_dir, "--max-time", "2s", "--warn-before", "1s")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"resuming at item {done}", r.stdout

    (loop_dir / "tick.checkpoint").unlink()
    r = warned_tick(loop_dir, "--max-time", "1s", "--kill-after", "1s")
    # LOOPLOCK_DEADLINE alone lets it stop in time: it checks the deadline between items.
    assert r.returncode == 0 and r.stdout.startswith("checkpointed at item "), (r.stdout, r.stderr)
    (loop_dir / "tick.checkpoint").unlink()
    r = subprocess.run([LOOPLOCK, "--max-time", "1s", str(loop_dir), "--", "env", "-u", "LOOPLOCK_DEADLINE", PY,
                        str(WARNED_TICK), str(loop_dir), "400", "0.05"], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 124 and "checkpointed" not in r.stdout, (r.stdout, r.stderr)
    assert not (loop_dir / "tick.checkpoint").exists()


# -- python/loop_lock.py on Windows: the nesting decision, with the system's facts stood in for -------------


class FakeWindows:
    """Processes 10 (looplock.exe, the holder) > 20 (cmd.exe) > 30 (this
    Python), each created after its parent; 40 is outside the tree."""

    def __init__(self, held=True):
        self.parent = {30: 20, 20: 10, 10: 4, 40: 4}
        self.time = {4: 1, 10: 100, 20: 200, 30: 300, 40: 400}
        self.stem = {10: "looplock", 20: "cmd", 30: "python", 40: "python"}
        self.held = held

    def parents(self):
        return dict(self.parent)

    def created(self, pid):
        return self.time.get(pid)

    def image_stem(self, pid):
        return self.stem.get(pid)

    def lock_held(self, lock_path):
        return self.held


def windows_record(tmp_path, **fields):
    lock = tmp_path / ".state.lock"
    record = {"schema": "file_lock_holder_v0", "lock_id": "0123456789abcdef", "pid": 10, "pid_start": "100",
              "agent_id": "ci", "operation": "tick", "policy": "mutation", "acquired_at": "2026-12-04T00:00:00.000Z",
              **fields}
    (tmp_path / ".state.lock.holder").write_text(json.dumps(record) + "\n")
    return str(lock)


def loop_lock_module():
    sys.path.insert(0, str(LOOP_LOCK_DIR))
    try:
        import loop_lock
        return loop_lock
    finally:
        sys.path.pop(0)


def test_loop_lock_on_windows_nests_only_under_a_live_ancestor_named_by_its_record(tmp_path):
    m = loop_lock_module()
    env = {"LOOPLOCK_HOLDER_PID": "10", "LOOPLOCK_LOCK_ID": "0123456789abcdef"}
    lock = windows_record(tmp_path)
    assert m._windows_outer_holder(lock, env, FakeWindows(), self_pid=30) == 10
    # Each fact missing in turn: it takes the lock itself.
    assert m._windows_outer_holder(lock, env, FakeWindows(), self_pid=40) is None  # a copied environment
    assert m._windows_outer_holder(lock, {}, FakeWindows(), self_pid=30) is None
    # The ancestor holds another loop's lock: its LOOPLOCK_LOCK_ID is that one's.
    assert m._windows_outer_holder(lock, {**env, "LOOPLOCK_LOCK_ID": "fedcba9876543210"}, FakeWindows(),
                                   self_pid=30) is None
    assert m._windows_outer_holder(lock, env, FakeWindows(held=False), self_pid=30) is None
    reused = FakeWindows()
    reused.time[10] = 350  # pid 10 is now a process created after this one: not its parent any more
    assert m._windows_outer_holder(windows_record(tmp_path, pid_start="350"), env, reused, self_pid=30) is None
    not_looplock = FakeWindows()
    not_looplock.stem[10] = "python"
    assert m._windows_outer_holder(lock, env, not_looplock, self_pid=30) is None
    assert m._windows_outer_holder(windows_record(tmp_path, pid_start="99"), env, FakeWindows(), self_pid=30) is None
    assert m._windows_outer_holder(windows_record(tmp_path, released_at="2026-12-04T00:00:01.000Z"), env,
                                   FakeWindows(), self_pid=30) is None
    assert m._windows_outer_holder(windows_record(tmp_path, pid=20), env, FakeWindows(), self_pid=30) is None


# -- ci/github-actions-hold.yml: a lock held across steps -----------------------------


def hold_workflow_steps(site):
    """The hold workflow's run: steps, each with its `if:` (None: always run
    while the job succeeds), its commands made to run here."""
    yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed")
    doc = yaml.safe_load((EXAMPLES / "ci" / "github-actions-hold.yml").read_text())
    [job] = doc["jobs"].values()
    return [(step.get("if"), site.substitute(step["run"]).replace("${{ github.run_id }}", "4242"))
            for step in job["steps"] if "run" in step]


def run_steps(site, steps, github_env):
    """Runs steps as a runner does: each in its own shell, with what earlier
    steps appended to $GITHUB_ENV in its environment; `if:` is honoured for
    always() && env.LOOPLOCK_HOLD != ''. Returns each step's result."""
    env = site.env(GITHUB_ENV=str(github_env))
    results = []
    for condition, command in steps:
        for line in github_env.read_text().splitlines() if github_env.exists() else []:
            key, _, value = line.partition("=")
            env[key] = value
        if condition and "env.LOOPLOCK_HOLD != ''" in condition and not env.get("LOOPLOCK_HOLD"):
            results.append(None)
            continue
        results.append(subprocess.run(["sh", "-e", "-c", command], env=env, cwd=site.work, capture_output=True,
                                      text=True, errors="replace", timeout=TIMEOUT))
    return results


def test_ci_hold_workflow_holds_the_lock_across_its_steps_and_lets_go(site, tmp_path):
    steps = hold_workflow_steps(site)
    assert "--hold" in steps[0][1] and "--tied-to \"$PPID\"" in steps[0][1]
    assert steps[-1][1].strip() == "looplock --release"
    outsider = []
    github_env = tmp_path / "github_env"
    # Step by step, with another job's tick trying the lock between them.
    for i in range(len(steps)):
        [r] = run_steps(site, [steps[i]], github_env)
        assert r is not None and r.returncode == 0, (steps[i], r and r.stderr)
        if i < len(steps) - 1:
            o = subprocess.run([LOOPLOCK, "-w", "0.2", site.loop, "--", "true"], capture_output=True, text=True,
                               timeout=TIMEOUT, env=site.env())
            outsider.append(o.returncode)
    assert outsider == [75] * (len(steps) - 1)
    calls = site.calls()
    assert [c["argv"][0] for c in calls] == ["--approve", "--tick", "--check-gate"]
    assert all(c["lock_held"] for c in calls)
    assert len({c["LOOPLOCK_HOLD"] for c in calls}) == 1  # inside the one hold, every step
    assert site.iterations() == 1
    record = read_record(site.loop)
    assert (record["agent_id"], record["operation"]) == ("gha-4242", "release")
    assert record["released_at"] is not None
    assert lock_is_free(site.loop)


def test_ci_hold_workflow_a_cancelled_job_ends_the_hold(site, tmp_path):
    """The runner's worker ($PPID of a step) goes away: --tied-to ends the
    hold without waiting for --max-time, and the job's last step never ran."""
    steps = hold_workflow_steps(site)
    github_env = tmp_path / "github_env"
    worker = subprocess.Popen(["sh", "-c", 'sh -e -c "$STEP" && echo ready; read x'], cwd=site.work,
                              env={**site.env(GITHUB_ENV=str(github_env)), "STEP": steps[0][1]},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        expect_line(worker, "ready")
        pid = int(github_env.read_text().split("=", 1)[1].split(":", 1)[0])
        assert running(pid) and not lock_is_free(site.loop)
        worker.kill()
        worker.wait(timeout=TIMEOUT)
        wait_until(lambda: not running(pid), "the hold to end with the worker")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=TIMEOUT)
    assert lock_is_free(site.loop)
