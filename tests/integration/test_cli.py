"""Command-line behaviour: help, version, usage errors (exit 64), option
values, and the rule that the command's own arguments are never parsed."""
import pytest

from conftest import EX_USAGE, read_record, run

# The exact --help text (mirrors help_text() in src/options.cpp). A change to
# the help must be made in both places on purpose.
HELP = """\
Usage: looplock [OPTIONS] DIR -- COMMAND [ARG]...
       looplock [OPTIONS] DIR -c SHELL-COMMAND
       looplock --inspect [--json] [--stale-after DURATION] DIR

Run COMMAND while holding the advisory lock on DIR/.state.lock (flock(2)),
then exit exactly as COMMAND exited.

Policy:
  -p, --policy NAME           mutation (wait 5 s, default), monitor (1 s),
                              single_flight (no wait: skip, exit 0),
                              blocking (wait without limit)
  -w, --timeout SECONDS       deadline for mutation/monitor (0: one attempt)
  -E, --conflict-exit-code N  status when the deadline passes (default 75)
      --skip-exit-code N      status of a single_flight skip (default 0)
Lock and command:
  -s, --shared                take a shared (reader) lock
  -o, --close                 do not pass the lock fd to COMMAND
  -F, --no-fork               exec COMMAND in place of looplock
      --kill-after DURATION   send KILL if a forwarded TERM/INT has not
                              ended COMMAND within DURATION
      --agent ID              who runs it (default $LOOPLOCK_AGENT or user)
      --operation NAME        what runs (default: the command or script name)
Output:
  -v, --verbose               report waiting, acquiring and releasing
  -q, --quiet                 errors only (the noop-locked line stays)
      --log-format FORMAT     stderr lines as text (default) or json
Inspect:
      --inspect               report who holds DIR's lock; change nothing
      --json                  print the report as one JSON object
      --stale-after DURATION  warn about holds older than this (default 2h)
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
  -h, --help                  show this help;  -V, --version  show version

Examples:
  looplock /srv/loops/nightly -- python3 scripts/status.py --tick
  looplock -p single_flight /srv/loops/nightly -- ./monitor.sh
  looplock -w 30 /srv/loops/nightly -c 'status.py --approve && status.py --tick'

Exit status: COMMAND's own; 75 deadline passed; 64 usage; 66 no DIR;
73 unsafe lock file; 74 DIR vanished mid-lock; 71 OS error; 126/127 exec;
69 etcd unreachable; 76 etcd lease lost while COMMAND ran.
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


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    r = run([flag])
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    name, _, version = lines[0].partition(" ")
    assert name == "looplock"
    assert version and version[0].isdigit() and "." in version
    assert r.stderr == ""


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
    usage_case(loop_dir, ["DIR", "-p"], "p", "missing")


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

@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", "1e9", ".5", "", "1.", "+1", "0x10",
                                   " 1", "1.0000000001", "1,5", "-0"])
def test_timeout_rejected(loop_dir, value):
    usage_case(loop_dir, ["-w", value, "DIR", "--", "sh", "-c", "CMD"], "timeout", repr(value)[1:-1])


@pytest.mark.parametrize("value", ["-1", "nan", ".5"])
def test_timeout_rejected_long_form(loop_dir, value):
    usage_case(loop_dir, [f"--timeout={value}", "DIR", "--", "sh", "-c", "CMD"], "timeout")


@pytest.mark.parametrize("value", ["0", "0.25", "5", "1.5", "0.000000001"])
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
