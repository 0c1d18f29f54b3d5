"""Command-line behaviour: help, version, usage errors (exit 64), option
values, and the rule that the command's own arguments are never parsed."""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import EX_TEMPFAIL, EX_USAGE, LOOPLOCK, ROOT, TIMEOUT, incident_rows, read_record, run

# The exact --help text (help_text() in src/cli/options.cpp, its options from the
# table in src/cli/option_table.cpp). A change to the help must be made in both
# places on purpose.
HELP = """\
Usage: looplock [OPTIONS] DIR -- COMMAND [ARG]...
       looplock [OPTIONS] DIR -c SHELL-COMMAND
       looplock --hold --max-time DURATION [--tied-to PID] [OPTIONS] DIR
       looplock --release [VALUE]    looplock --release --force DIR
       looplock --inspect [--json] [--check] [--stale-after DURATION] DIR...

Run COMMAND while holding the advisory lock on DIR/.state.lock (flock(2)),
then exit exactly as COMMAND exited.

Policy:
  -p, --policy NAME           mutation (wait 5 s, default), monitor (1 s),
                              single_flight (no wait: skip, exit 0),
                              blocking (wait without limit),
                              coalesce (one waiter per --operation; later
                              ticks join it and skip, exit 0)
  -w, --timeout DURATION      deadline for mutation/monitor/coalesce
                              (0: one attempt)
  -n, --nonblock              one attempt: -w 0 (as flock -n)
  -E, --conflict-exit-code N  status when the deadline passes (default 75)
      --skip-exit-code N      status of a skip (single_flight, coalesce;
                              default 0)
Lock and command:
  -s, --shared                take a shared (reader) lock
  -x, --exclusive             take an exclusive lock (the default)
      --holders N             let up to N runs (2-1024) hold the lock at
                              once, each with $LOOPLOCK_HOLDER_INDEX
  -o, --close                 do not pass the lock fd to COMMAND
  -F, --no-fork               exec COMMAND in place of looplock
      --kill-after DURATION   send KILL to the job if a forwarded TERM/INT
                              has not ended it within DURATION (0: never)
      --max-time DURATION     end the job once it has run this long: TERM,
                              KILL --kill-after later (default 5s); exit 124
      --agent ID              who runs it (default $LOOPLOCK_AGENT or user)
      --operation NAME        what runs (default: the command or script name)
      --warn-before DURATION  signal the job DURATION before --max-time's TERM
                              (or a failing lease's)
      --warn-signal SIG       the signal of --warn-before (default USR1)
Schedule:
      --once-per DURATION     run at most once per DURATION (a run ledger;
                              skip, exit 0, when the slot's run is done)
      --jitter DURATION       wait a random time below DURATION first
Hold across steps:
      --hold                  take DIR's lock in a detached holder and print
                              LOOPLOCK_HOLD=VALUE once held (no COMMAND;
                              needs --max-time)
      --tied-to PID           with --hold: end the hold when PID exits
      --release               end the hold $LOOPLOCK_HOLD (or the VALUE
                              given) names: looplock --release [VALUE]
      --force                 with --release, and DIR: end DIR's hold once
                              the kernel confirms its holder
Output:
  -v, --verbose               report waiting, acquiring and releasing
  -q, --quiet                 errors only (a single_flight skip is silent)
      --log-format FORMAT     stderr lines as text (default) or json
      --metrics-dir DIR       write a node_exporter textfile per lock there
                              (default $LOOPLOCK_METRICS_DIR)
      --notify COMMAND        run COMMAND (sh -c) for each event, its JSON
                              on stdin, $LOOPLOCK_EVENT its name
      --notify-on LIST        the events to notify (default: warnings,
                              errors and held_too_long; all: every one)
      --notify-timeout DURATION  KILL a notifier after DURATION (default 10s)
      --notify-after DURATION  held_too_long once the job has run DURATION
Inspect:
      --inspect               report who holds and who waits for each DIR's
                              lock; change nothing
      --json                  print the reports as JSON (an array for several)
      --check                 exit 1 when a report carries a warning
      --stale-after DURATION  warn about holds older than this (default 2h)
      --incidents N           show the newest N incident rows (default 1)
Cluster:
      --etcd ENDPOINTS        also lock across hosts on etcd (comma-separated
                              http[s]://HOST:PORT; default $LOOPLOCK_ETCD)
      --lock-name NAME        cluster lock name (default: DIR's base name)
      --ttl SECONDS           etcd lease time to live (default 10, >= 2)
      --etcd-cacert FILE      CA of etcd's certificates (https:// endpoints)
      --etcd-cert FILE        client certificate for etcd (with --etcd-key)
      --etcd-key FILE         the client certificate's private key
      --etcd-user NAME        etcd user; the password is in
                              $LOOPLOCK_ETCD_PASSWORD or --etcd-password-file
      --etcd-password-file FILE  file holding the etcd user's password
Other:
      --completions SHELL     print the completion script for SHELL (bash,
                              zsh or fish)
  -h, --help                  show this help
  -V, --version               show the version

Examples:
  looplock /srv/loops/nightly -- python3 scripts/status.py --tick
  looplock -p single_flight /srv/loops/nightly -- ./monitor.sh
  looplock --once-per 4m --operation tick /srv/loops/nightly -- ./tick.py
  looplock -w 30 /srv/loops/nightly -c 'status.py --approve && status.py --tick'

Exit status: COMMAND's own; 75 deadline passed; 124 --max-time passed;
64 usage; 66 no DIR; 73 unsafe lock file; 74 DIR vanished mid-lock;
71 OS error; 126/127 exec; 69 etcd unreachable; 76 etcd lease lost;
--release: 0 released; 124/76 it had ended so; 1 no such hold.
"""


# --- help and version ------------------------------------------------------

@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_text_exact(flag):
    r = run([flag])
    assert r.returncode == 0
    assert r.stdout == HELP
    assert r.stderr == ""


def test_help_wins_over_a_run(loop_dir):
    marker = loop_dir / "ran"
    r = run(["--help", loop_dir, "--", "touch", marker])
    assert r.returncode == 0
    assert r.stdout == HELP
    assert not marker.exists()


HELPER_DIR = os.environ.get("LOOPLOCK_HELPER_DIR", "/usr/local/libexec/looplock")
VERSION_LINES = ["looplock ", "commit: ", "linked: ", "--etcd: "]


def version_of(binary):
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert [line[:len(k)] for line, k in zip(lines, VERSION_LINES)] == VERSION_LINES and len(lines) == 4, r.stdout
    return {k.rstrip(": "): line[len(k):] for line, k in zip(lines, VERSION_LINES)}


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    """Line 1 is "looplock VERSION" (scripts read it); then the commit, the
    linking and what --etcd would run, one per line."""
    r = run([flag])
    assert r.returncode == 0 and r.stderr == ""
    assert re.fullmatch(r"looplock \d+\.\d+\.\d+\ncommit: .+\nlinked: .+\n--etcd: .+\n", r.stdout), r.stdout
    assert version_of(LOOPLOCK)["looplock"] == r.stdout.splitlines()[0].split()[1]


def test_version_names_the_commit_built_from():
    commit = version_of(LOOPLOCK)["commit"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          timeout=TIMEOUT) if shutil.which("git") else None
    if head is None or head.returncode != 0:
        assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{12}", commit), commit
        return
    # The build may be older than the last commit, but it is one of the tree's.
    m = re.fullmatch(r"([0-9a-f]{12})(-dirty)?", commit)
    assert m, commit
    r = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-t", m.group(1)], capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.stdout.strip() == "commit", (commit, r.stderr)


def needed_libraries(binary):
    r = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    return re.findall(r"\(NEEDED\).*\[(.+)\]", r.stdout)


def test_version_says_how_it_is_linked():
    """The claim holds for the binary: "static" has no shared library,
    "static except libc" needs glibc's alone (libc, and the dynamic loader
    for the thread-local storage of the libstdc++ linked in)."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed (binutils)")
    linked = version_of(LOOPLOCK)["linked"]
    needed = needed_libraries(LOOPLOCK)
    if linked == "static":
        assert needed == []
    elif linked == "static except libc":
        assert "libc.so.6" in needed, needed
        assert [n for n in needed if not re.fullmatch(r"lib[cm]\.so\.6|ld-linux[\w.-]*\.so\.\d", n)] == [], needed
    else:
        assert linked.startswith("dynamic") and needed, (linked, needed)


def test_version_names_the_helper_etcd_would_run(tmp_path):
    """--etcd: the first looplock-etcd of the paths the hand-over tries
    (beside looplock, then LIBEXECDIR/looplock), or "not installed" with the
    paths and the package to install."""
    installed = Path(HELPER_DIR) / "looplock-etcd"
    beside = Path(LOOPLOCK).parent / "looplock-etcd"
    if beside.exists():
        assert version_of(LOOPLOCK)["--etcd"] == f"available, through {beside}"
    if installed.exists():
        pytest.skip(f"the installed {installed} would be found by a copy of looplock")
    alone = tmp_path / "looplock"
    shutil.copy(LOOPLOCK, alone)
    assert version_of(alone)["--etcd"] == (
        f"not available: looplock-etcd is not installed (looked for {tmp_path}/looplock-etcd, {installed}); "
        "install the looplock-etcd package")
    (tmp_path / "looplock-etcd").write_text("")  # there, but mode 0644
    assert version_of(alone)["--etcd"] == (
        f"not available: {tmp_path}/looplock-etcd cannot be executed (Permission denied)")


def test_helper_version_says_it_is_the_helper():
    helper = Path(os.environ.get("LOOPLOCK_ETCD_HELPER") or Path(LOOPLOCK).parent / "looplock-etcd")
    if not helper.exists():
        pytest.skip(f"no looplock-etcd in this build ({helper})")
    v, main = version_of(helper), version_of(LOOPLOCK)
    assert (v["looplock"], v["commit"]) == (main["looplock"], main["commit"])
    assert v["linked"] == "dynamic" and v["--etcd"] == "available, built in (this is looplock-etcd)"


def test_an_ordinary_run_does_not_look_for_the_helper(loop_dir, tmp_path):
    """Only --version (and --etcd) look for looplock-etcd: a run does not
    pay for it."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (scripts/packages.txt lists it)")
    trace = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=file", LOOPLOCK, str(loop_dir), "--",
                        "true"], capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0 and not trace.exists():
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert "looplock-etcd" not in trace.read_text()
    r = subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=file", LOOPLOCK, "--version"],
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and "looplock-etcd" in trace.read_text()  # the control


# --- usage errors: exit 64, one cause line, one hint line --------------------

def assert_usage(r, *words):
    """Exit 64, nothing on stdout, and on stderr exactly a `looplock: ` cause
    line naming the problem (all of `words`) and a `looplock: ` hint line."""
    assert r.returncode == EX_USAGE, (r.returncode, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    cause, hint = lines
    assert cause.startswith("looplock: ") and hint.startswith("looplock: "), r.stderr
    for w in words:
        assert w in cause, (w, cause)
    assert len(hint) > len("looplock: ") + 5


def usage_case(loop_dir, args, *words):
    """Runs a command line that must be refused; the command (if any) must
    never run."""
    marker = loop_dir / "ran"
    full = [a if a != "DIR" else str(loop_dir) for a in args]
    full = [a if a != "CMD" else f"touch {marker}" for a in full]
    r = run(full)
    assert_usage(r, *words)
    assert not marker.exists(), "the command ran despite a usage error"
    return r


def test_no_arguments():
    assert_usage(run([]), "missing DIR")


def test_missing_dir(loop_dir):
    usage_case(loop_dir, ["--", "sh", "-c", "CMD"], "missing DIR")


def test_missing_dashdash(loop_dir):
    r = usage_case(loop_dir, ["DIR"], "missing '--'")
    assert "--" in r.stderr.splitlines()[1]


def test_argument_before_dashdash(loop_dir):
    usage_case(loop_dir, ["DIR", "touch", "x", "--", "sh", "-c", "CMD"], "unexpected argument 'touch'")


def test_nothing_after_dashdash(loop_dir):
    usage_case(loop_dir, ["DIR", "--"], "no command after '--'")


def test_dash_c_without_string(loop_dir):
    usage_case(loop_dir, ["DIR", "-c"], "-c", "SHELL-COMMAND")


def test_dash_c_empty_string(loop_dir):
    usage_case(loop_dir, ["DIR", "-c", ""], "-c", "non-empty")


def test_extra_argument_after_dash_c_string(loop_dir):
    usage_case(loop_dir, ["DIR", "-c", "CMD", "extra"], "unexpected argument 'extra'", "-c")


def test_unknown_option(loop_dir):
    usage_case(loop_dir, ["--bogus", "DIR", "--", "sh", "-c", "CMD"], "bogus")


def test_unknown_short_option(loop_dir):
    usage_case(loop_dir, ["-Z", "DIR", "--", "sh", "-c", "CMD"], "Z")


def test_unknown_policy(loop_dir):
    usage_case(loop_dir, ["-p", "nope", "DIR", "--", "sh", "-c", "CMD"], "unknown policy 'nope'")


def test_policy_missing_value(loop_dir):
    usage_case(loop_dir, ["DIR", "-p"], "option '-p' needs a value")


@pytest.mark.parametrize("policy", ["single_flight", "blocking"])
@pytest.mark.parametrize("order", ["w-first", "p-first"])
def test_timeout_with_policy_without_deadline(loop_dir, policy, order):
    opts = ["-w", "1", "-p", policy] if order == "w-first" else ["-p", policy, "-w", "1"]
    usage_case(loop_dir, [*opts, "DIR", "--", "sh", "-c", "CMD"], "-w", policy)


@pytest.mark.parametrize("policy", ["mutation", "monitor"])
def test_timeout_with_policy_with_deadline_accepted(loop_dir, policy):
    r = run(["-p", policy, "-w", "1", loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"


def test_no_fork_with_close(loop_dir):
    usage_case(loop_dir, ["-F", "-o", "DIR", "--", "sh", "-c", "CMD"], "-F", "-o")


def test_verbose_with_quiet(loop_dir):
    usage_case(loop_dir, ["-v", "-q", "DIR", "--", "sh", "-c", "CMD"], "-v", "-q")


def test_bad_log_format(loop_dir):
    usage_case(loop_dir, ["--log-format", "xml", "DIR", "--", "sh", "-c", "CMD"], "--log-format", "xml")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_good_log_format(loop_dir, fmt):
    r = run(["--log-format", fmt, loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"


def test_json_without_inspect(loop_dir):
    usage_case(loop_dir, ["--json", "DIR", "--", "sh", "-c", "CMD"], "--json", "--inspect")


def test_stale_after_without_inspect(loop_dir):
    usage_case(loop_dir, ["--stale-after", "1h", "DIR", "--", "sh", "-c", "CMD"], "--stale-after")


def test_inspect_with_a_command(loop_dir):
    usage_case(loop_dir, ["--inspect", "DIR", "--", "sh", "-c", "CMD"], "--inspect")


# --- -w values ----------------------------------------------------------------

@pytest.mark.parametrize("value,rule", [("-1", "cannot be negative"), ("-0", "cannot be negative"),
                                        ("abc", "timeout(1)"), ("nan", "timeout(1)"), ("", "timeout(1)"),
                                        ("0x10", "hexadecimal"), (" 1", "timeout(1)"), ("1,5", "timeout(1)"),
                                        ("1MS", "timeout(1)"), ("1 ms", "timeout(1)"), ("ms", "timeout(1)")])
def test_timeout_rejected(loop_dir, value, rule):
    """The error names the rule that was broken."""
    usage_case(loop_dir, ["-w", value, "DIR", "--", "sh", "-c", "CMD"], "timeout", repr(value)[1:-1], rule)


@pytest.mark.parametrize("value", ["-1", "nan", "x"])
def test_timeout_rejected_long_form(loop_dir, value):
    usage_case(loop_dir, [f"--timeout={value}", "DIR", "--", "sh", "-c", "CMD"], "timeout")


# Every duration option takes every spelling looplock prints (issue: one
# duration grammar): "100ms" was a usage error while "3m" was accepted.
@pytest.mark.parametrize("value", ["100ms", "0ms", "2.5s", "3.1m", "2.5h", "1.5d", "inf"])
@pytest.mark.parametrize("option", ["-w", "--max-time", "--kill-after", "--stale-after"])
def test_every_duration_option_takes_what_looplock_prints(loop_dir, option, value):
    if option == "--stale-after":
        r = run(["--inspect", option, value, loop_dir])
    else:
        r = run([option, value, loop_dir, "--", "echo", "ran"])
        assert r.stdout == "ran\n"
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_a_printed_wait_can_be_typed_back(loop_dir, holders):
    """The duration in a timeout line is accepted as -w, and means what it says."""
    h = holders(loop_dir, tool="flock")
    r = run(["-w", "0.2", loop_dir, "--", "true"])
    assert r.returncode == EX_TEMPFAIL
    printed = re.search(r"still held after (\S+) by", r.stderr).group(1)
    assert re.fullmatch(r"\d+ms", printed), printed
    start = time.monotonic()
    r = run(["-w", printed, loop_dir, "--", "true"])
    elapsed = time.monotonic() - start
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert elapsed >= 0.15  # a deadline of about 200ms, not 200 s and not 0
    h.release()


# What timeout(1) accepts as a DURATION, looplock accepts too.
@pytest.mark.parametrize("value", ["0", "0.25", "5", "1.5", "0.000000001", ".5", "1.", "+1", "1e0", "1.0000000001",
                                   "0.01m", "inf"])
def test_timeout_accepted(loop_dir, value):
    r = run(["-w", value, loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    assert r.stderr == ""


# --- -E and --skip-exit-code values ------------------------------------------

@pytest.mark.parametrize("value", ["0", "256", "-1", "abc", "", "1.0", "75x"])
def test_conflict_exit_code_rejected(loop_dir, value):
    usage_case(loop_dir, ["-E", value, "DIR", "--", "sh", "-c", "CMD"], "conflict-exit-code")


@pytest.mark.parametrize("value", ["1", "255", "100"])
def test_conflict_exit_code_accepted(loop_dir, value):
    r = run(["-E", value, loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"


@pytest.mark.parametrize("value", ["-1", "256", "abc", ""])
def test_skip_exit_code_rejected(loop_dir, value):
    usage_case(loop_dir, ["-p", "single_flight", "--skip-exit-code", value, "DIR", "--", "sh", "-c", "CMD"],
               "skip-exit-code")


def test_skip_exit_code_whole_range_accepted(loop_dir):
    bad = []
    for n in range(256):
        r = run(["-p", "single_flight", "--skip-exit-code", str(n), loop_dir, "--", "echo", "ran"])
        if r.returncode != 0 or r.stdout != "ran\n":
            bad.append((n, r.returncode, r.stderr))
    assert bad == []


# --- the command's arguments are never parsed --------------------------------

def test_command_arguments_are_not_parsed(loop_dir):
    r = run([loop_dir, "--", "sh", "-c", 'echo "$@"', "x", "--help", "-w", "abc", "-p", "nope"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "--help -w abc -p nope\n"
    assert r.stderr == ""


def test_second_dashdash_and_dash_c_belong_to_the_command(loop_dir):
    r = run([loop_dir, "--", "printf", "%s\\n", "--", "-c", "--inspect", "--version", "-F", "-o"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["--", "-c", "--inspect", "--version", "-F", "-o"]


def test_shell_command_is_not_parsed(loop_dir):
    r = run([loop_dir, "-c", "echo --help -w abc -- -c -p nope"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "--help -w abc -- -c -p nope\n"


def test_shell_command_runs_in_sh(loop_dir):
    r = run([loop_dir, "-c", "x=5; echo $((x + 1)) && exit 3"])
    assert r.returncode == 3
    assert r.stdout == "6\n"


def test_options_after_dir_are_looplock_options(loop_dir):
    # Between DIR and '--' options are still looplock's.
    r = run([loop_dir, "--operation", "tick", "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert read_record(loop_dir)["operation"] == "tick"


def test_option_value_equal_to_dashdash(loop_dir):
    # Like getopt(3): an option that takes a value takes the next argument,
    # even "--"; the real separator is the next "--".
    r = run(["--operation", "--", loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    rec = read_record(loop_dir)
    assert rec["operation"] == "--"
    assert rec["released_at"] is not None


def test_option_value_equal_to_dash_c(loop_dir):
    r = run(["--agent", "-c", loop_dir, "--", "echo", "ran"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "ran\n"
    assert read_record(loop_dir)["agent_id"] == "-c"


def test_policy_value_dashdash_is_an_unknown_policy(loop_dir):
    usage_case(loop_dir, ["-p", "--", "DIR", "--", "sh", "-c", "CMD"], "unknown policy '--'")


def test_grouped_and_attached_short_options(loop_dir):
    for args in (["-qw", "0.5"], ["-w0.5"], ["--timeout=0.5"]):
        r = run([*args, loop_dir, "--", "echo", "ran"])
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout == "ran\n"


# --- flock(1) habits -----------------------------------------------------------------

def test_nonblock_is_one_attempt_under_mutation(loop_dir, holders):
    """-n (flock's spelling) is -w 0: a held lock gives 75 and an incident row
    under mutation, at once."""
    h = holders(loop_dir, tool="flock")
    r = run(["-n", loop_dir, "--", "echo", "ran"])
    assert r.returncode == EX_TEMPFAIL, r.stderr
    assert r.stdout == ""
    assert "lock_acquire_timeout" in r.stderr
    rows = incident_rows(loop_dir)
    assert len(rows) == 1 and rows[0]["deadline_ms"] == 0
    h.release()
    r = run(["--nonblock", "-x", loop_dir, "--", "echo", "ran"])
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr


def test_flock_only_options_point_to_looplock_s(loop_dir):
    r = run(["-u", loop_dir, "--", "true"])
    assert r.returncode == EX_USAGE
    assert "looplock: -u/--unlock is not an option" in r.stderr
    r = run(["9"])
    assert r.returncode == EX_USAGE
    assert "not as a descriptor" in r.stderr and "LOOPLOCK_FD" in r.stderr
