"""looplock.exe under wine, against real Windows lock holders.

Run by the windows stage of scripts/test (tests/windows/meson.build), which
gives these tests a persistent wineserver of the stage's own WINEPREFIX:
never stopped here. winhelper.exe (winhelper.cpp) stands in for the loop
scripts' own helper: the C runtime's _locking on byte 0, from ucrtbase.dll
as CPython's msvcrt.locking calls it. Every wait is bounded; handshakes are
lines on pipes and files the job writes.

What wine cannot check (it enforces no byte-range lock, passes 8 bits of an
exit code to Linux, and implements no Ctrl-Break to a process group) is
listed at the end as named, skipped tests; looplock-windows(7)
says what the design does about each.
"""
import contextlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest

WINE = "/usr/lib/wine/wine64"
EXE = os.environ.get("LOOPLOCK_EXE", "")
HELPER = os.environ.get("WINHELPER", "")
TIMEOUT = 120

pytestmark = pytest.mark.skipif(not (EXE and HELPER and os.path.exists(WINE)), reason="needs wine64 and the Windows build")


def win(path):
    """A Linux path as wine's Z: drive names it."""
    return "Z:" + str(path).replace("/", "\\")


# wine can fail to start a program before it runs any of it: Debian's wine64
# has no preloader, so ASLR may put the loader's brk heap (anywhere in the
# 1 GiB above 0x7d000000) over 0x7ffe0000, where wine must map the user shared
# data page. wine then exits 1 and says why on its err channel only, which
# WINEDEBUG=-all silences: an empty exit 1, a few starts in 10,000. Here that
# one channel is on, so that such a start is told from the program's own
# exit 1 and started again.
WINE_START_FAILED = "wine: failed to map the shared user data"
WINE_START_TRIES = 3
os.environ["WINEDEBUG"] = ",".join(w for w in [os.environ.get("WINEDEBUG", ""), "err+virtual"] if w)


def run(*args, **kw):
    kw.setdefault("timeout", TIMEOUT)
    for attempt in range(1, WINE_START_TRIES + 1):
        r = subprocess.run([WINE, *map(str, args)], capture_output=True, text=True, encoding="utf-8",
                           errors="replace", **kw)
        if not (r.returncode == 1 and not r.stdout and WINE_START_FAILED in r.stderr):
            return r
        warnings.warn(f"wine could not start {args[0]} (attempt {attempt} of {WINE_START_TRIES}: "
                      f"{r.stderr.strip()}): the loader's heap lay over the user shared data page; starting it again")
    return r


def looplock(*args, **kw):
    return run(EXE, *args, **kw)


def helper_args(*args):
    return [HELPER, *map(str, args)]


class Holder:
    """winhelper lock: the scripts' msvcrt.locking holder, until stopped."""

    def __init__(self, path):
        self.proc = subprocess.Popen([WINE, HELPER, "lock", win(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        # Its first line within the bound, or the test fails (never hangs).
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)
            raise AssertionError(f"winhelper lock {path} said nothing within {TIMEOUT} s")
        self.first = self.proc.stdout.readline().strip()

    def release(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=TIMEOUT) == 0


def busy(lock_path):
    """One try of the scripts' helper: whether another holds the lock."""
    r = run(HELPER, "lock", win(lock_path), input="")
    assert r.stdout.strip() in ("locked", "busy"), r
    return r.stdout.strip() == "busy"


def alive(pid):
    return run(HELPER, "alive", pid).returncode == 0


def wait_for(pred, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


@pytest.fixture
def loop_dir(tmp_path):
    d = tmp_path / "loop"
    d.mkdir()
    return d


def test_the_exit_status_passes_through(loop_dir):
    assert looplock(loop_dir, "--", HELPER, "exit", "3").returncode == 3
    assert looplock(loop_dir, "-c", "exit 7").returncode == 7


@pytest.mark.parametrize("code", ["300", "0xC0000005", "259"])
def test_a_windows_parent_sees_all_32_bits(loop_dir, code):
    r = run(HELPER, "run", EXE, win(loop_dir), "--", HELPER, "exit", code)
    assert r.stdout.strip() == f"exit {int(code, 0)}", r


def test_the_control_shows_8_bits_only(loop_dir):
    """wine's own limit, which is why the test above asks a Windows parent."""
    assert run(HELPER, "exit", "300").returncode == 300 % 256


def test_the_scripts_helper_and_looplock_exclude_each_other(loop_dir):
    lock = loop_dir / ".state.lock"
    holder = Holder(lock)
    assert holder.first == "locked"
    try:
        r = looplock("-n", loop_dir, "--", HELPER, "exit", "0")
        assert r.returncode == 75, r.stderr
        r = looplock("-p", "single_flight", loop_dir, "--", HELPER, "exit", "9")
        assert r.returncode == 0 and "noop" in r.stderr, r.stderr
        start = time.monotonic()
        r = looplock("-w", "1", loop_dir, "--", HELPER, "exit", "0")
        assert r.returncode == 75 and time.monotonic() - start >= 0.9, r.stderr
    finally:
        holder.release()
    assert looplock("-n", loop_dir, "--", HELPER, "exit", "0").returncode == 0

    # The other way: looplock's job runs, and the scripts' helper finds the
    # lock held; once the job has ended, it is free.
    other = loop_dir / "job.lock"
    job = subprocess.Popen([WINE, EXE, str(loop_dir), "--", HELPER, "lock", win(other)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "locked"  # the job runs
        assert busy(lock)
    finally:
        job.stdin.close()
        assert job.wait(timeout=TIMEOUT) == 0
    assert not busy(lock)


def test_a_waiter_gets_the_lock_once_the_helper_releases_it(loop_dir):
    holder = Holder(loop_dir / ".state.lock")
    waiter = subprocess.Popen([WINE, EXE, "-v", "-w", "60", str(loop_dir), "--", HELPER, "exit", "4"],
                              stderr=subprocess.PIPE, text=True)
    try:
        # The waiter says when it starts to wait (-v), then it is released to it.
        assert "waiting" in waiter.stderr.readline()
    finally:
        holder.release()
    assert waiter.wait(timeout=TIMEOUT) == 4


def test_a_coalescing_tick_joins_the_one_waiting_and_skips(loop_dir):
    holder = Holder(loop_dir / ".state.lock")
    waiter = subprocess.Popen([WINE, EXE, "-v", "-p", "coalesce", "--operation", "tick", str(loop_dir), "--", HELPER,
                               "exit", "4"], stderr=subprocess.PIPE, text=True)
    try:
        assert "waiting" in waiter.stderr.readline()
        r = looplock("-p", "coalesce", "--operation", "tick", loop_dir, "--", HELPER, "exit", "5")
        assert r.returncode == 0 and "noop-coalesced: " in r.stderr, r.stderr
        assert "already waits to run tick" in r.stderr
    finally:
        holder.release()
    assert waiter.wait(timeout=TIMEOUT) == 4  # the waiter ran; the absorbed tick did not


def test_the_holder_record_lives_beside_the_lock_file(loop_dir):
    assert looplock("--agent", "ci", "--operation", "tick", loop_dir, "--", HELPER, "exit", "0").returncode == 0
    assert (loop_dir / ".state.lock").stat().st_size == 0  # no data under a lock other handles are denied
    record = json.loads((loop_dir / ".state.lock.holder").read_text())
    assert record["agent_id"] == "ci" and record["operation"] == "tick" and record["released_at"]
    r = looplock("--inspect", "--json", loop_dir)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["record"]["holder"]["operation"] == "tick" and report["record"]["status"] == "released"


def test_arguments_reach_the_command_as_given(loop_dir):
    args = ["plain", "with space", "", 'say "hi"', "trailing\\", "a\\\\\"b", "caf\u00e9 \u65e5\u672c"]
    r = looplock(loop_dir, "--", HELPER, "args", *args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"<{a}>" for a in args]


def test_the_shell_form_runs_through_comspec(loop_dir):
    r = looplock(loop_dir, "-c", 'echo "a b" & exit 5')
    assert r.returncode == 5
    assert r.stdout.strip() == '"a b"'


def test_max_time_ends_the_whole_tree(loop_dir, tmp_path):
    pids = tmp_path / "pids"
    start = time.monotonic()
    r = looplock("--max-time", "2s", loop_dir, "--", HELPER, "tree", win(pids), "60")
    assert r.returncode == 124, r.stderr
    assert 1.5 <= time.monotonic() - start < 60
    parent, child = pids.read_text().split()
    assert wait_for(lambda: not alive(parent) and not alive(child))
    rows = [json.loads(line) for line in (loop_dir / ".state.lock.incidents.jsonl").read_text().splitlines()]
    assert [row["error_code"] for row in rows] == ["max_time_exceeded"]
    assert not busy(loop_dir / ".state.lock")


def test_a_killed_looplock_leaves_no_process_and_the_lock_free(loop_dir, tmp_path):
    pids = tmp_path / "pids"
    proc = subprocess.Popen([WINE, EXE, str(loop_dir), "--", HELPER, "tree", win(pids), "60"])
    try:
        assert wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2)
        parent, child = pids.read_text().split()
        assert alive(parent) and alive(child)
        assert busy(loop_dir / ".state.lock")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=TIMEOUT)
        assert wait_for(lambda: not alive(parent) and not alive(child))
        assert wait_for(lambda: not busy(loop_dir / ".state.lock"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)


@pytest.mark.parametrize("args,word", [(["-F"], "-F/--no-fork"), (["--warn-before", "1s", "--max-time", "5s"], "--warn-before"),
                                       (["--warn-signal", "USR1"], "--warn-signal"),
                                       (["--etcd", "http://127.0.0.1:2379"], "--etcd"),
                                       (["--notify", "echo"], "--notify"), (["--holders", "3"], "--holders")])
def test_what_windows_cannot_do_is_a_usage_error_with_a_hint(loop_dir, args, word):
    r = looplock(*args, loop_dir, "--", HELPER, "exit", "0")
    assert r.returncode == 64
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"looplock: {word} is not available on this system"), r.stderr
    assert len(lines) == 2  # the hint
    assert not (loop_dir / ".state.lock").exists()


@pytest.mark.parametrize("args,word", [(["--hold", "--max-time", "5m"], "--hold"),
                                       (["--hold", "--max-time", "5m", "--tied-to", "4"], "--hold"),
                                       (["--release", "--force", "DIR"], "--release"),
                                       (["--release"], "--release")])
def test_a_hold_across_steps_is_a_usage_error_with_a_hint(loop_dir, args, word):
    # --release alone: no value, no LOOPLOCK_HOLD (wine passes the Linux environment on).
    os.environ.pop("LOOPLOCK_HOLD", None)
    r = looplock(*[win(loop_dir) if a == "DIR" else a for a in args]) if args[0] == "--release" else \
        looplock(*args, loop_dir)
    assert r.returncode == 64
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"looplock: {word} is not available on this system"), r.stderr
    assert len(lines) == 2  # the hint
    assert "--force" not in r.stderr  # never a hint to what it refuses too
    assert not (loop_dir / ".state.lock").exists()


def test_the_command_never_gets_the_lock(loop_dir):
    r = looplock(loop_dir, "--", "cmd", "/c", "set LOOPLOCK")
    assert "LOOPLOCK_FD=" not in r.stdout and "LOOPLOCK_DIR=" in r.stdout


def test_a_held_lock_file_cannot_be_deleted(loop_dir):
    lock = loop_dir / ".state.lock"
    assert looplock(loop_dir, "--", HELPER, "delete", win(lock)).returncode == 1
    assert lock.exists()
    # The control: once looplock has let go, the same call deletes it.
    assert run(HELPER, "delete", win(lock)).returncode == 0
    assert not lock.exists()


ROOT = Path(__file__).resolve().parents[2]


def test_the_task_scheduler_example_ticks_once_per_slot(loop_dir):
    line = next(l for l in (ROOT / "examples" / "windows" / "schtasks.cmd").read_text().splitlines()
                if l.startswith("schtasks "))
    assert "/SC MINUTE /MO 5" in line
    task = line.split('/TR "', 1)[1].rsplit('"', 1)[0]
    program, rest = task.split(" ", 1)
    assert program == r"C:\Tools\looplock\looplock.exe"
    args = rest.replace(r"D:\loops\nightly", win(loop_dir)).split(" ")
    args = args[:args.index("--") + 1] + [HELPER, "args", "ticked"]
    first = looplock(*args)
    assert first.returncode == 0 and first.stdout == "<ticked>\n", first.stderr
    second = looplock(*args)  # the same slot: skipped, silently
    assert second.returncode == 0 and second.stdout == "" and second.stderr == ""


def test_the_github_actions_example_runs_both_calls_in_one_hold(loop_dir):
    import shlex
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load((ROOT / "examples" / "windows" / "github-actions.yml").read_text())["jobs"]["tick"]
    assert job["defaults"]["run"]["shell"] == "pwsh"
    step = next(s for s in job["steps"] if s.get("name", "").startswith("Approve"))
    call, passes_on = step["run"].strip().splitlines()
    assert passes_on.strip() == "exit $LASTEXITCODE"
    lex = shlex.shlex(call.replace("${{ github.run_id }}", "4242"), posix=True)
    lex.whitespace_split, lex.escape = True, ""
    words = list(lex)
    assert words[:2] == ["&", r"C:\Tools\looplock\looplock.exe"]
    script = r"py -3 scripts\status.py"
    args = [win(loop_dir) if w == r"D:\loops\nightly" else w.replace(script, f'"{win(HELPER)}" args') for w in words[2:]]
    r = looplock(*args)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["<--approve>", "<--loop>", "<nightly>", "<--tick>"]
    record = json.loads((loop_dir / ".state.lock.holder").read_text())
    assert record["agent_id"] == "gha-4242" and record["operation"] == "approve-and-tick"


def test_the_windows_zip_has_the_program_the_man_pages_and_the_examples(tmp_path):
    out = tmp_path / "looplock.zip"
    r = subprocess.run([str(ROOT / "scripts" / "windows-zip"), str(out)], env={**os.environ, "LOOPLOCK_EXE": EXE},
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    import zipfile
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert {"looplock/looplock.exe", "looplock/looplock.txt", "looplock/looplock-windows.txt",
                "looplock/README.md", "looplock/examples/github-actions.yml",
                "looplock/examples/schtasks.cmd"} <= names
        text = z.read("looplock/looplock.txt").decode()
        assert "\r\n" in text and "looplock-windows(7)" in text and "\b" not in text
        text = z.read("looplock/looplock-windows.txt").decode()
        assert "\r\n" in text and "WHAT DIFFERS, OPTION BY OPTION" in text and "\b" not in text
        assert z.read("looplock/looplock.exe") == Path(EXE).read_bytes()


def inspect_json(loop_dir):
    r = looplock("--inspect", "--json", loop_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_inspect_tests_the_lock_by_taking_it(loop_dir):
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0
    report = inspect_json(loop_dir)
    assert report["kernel"] == {"held": False, "unknown": None, "mode": None, "holder_pids": [], "fd_holder_pids": [],
                                "tested_by_taking": True}
    text = looplock("--inspect", loop_dir).stdout
    assert "kernel    free (tested by taking it" in text and "waiting   unknown" in text
    assert "action    none: the lock is free" in text

    # Held by the scripts' own helper: held, with no record of it.
    holder = Holder(loop_dir / ".state.lock")
    try:
        report = inspect_json(loop_dir)
        assert report["kernel"]["held"] is True and report["kernel"]["mode"] == "exclusive"
        assert report["record"]["status"] == "released" and report["waiters"] is None
        assert "handle.exe" in report["operator_action"] and "fuser" not in report["operator_action"]
        assert any("without a current holder record" in w for w in report["warnings"])
        assert looplock("--inspect", "--check", loop_dir).returncode == 1  # as on Linux
    finally:
        holder.release()

    # Held by looplock.exe's job: its record names it, alive.
    other = loop_dir / "job.lock"
    job = subprocess.Popen([WINE, EXE, "--operation", "tick", str(loop_dir), "--", HELPER, "lock", win(other)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "locked"
        report = inspect_json(loop_dir)
        assert report["kernel"]["held"] is True
        assert report["record"]["holder"]["operation"] == "tick" and report["record"]["pid_alive"] is True
        assert report["record"]["same_process"] is True and report["record"]["status"] == "current"
        assert report["warnings"] == []
        # A run that finds it held names that holder in its row, as on Linux.
        assert looplock("-w", "0.5", loop_dir, "--", HELPER, "exit", "0").returncode == 75
        row = json.loads((loop_dir / ".state.lock.incidents.jsonl").read_text().splitlines()[-1])
        assert row["holder"]["operation"] == "tick" and row["holder_alive"] is True
        assert row["record_status"] == "current"
        # The lock is free again once the test is over: inspect took and let go.
        assert busy(loop_dir / ".state.lock")
    finally:
        job.stdin.close()
        assert job.wait(timeout=TIMEOUT) == 0
    assert inspect_json(loop_dir)["kernel"]["held"] is False


def test_a_looplock_inside_the_job_runs_inside_its_hold(loop_dir):
    # Directly, and below a cmd.exe: an ancestor that holds the lock, named by
    # its record with its creation time.
    r = looplock(loop_dir, "--", EXE, "-v", "-n", win(loop_dir), "--", HELPER, "exit", "5")
    assert r.returncode == 5 and "(an ancestor); running inside its critical section" in r.stderr, r.stderr
    r = looplock(loop_dir, "-c", f'"{win(EXE)}" -v -n "{win(loop_dir)}" -- "{win(HELPER)}" exit 6')
    assert r.returncode == 6 and "an ancestor" in r.stderr, r.stderr


def test_a_copied_environment_never_bypasses_the_lock(loop_dir):
    other = loop_dir / "job.lock"
    job = subprocess.Popen([WINE, EXE, str(loop_dir), "--", HELPER, "lock", win(other)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "locked"
        record = json.loads((loop_dir / ".state.lock.holder").read_text())
        # Everything the job's environment says, but from outside the job.
        env = {**os.environ, "LOOPLOCK_HOLDER_PID": str(record["pid"]), "LOOPLOCK_HOLDER_FD": "4",
               "LOOPLOCK_LOCK_ID": record["lock_id"], "LOOPLOCK_DIR": win(loop_dir)}
        r = looplock("-n", loop_dir, "--", HELPER, "exit", "0", env=env)
        assert r.returncode == 75, r.stderr
    finally:
        job.stdin.close()
        assert job.wait(timeout=TIMEOUT) == 0


def runs_total(metrics_dir, outcome):
    parser = pytest.importorskip("prometheus_client.parser")
    (prom,) = metrics_dir.glob("looplock_*.prom")
    for family in parser.text_string_to_metric_families(prom.read_text()):
        for sample in family.samples:
            if sample.name == "looplock_runs_total" and sample.labels["outcome"] == outcome:
                return sample.value, sample.labels
    return None, None


def test_the_metrics_file_counts_every_run_and_waits_out_a_reader(loop_dir, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for _ in range(3):
        r = looplock("--metrics-dir", metrics, loop_dir, "--", HELPER, "exit", "0")
        assert r.returncode == 0 and r.stderr == "", r.stderr
    value, labels = runs_total(metrics, "success")
    assert value == 3 and labels["loop"] == "loop"
    (prom,) = metrics.glob("looplock_*.prom")

    def reader():
        """A reader that does not share delete (a scraper, a scanner)."""
        p = subprocess.Popen([WINE, HELPER, "hold", win(prom)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout.readline().strip() == "open"
        return p

    # Let go while looplock tries to replace the file (its new file is
    # written, waiting beside it): the rename then succeeds.
    held = reader()
    run = subprocess.Popen([WINE, EXE, "--metrics-dir", str(metrics), str(loop_dir), "--", HELPER, "exit", "0"],
                           stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: list(metrics.glob(".looplock_*.prom.*.tmp")), 60)
    finally:
        held.stdin.close()
        assert held.wait(timeout=TIMEOUT) == 0
    assert run.wait(timeout=TIMEOUT) == 0
    assert run.stderr.read() == ""
    assert runs_total(metrics, "success")[0] == 4
    # The control: a reader that holds it past the retries costs one warning,
    # never the run's status; the next run counts on.
    held = reader()
    try:
        r = looplock("--metrics-dir", metrics, loop_dir, "--", HELPER, "exit", "0")
    finally:
        held.stdin.close()
        assert held.wait(timeout=TIMEOUT) == 0
    assert r.returncode == 0 and "cannot update the metrics" in r.stderr and "chmod" not in r.stderr, r.stderr
    assert looplock("--metrics-dir", metrics, loop_dir, "--", HELPER, "exit", "0").returncode == 0
    assert runs_total(metrics, "success")[0] == 5  # the run whose update failed is not counted: as on Linux


def test_the_lock_id_is_the_same_however_dir_is_spelled(loop_dir):
    spellings = [str(loop_dir), win(loop_dir), win(loop_dir).upper(), win(loop_dir).lower() + "\\",
                 "\\\\?\\" + win(loop_dir), win(loop_dir).replace("\\", "/")]
    ids = {inspect_json(d)["lock_id"] for d in spellings}
    assert len(ids) == 1, spellings
    r = looplock(win(loop_dir).upper(), "--", "cmd", "/c", "echo %LOOPLOCK_DIR%")
    assert r.stdout.strip() == win(loop_dir)  # the canonical spelling, as the file system has it


def test_a_dir_named_with_a_trailing_separator_locks(loop_dir):
    for spelling in (str(loop_dir) + "/", win(loop_dir) + "\\", win(loop_dir) + "\\\\"):
        r = looplock(spelling, "--", HELPER, "exit", "3")
        assert r.returncode == 3 and r.stderr == "", (spelling, r.stderr)


def test_a_dir_given_as_a_drive_alone_is_that_drives_current_directory(loop_dir):
    r""""Z:" is drive Z's current directory, as "Z:." is: its lock file is
    Z:.state.lock, never Z:\.state.lock (the drive's root)."""
    r = looplock("Z:", "--", "cmd", "/c", "echo %LOOPLOCK_DIR%", cwd=loop_dir)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == win(loop_dir)
    assert json.loads((loop_dir / ".state.lock.holder").read_text())["released_at"]
    r = looplock("--inspect", "--json", "Z:", cwd=loop_dir)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["lock_file"] == "Z:.state.lock"
    assert report["lock_id"] == inspect_json(loop_dir)["lock_id"]


def deep_dir(tmp_path, length):
    """A directory under TMP_PATH whose Windows path (win()) is LENGTH
    characters long, made of parts of at most 100."""
    d = tmp_path / f"len{length}"
    while length - len(win(d)) > 101:
        d = d / ("d" * 50)
    d = d / ("d" * (length - len(win(d)) - 1))
    assert len(win(d)) == length, win(d)
    d.mkdir(parents=True)
    return d


@pytest.mark.parametrize("length", [263, 264, 300])
def test_a_dir_with_a_long_path_locks(tmp_path, length):
    r"""Past MAX_PATH (260) a path goes to the system with the \\?\ prefix; the
    path the system gives DIR (LOOPLOCK_DIR, lock_id) is read whole."""
    d = deep_dir(tmp_path, length)
    r = looplock(win(d), "--", "cmd", "/c", "echo %LOOPLOCK_DIR%")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == win(d)
    assert json.loads((d / ".state.lock.holder").read_text())["released_at"]
    assert inspect_json(win(d))["lock_id"] == inspect_json("\\\\?\\" + win(d))["lock_id"]


def test_a_holder_record_that_is_a_directory_is_refused_and_inspect_says_so(loop_dir):
    """As a record file with two names: every run refuses it (73) before the
    command runs, as --inspect says."""
    (loop_dir / ".state.lock.holder").mkdir()
    r = looplock(loop_dir, "--", HELPER, "args", "ran")
    assert r.returncode == 73 and r.stdout == "", r
    assert ".state.lock.holder beside it: it is a directory, not a regular file" in r.stderr, r.stderr
    r = looplock("--log-format", "json", loop_dir, "--", HELPER, "args", "ran")
    assert r.returncode == 73 and json.loads(r.stderr.splitlines()[0])["event"] == "unsafe_lock_file", r.stderr
    r = looplock("--inspect", "--check", loop_dir)
    assert r.returncode == 1 and "every run refuses this lock file (exit 73)" in r.stdout, r.stdout
    (loop_dir / ".state.lock.holder").rmdir()
    assert looplock(loop_dir, "--", HELPER, "args", "ran").stdout == "<ran>\n"  # the control


@contextlib.contextmanager
def full_file_system(path):
    """PATH, a directory, as a small tmpfs filled up (mount(8): root only)."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {r.stderr.strip()}")
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={path / 'fill'}", "bs=4k"], capture_output=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def test_a_full_disk_leaves_no_temporary_metrics_file(loop_dir, tmp_path):
    with full_file_system(tmp_path / "metrics") as metrics:
        for _ in range(2):
            r = looplock("--metrics-dir", metrics, loop_dir, "--", HELPER, "exit", "0")
            assert r.returncode == 0, r.stderr
            assert "cannot update the metrics: cannot write " in r.stderr and "No space left" in r.stderr, r.stderr
            assert not list(metrics.glob("*.tmp")), list(metrics.iterdir())
        if LINUX:  # the control: the Linux build's update leaves none either
            linux_loop = tmp_path / "linux"
            linux_loop.mkdir()
            r = subprocess.run([LINUX, "--metrics-dir", metrics, linux_loop, "--", "true"], capture_output=True,
                               text=True, timeout=TIMEOUT)
            assert r.returncode == 0 and "No space left" in r.stderr, r.stderr
            assert not list(metrics.glob("*.tmp"))


def test_inspect_of_a_missing_lock_file_names_no_waiter_it_cannot_know(loop_dir):
    """Windows lists no lock holders or waiters: a missing lock file is free
    (nothing holds a file that is not there), but its waiters are unknown."""
    report = inspect_json(loop_dir)
    assert report["exists"] is False and report["kernel"]["held"] is False
    assert report["waiters"] is None
    text = looplock("--inspect", loop_dir).stdout
    assert "waiting   unknown" in text, text
    assert "kernel    free\n" not in text and "the system names no holder or waiter" in text, text


def test_the_holder_record_cannot_be_deleted_while_held(loop_dir):
    record = loop_dir / ".state.lock.holder"
    assert looplock(loop_dir, "--", HELPER, "delete", win(record)).returncode == 1
    assert record.exists()
    assert run(HELPER, "delete", win(record)).returncode == 0  # the control, once released


def test_a_record_copied_from_another_loop_never_nests(loop_dir, tmp_path):
    """The outer looplock.exe holds loop2; inside its job, a looplock.exe on
    loop (held by the scripts' helper) finds loop's record rewritten to name
    the outer one, with its creation time and loop's own lock_id: a live
    ancestor, but the lock it holds is loop2's (its LOOPLOCK_LOCK_ID)."""
    loop2 = tmp_path / "loop2"
    loop2.mkdir()
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0
    lock_id = json.loads((loop_dir / ".state.lock.holder").read_text())["lock_id"]
    holder = Holder(loop_dir / ".state.lock")
    try:
        inner = f'"{win(EXE)}" -n "{win(loop_dir)}" -- "{win(HELPER)}" exit 0'
        job = subprocess.Popen(
            [WINE, EXE, str(loop2), "-c", f'"{win(HELPER)}" lock "{win(tmp_path / "job.lock")}" & {inner}'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert job.stdout.readline().strip() == "locked"
        outer = json.loads((loop2 / ".state.lock.holder").read_text())
        forged = {k: v for k, v in outer.items() if k != "check"}
        forged["lock_id"] = lock_id
        (loop_dir / ".state.lock.holder").write_text(json.dumps(forged) + "\n")
        job.stdin.close()  # the job goes on to the inner looplock.exe
        assert job.wait(timeout=TIMEOUT) == 75, job.stderr.read()
    finally:
        holder.release()


def test_operations_are_named_as_on_linux(loop_dir):
    def operation():
        return json.loads((loop_dir / ".state.lock.holder").read_text())["operation"]
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0
    assert operation() == "winhelper"  # without ".exe"
    assert looplock(loop_dir, "-c", "exit 0").returncode == 0
    assert operation() == "cmd"  # -c runs cmd.exe
    assert looplock(loop_dir, "--", "python.exe", r"Z:\x\status.py", "--tick").returncode == 127
    assert operation() == "status.py"  # the script, never a path
    # Names there are case-insensitive: one operation however it is spelled.
    assert looplock(loop_dir, "--", "Python.EXE", r"Z:\x\Status.PY").returncode == 127
    assert operation() == "status.py"
    assert looplock(loop_dir, "--", "WINHELPER.exe", "exit", "0").returncode in (0, 127)
    assert operation() == "winhelper"
    assert looplock(loop_dir, "--operation", "Tick", "--", HELPER, "exit", "0").returncode == 0
    assert operation() == "Tick"  # an explicit one is kept as given


def test_a_hint_names_dir_so_that_it_pastes_into_cmd(tmp_path):
    loop = tmp_path / "with space"
    loop.mkdir()
    holder = Holder(loop / ".state.lock")
    try:
        r = looplock("-n", win(loop), "--", HELPER, "exit", "0")
    finally:
        holder.release()
    assert r.returncode == 75
    assert f'Run \'looplock --inspect "{win(loop)}"\' to see the holder' in r.stderr, r.stderr
    assert f"{win(loop)}\\.state.lock still held" in r.stderr  # Windows' separator


def test_a_directory_is_no_program(loop_dir):
    r = looplock(loop_dir, "--", win(loop_dir))
    assert r.returncode == 126, r.stderr
    assert "chmod" not in r.stderr


def test_version_says_etcd_is_not_available_here():
    r = looplock("--version")
    assert r.returncode == 0
    assert "not available on this system" in r.stdout and "install" not in r.stdout.split("etcd", 1)[1]


def test_inspect_check_does_not_judge_windows_files_by_posix_modes(loop_dir, tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    assert looplock("--metrics-dir", metrics, loop_dir, "--", HELPER, "exit", "0").returncode == 0
    r = looplock("--inspect", "--check", "--metrics-dir", metrics, loop_dir)
    assert r.returncode == 0, r.stdout
    assert "umask" not in r.stdout and "chmod" not in r.stdout


LINUX = os.environ.get("LOOPLOCK_LINUX", "")


def normalized(text, loop_dir):
    """A run's stderr with what differs by nature taken out: the DIR as
    spelled, the separator of a file in it, pids, durations, and the holder
    the system cannot name on Windows (the WINDOWS section's list)."""
    for spelling in (win(loop_dir), str(loop_dir)):
        text = text.replace(spelling + "\\", "DIR/").replace(spelling, "DIR")
    text = re.sub(r"by pid \d+ \(\w+\): no looplock record", "by HOLDER", text)
    text = text.replace("by another process (the kernel does not say which)", "by HOLDER")
    text = re.sub(r"\d+(\.\d+)?(ms|s)\b", "T", text)
    return re.sub(r"\bpid \d+", "pid N", text)


def log_facts(stderr, loop_dir):
    """Text lines normalized; JSON lines as their level, event, normalized
    message and hint, and keys (holder_pids and warnings say what Windows
    cannot tell, ts, pid and lock_id what differs by nature)."""
    facts = []
    for line in stderr.splitlines():
        if not line.startswith("{"):
            facts.append(normalized(line, loop_dir))
            continue
        obj = json.loads(line)
        keys = sorted(set(obj) - {"holder_pids", "warnings"})
        facts.append((obj["level"], obj["event"], normalized(obj["message"], loop_dir),
                      normalized(obj.get("hint", ""), loop_dir), keys))
    return facts


def row_facts(loop_dir):
    rows = loop_dir / ".state.lock.incidents.jsonl"
    if not rows.exists():
        return None
    row = json.loads(rows.read_text().splitlines()[-1])
    keep = ("error_code", "policy", "deadline_ms", "holder_alive", "record_status", "killed")
    facts = {k: row.get(k) for k in keep}
    holder = row.get("holder")  # the run's own record when it ran: its pid, start, times are its own
    facts["holder"] = {k: holder[k] for k in ("agent_id", "operation", "policy")} if holder else holder
    facts["waiter"] = {k: row["waiter"][k] for k in ("agent_id", "operation")} if "waiter" in row else None
    facts["has_warnings"] = bool(row.get("warnings"))
    facts["keys"] = sorted(set(row) - {"holder_pids", "warnings", "ran_ms", "ran_after_term_ms"})
    return facts


# (options, held by another tool, Linux command, Windows command)
SCENARIOS = [
    (["-w", "1"], True, ["true"], [HELPER, "exit", "0"]),
    (["-p", "monitor"], True, ["true"], [HELPER, "exit", "0"]),
    (["-p", "single_flight"], True, ["true"], [HELPER, "exit", "0"]),
    (["-p", "single_flight", "--skip-exit-code", "5"], True, ["true"], [HELPER, "exit", "0"]),
    (["-n", "-E", "9"], True, ["true"], [HELPER, "exit", "0"]),
    (["-p", "blocking"], False, ["sh", "-c", "exit 3"], [HELPER, "exit", "3"]),
    (["--max-time", "1s"], False, ["sleep", "30"], [HELPER, "sleep", "30"]),
    (["--log-format", "json", "-w", "0.5"], True, ["true"], [HELPER, "exit", "0"]),
    (["-p", "coalesce", "-w", "0.5"], True, ["true"], [HELPER, "exit", "0"]),
]


@contextlib.contextmanager
def held_by_another_tool(system, loop, held):
    """The lock of LOOP held, while the block runs, by the tool each system's
    scripts use: flock(1) on Linux, the C runtime's _locking on Windows."""
    if not held:
        yield
        return
    if system == "windows":
        holder = Holder(loop / ".state.lock")
        try:
            yield
        finally:
            holder.release()
        return
    (loop / ".state.lock").touch()
    holder = subprocess.Popen(["flock", str(loop / ".state.lock"), "sh", "-c", "echo locked; exec cat"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)


def run_on(system, *args):
    """looplock ARGS on the Linux build or looplock.exe under wine."""
    if system == "windows":
        return looplock(*args)
    return subprocess.run([LINUX, *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.skipif(not LINUX, reason="needs the Linux build ($LOOPLOCK_LINUX, the default stage's)")
@pytest.mark.parametrize("options,held,linux_cmd,windows_cmd", SCENARIOS)
def test_every_policy_ends_as_the_linux_build_does(tmp_path, options, held, linux_cmd, windows_cmd):
    results = []
    for system, command in (("linux", linux_cmd), ("windows", windows_cmd)):
        loop = tmp_path / system / "loop"
        loop.mkdir(parents=True)
        with held_by_another_tool(system, loop, held):
            r = run_on(system, "--agent", "a", "--operation", "op", *options, loop, "--", *command)
        results.append((r.returncode, log_facts(r.stderr, loop), row_facts(loop)))
    linux, windows = results
    assert windows == linux


@pytest.mark.skipif(not LINUX, reason="needs the Linux build ($LOOPLOCK_LINUX, the default stage's)")
@pytest.mark.parametrize("held", [False, True])
def test_inspect_reports_as_the_linux_build_does(tmp_path, held):
    reports = []
    for system, command in (("linux", ["true"]), ("windows", [HELPER, "exit", "0"])):
        loop = tmp_path / system / "loop"
        loop.mkdir(parents=True)
        assert run_on(system, loop, "--", *command).returncode == 0
        with held_by_another_tool(system, loop, held):
            r = run_on(system, "--inspect", "--json", loop)
        j = json.loads(r.stdout)
        reports.append({"status": r.returncode, "keys": sorted(j), "held": j["kernel"]["held"],
                        "mode": j["kernel"]["mode"], "record": j["record"]["status"], "warnings": len(j["warnings"]),
                        "free": j["operator_action"] == "none: the lock is free"})
    linux, windows = reports
    assert windows == linux


def test_a_lock_file_another_user_owns_is_refused(loop_dir):
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0
    lock = loop_dir / ".state.lock"
    os.chown(lock, 4242, 4242)  # wine shows a file of another Unix user as another SID's
    try:
        r = looplock(loop_dir, "--", HELPER, "exit", "0")
        assert r.returncode == 73, r.stderr
        assert "neither you nor DIR's owner" in r.stderr and "takeown /f" in r.stderr and "install" not in r.stderr
    finally:
        os.chown(lock, os.getuid(), os.getgid())
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0  # the control


def test_a_record_file_with_two_names_is_refused_and_inspect_says_so(loop_dir, tmp_path):
    assert looplock(loop_dir, "--", HELPER, "exit", "0").returncode == 0
    os.link(loop_dir / ".state.lock.holder", tmp_path / "other-name")
    r = looplock(loop_dir, "--", HELPER, "exit", "0")
    assert r.returncode == 73 and ".state.lock.holder beside it: it has 2 hard links" in r.stderr, r.stderr
    r = looplock("--inspect", "--check", loop_dir)
    assert r.returncode == 1 and "every run exits 73" in r.stdout, r.stdout
    os.unlink(tmp_path / "other-name")
    assert looplock("--inspect", "--check", loop_dir).returncode == 0  # the control


# How long one console run may take: a job's ctrlc sleeps 20 s when no
# Ctrl-C ends it, so a run still going well past that is stuck.
CONSOLE_BOUND = 35
CONSOLE_TRIES = 3


def session_processes(sid):
    """pid: (state, threads) of every process of session SID."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp session ...
            if int(fields[3]) == sid:
                threads = re.search(r"^Threads:\s*(\d+)", (entry / "status").read_text(), re.M)
                found[int(entry.name)] = (fields[0], int(threads.group(1)) if threads else 0)
        except (OSError, ValueError):
            continue
    return found


def in_console_once(args, bound):
    """One run under script(1); None when wine left a process stuck in its
    own exit (stopped, with all script(1) started)."""
    line = " ".join(shlex.quote(str(a)) for a in [WINE, *args])
    proc = subprocess.Popen(["script", "-qec", line, "/dev/null"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        # script(1) gives its child a session of its own: the wine process,
        # the processes it started, its conhost.exe.
        try:
            children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        except OSError:
            children = []
        stuck = {sid: session_processes(sid) for sid in children}
        for sid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(sid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=TIMEOUT)
        # wine's failure, not the test's: a process whose main thread has
        # exited (a zombie) while a thread of it never does.
        if any(state == "Z" and threads > 1 for procs in stuck.values() for state, threads in procs.values()):
            return None
        raise AssertionError(f"wine {line} did not end within {bound} s: {stuck}\n{out}")
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    r.seconds = time.monotonic() - start  # this run's, not the stopped ones'
    return r


def in_console(*args, bound=CONSOLE_BOUND):
    """Runs wine ARGS with a terminal (script(1)), so that it has a console
    whose Ctrl-C reaches every process attached to it.

    wine 8 can fail to end a process that a Ctrl-C ends: its main thread
    exits, and its last thread waits forever in NtTerminateProcess for a lock
    (a zombie whose threads never all exit), so script(1) waits forever. Such
    a run is stopped after BOUND seconds, with a warning that says so, and run
    again, up to CONSOLE_TRIES times; a run stuck any other way fails."""
    for attempt in range(1, CONSOLE_TRIES + 1):
        r = in_console_once(args, bound)
        if r is not None:
            return r
        warnings.warn(f"wine {' '.join(map(str, args))} under script(1): a wine process stuck in its own exit "
                      f"(a zombie with a thread left), killed after {bound} s; attempt {attempt} of {CONSOLE_TRIES}")
    raise AssertionError(f"wine {' '.join(map(str, args))} stuck in its own exit {CONSOLE_TRIES} times")


@pytest.mark.skipif(not shutil.which("script"), reason="needs script(1) for a console")
def test_ctrl_c_reaches_the_job_and_looplock_exits_as_it_did(loop_dir):
    # The control: a Windows parent without a handler dies of the console's
    # Ctrl-C with its child, before it can say how the child exited.
    control = in_console(HELPER, "run", HELPER, "ctrlc")
    assert "exit " not in control.stdout
    r = in_console(EXE, "-v", str(loop_dir), "--", HELPER, "ctrlc")
    assert r.seconds < 15  # the job ended by the Ctrl-C, not after its 20 s
    assert "released" in r.stdout and "the command exited with" in r.stdout, r.stdout
    assert not busy(loop_dir / ".state.lock")


def test_a_batch_file_runs_only_through_c(loop_dir, tmp_path):
    """cmd.exe reads a batch file's arguments by rules of its own: given
    after --, an argument could run a command ("BatBadBut")."""
    script = tmp_path / "tick.bat"
    script.write_text("@exit /b 7\r\n")
    r = looplock(loop_dir, "--", win(script), '"&echo pwned')
    assert r.returncode == 126 and "pwned" not in r.stdout and "batch file with -c" in r.stderr, r
    assert looplock(loop_dir, "-c", f'"{win(script)}"').returncode == 7


def test_a_program_named_with_a_path_is_found_from_the_working_directory(loop_dir, tmp_path):
    sub = tmp_path / "tools"
    sub.mkdir()
    (sub / "helper.exe").write_bytes(Path(HELPER).read_bytes())
    r = looplock(loop_dir, "--", "tools\\helper", "exit", "7", cwd=tmp_path)
    assert r.returncode == 7, r.stderr
    assert looplock(loop_dir, "--", "tools\\missing", cwd=tmp_path).returncode == 127


# What wine does not do as Windows does: named, skipped tests, each with its
# reason; looplock-windows(7) says what looplock relies on.
WINE_CANNOT = {
    "windows_denies_a_locked_byte_to_other_handles":
        "byte-range locks are mandatory on Windows (no other handle reads byte 0); wine enforces none",
    "windows_releases_a_dead_holders_lock_late":
        "Windows may release a lock some time after its process exits; wine releases it at once",
    "the_scripts_blocking_helper_gives_up_after_about_10_s":
        "_locking(_LK_LOCK) retries 10 times 1 s apart on Windows (10 ms apart in wine)",
    "ctrl_break_reaches_the_job_and_looplock_exits_as_it_did":
        "CTRL_BREAK_EVENT to a process group is not implemented in wine",
    "a_dir_whose_name_ends_in_a_dot_or_a_space_locks":
        "wine drops a part's trailing dot or space from the path it gives an open directory "
        "(GetFinalPathNameByHandleW), where Windows keeps them; looplock.exe reaches DIR's files by that path, "
        "in \\\\?\\ form, which Windows takes as it is",
}


@pytest.mark.parametrize("name", list(WINE_CANNOT))
def test_what_wine_cannot_check(name):
    pytest.skip(f"wine does not do what Windows does here: {WINE_CANNOT[name]}")
