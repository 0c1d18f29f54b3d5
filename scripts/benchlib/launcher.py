"""Starting the tools: every one the same way (posix_spawn, stdin and stdout
on /dev/null, stderr to a log), so that launcher overhead cancels in ratios;
a timed run; N driver loops released at once through a gate; the argv of
each tool; and what /proc says about a running wrapper."""
import fcntl
import os
import signal
import time
from pathlib import Path

from . import BenchError

TRUE = "/bin/true"
SLEEP = "/bin/sleep"
SH = "/bin/sh"


def high_fd(fd):
    """A close-on-exec duplicate of fd numbered 10 or more (so that dup2 onto
    0..3 in posix_spawn never meets the same number), the original closed."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Launcher:
    """Starts every tool the same way (posix_spawn, stdin and stdout on
    /dev/null, stderr to a log), so launcher overhead cancels in ratios."""

    def __init__(self, work):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPLOCK")}
        self.devnull = high_fd(os.open(os.devnull, os.O_RDWR))
        self.errpath = Path(work) / "stderr.log"
        self.errfd = high_fd(os.open(self.errpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        self.quiet_err = False

    def spawn(self, argv, stdin=None, fd3=None, stderr=None, env=None):
        err = self.errfd if stderr is None else stderr
        fa = [(os.POSIX_SPAWN_DUP2, self.devnull if stdin is None else stdin, 0),
              (os.POSIX_SPAWN_DUP2, self.devnull, 1),
              (os.POSIX_SPAWN_DUP2, err, 2)]
        if fd3 is not None:
            fa.append((os.POSIX_SPAWN_DUP2, fd3, 3))
        return os.posix_spawn(argv[0], argv, {**self.env, **env} if env else self.env, file_actions=fa)

    def timed(self, argv, stderr=None, env=None):
        """(wall ns, wait status, CPU ns of the tool and what it waited for);
        env: variables added to the launcher's environment."""
        t0 = time.perf_counter_ns()
        pid = self.spawn(argv, stderr=stderr, env=env)
        _, status, ru = os.wait4(pid, 0)
        t1 = time.perf_counter_ns()
        return t1 - t0, status, int((ru.ru_utime + ru.ru_stime) * 1e9)

    def take_stderr(self):
        """Unexpected messages the tools wrote since the last call."""
        try:
            text = self.errpath.read_text(errors="replace")
        except OSError:
            return ""
        os.ftruncate(self.errfd, 0)
        return text


def exit_of(status):
    """The exit status of a wait status (−N for signal N)."""
    return os.waitstatus_to_exitcode(status)


def check_ok(name, status):
    """Raises BenchError unless the run named name exited with 0."""
    code = exit_of(status)
    if code != 0:
        raise BenchError(f"{name} exited with {code} (expected 0)")


class Tools:
    """The command line of each tool around a command: looplock (plain, -F,
    with --metrics-dir) on the loop dir, flock(1) (plain, -F) on the loop
    dir's lock file, the empty wrapper (the limit of any wrapper), the
    looplock of an earlier commit (plain, -F: `scripts/bench --baseline`),
    or the bare command."""

    def __init__(self, looplock, flock, d, empty=None, baseline=None, baseline_label=None):
        self.looplock = looplock
        self.flock = flock
        self.empty = empty  # the empty static vfork-and-exec wrapper, or None
        self.baseline = baseline  # an earlier commit's looplock, or None
        self.baseline_label = baseline_label  # which commit, as the report names it
        self.dir = str(d)
        self.lock = str(Path(d) / ".state.lock")
        self.metrics = str(Path(d).parent / "metrics")
        os.makedirs(self.metrics, exist_ok=True)

    def wrap(self, tool, cmd, policy_args=()):
        """The argv that runs cmd under tool (policy_args go to looplock)."""
        if tool == "looplock":
            return [self.looplock, *policy_args, self.dir, "--", *cmd]
        if tool == "looplock -F":
            return [self.looplock, "-F", *policy_args, self.dir, "--", *cmd]
        if tool == "looplock metrics":
            return [self.looplock, "--metrics-dir", self.metrics, *policy_args, self.dir, "--", *cmd]
        if tool == "looplock metrics env":
            # The same file, named by the environment (env_for): the update
            # without an option for cxxopts to parse (see "looplock -x").
            return [self.looplock, *policy_args, self.dir, "--", *cmd]
        if tool == "looplock -x":
            # -x (exclusive, the default) changes nothing: what one option on
            # the command line costs a run.
            return [self.looplock, "-x", *policy_args, self.dir, "--", *cmd]
        if tool == "looplock once-per":
            # 1ms: every run is a slot of its own, so each reads the ledger
            # and records its start and end (the whole cost of --once-per).
            return [self.looplock, "--once-per", "1ms", "--operation", "bench", *policy_args, self.dir, "--", *cmd]
        if tool == "baseline":
            return [self.baseline, *policy_args, self.dir, "--", *cmd]
        if tool == "baseline -F":
            return [self.baseline, "-F", *policy_args, self.dir, "--", *cmd]
        if tool == "flock":
            return [self.flock, self.lock, *cmd]
        if tool == "flock -F":
            return [self.flock, "-F", self.lock, *cmd]
        if tool == "empty":
            return [self.empty, *cmd]
        if tool == "bare":
            return list(cmd)
        raise ValueError(tool)

    def env_for(self, tool):
        """What tool's environment has beside the launcher's."""
        return {"LOOPLOCK_METRICS_DIR": self.metrics} if tool == "looplock metrics env" else {}


# One driver loop: $1 runs of the rest of its arguments, after saying "ready"
# on fd 3 and waiting for the gate (stdin) to close.
DRIVER = ('m=$1; shift; printf r >&3; exec 3>&-; read _ || :; i=0; '
          'while [ "$i" -lt "$m" ]; do "$@" || exit $?; i=$((i+1)); done')


def run_drivers(L, n, m, argv):
    """Starts n `sh` loops that each run argv m times (or argv[i], when argv
    is a list of n command lines), opens the gate once all are ready, and
    returns the wall time until the last one exits."""
    per = argv if argv and isinstance(argv[0], list) else [argv] * n
    gate_r, gate_w = (high_fd(x) for x in os.pipe())
    ready_r, ready_w = (high_fd(x) for x in os.pipe())
    pids = []
    try:
        for i in range(n):
            pids.append(L.spawn([SH, "-c", DRIVER, "sh", str(m), *per[i]], stdin=gate_r, fd3=ready_w))
        os.close(ready_w)
        ready_w = None
        got = 0
        while got < n:
            chunk = os.read(ready_r, n - got)
            if not chunk:
                raise BenchError("a driver died before it was ready")
            got += len(chunk)
        t0 = time.perf_counter_ns()
        os.close(gate_w)  # every `read` sees EOF at once
        gate_w = None
        bad = []
        for pid in pids:
            _, st = os.waitpid(pid, 0)
            if exit_of(st) != 0:
                bad.append(exit_of(st))
        pids = []
        t1 = time.perf_counter_ns()
        if bad:
            raise BenchError(f"{' '.join(per[0])}: {len(bad)} driver(s) failed with {bad[:5]}")
        return t1 - t0
    finally:
        for fd in (gate_r, gate_w, ready_r, ready_w):
            if fd is not None:
                os.close(fd)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


def proc_status(pid):
    """VmHWM and VmRSS of pid in KiB; None when it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    out[k] = int(v.split()[0])
    except OSError:
        return None
    return out


def find_child(ppid, comm):
    """The pid of a child of ppid named comm, or None."""
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        if int(fields[1]) == ppid and name == comm:
            return int(e)
    return None
