"""Load: many looplock processes at once lose no update, never overlap, and
leave every incident row whole; kill -9 of looplock mid-hold, repeated, never
lets a second holder in while the killed one's command still runs.

Sizes come from $LOOPLOCK_LOAD: "ci" (the default: small, the whole file in
well under a minute) or "full" (the hardening issue's sizes: 16 processes x
500 read-modify-write cycles per mode, 100 kill -9 rounds; a few minutes).
Run the full load with:

    LOOPLOCK_LOAD=full LOOPLOCK=build/src/looplock /usr/bin/python3 -m pytest tests/integration/test_load.py

The read-modify-write tick is a small sh script (a Python tick costs ~20 ms
to start): an occupancy marker created with noclobber (O_EXCL) detects two
ticks inside the critical section at once (the tick then exits 3), the
count is read, incremented, written to a temporary file and renamed over
the state file. Each worker is a sh loop too, so that the test measures
looplock, not the test's own process start-ups.
"""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import (EX_TEMPFAIL, EX_VANISHED, LOOPLOCK, TIMEOUT, hold, incident_rows, lock_is_free, read_record,
                      read_until, run, wait_until)

LOCK = ".state.lock"
LOAD = os.environ.get("LOOPLOCK_LOAD", "ci")
if LOAD not in ("ci", "full"):
    raise ValueError(f"LOOPLOCK_LOAD must be ci or full, not {LOAD!r}")
FULL = LOAD == "full"

SANITIZED = os.environ.get("LOOPLOCK_SANITIZED") == "1"
# The ASan+UBSan build's runs cost several times as much: fewer of them.
PROCS, CYCLES = (16, 500) if FULL else ((4, 20) if SANITIZED else (6, 30))
UNLINK_EVERY = 5  # the holder unlinks the lock file on every 5th iteration of a worker
WRITERS, WRITER_ROUNDS = 32, (5 if FULL else 1)
KILL_ROUNDS = 100 if FULL else 10
WORKER_TIMEOUT = 900 if FULL else 120

TICK = r"""#!/bin/sh
# tick.sh DIR MODE: MODE "tick" is one read-modify-write of DIR/.state.loop;
# MODE "unlink" deletes the lock file (the one thing operators must never
# do) and touches nothing else.
d=$1
if [ "$2" = unlink ]; then
  rm -f "$d/.state.lock"
  exit 0
fi
if ! (set -C; : > "$d/.occupied") 2>/dev/null; then
  echo "overlap" >&2
  exit 3
fi
read n < "$d/.state.loop"
n=$((n + 1))
echo "$n" > "$d/.state.loop.tmp.$$"
mv "$d/.state.loop.tmp.$$" "$d/.state.loop"
rm -f "$d/.occupied"
"""

WORKER = r"""#!/bin/sh
# worker.sh LOOPLOCK DIR TICK N K OUT: runs ticks under looplock until N have
# succeeded; every K-th iteration (K > 0) is an "unlink" run instead. Each
# run's "MODE STATUS" goes to OUT, its stderr to OUT.err. LOOPLOCK "-" runs
# the tick without looplock (the control).
ll=$1 d=$2 tick=$3 n=$4 k=$5 out=$6
ok=0 i=0
while [ "$ok" -lt "$n" ]; do
  i=$((i + 1))
  [ "$i" -gt $((n * 2 + 20)) ] && exit 9
  mode=tick
  if [ "$k" -gt 0 ] && [ $((i % k)) -eq 0 ]; then mode=unlink; fi
  if [ "$ll" = - ]; then
    sh "$tick" "$d" "$mode" 2>>"$out.err"
  else
    "$ll" -p blocking "$d" -- sh "$tick" "$d" "$mode" 2>>"$out.err"
  fi
  st=$?
  echo "$mode $st" >> "$out"
  if [ "$mode" = tick ] && [ "$st" -eq 0 ]; then ok=$((ok + 1)); fi
done
"""


@pytest.fixture
def scripts(tmp_path):
    tick = tmp_path / "tick.sh"
    tick.write_text(TICK)
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER)
    return tick, worker


def load(tmp_path, loop_dir, scripts, procs, cycles, unlink_every=0, looplock=LOOPLOCK, control=False):
    """Runs `procs` workers at once; returns (final count, [(mode, status)],
    stderr text of all runs)."""
    tick, worker = scripts
    (loop_dir / ".state.loop").write_text("0\n")
    outs = [tmp_path / f"worker{i}.out" for i in range(procs)]
    ps = [subprocess.Popen(["sh", str(worker), looplock, str(loop_dir), str(tick), str(cycles), str(unlink_every),
                            str(o)], stdin=subprocess.DEVNULL) for o in outs]
    try:
        for p in ps:
            p.wait(timeout=WORKER_TIMEOUT)
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=TIMEOUT)
    if not control:
        assert [p.returncode for p in ps] == [0] * procs, "a worker gave up (too many failed runs)"
    runs = []
    err = ""
    for o in outs:
        runs += [tuple(line.split()) for line in o.read_text().splitlines()]
        e = o.with_name(o.name + ".err")
        err += e.read_text() if e.exists() else ""
    count = int((loop_dir / ".state.loop").read_text())
    return count, [(m, int(s)) for m, s in runs], err


def check_looplock_lines(err, allowed):
    for line in err.splitlines():
        assert line.startswith("looplock: "), f"unexpected stderr line {line!r}"
        assert any(a in line for a in allowed), f"unexpected message {line!r}"


# --- (a) read-modify-write under load --------------------------------------------


def test_control_without_looplock_loses_updates_or_overlaps(tmp_path, loop_dir, scripts):
    """The same load without looplock must show the race (else the tests
    below could not fail)."""
    count, runs, _ = load(tmp_path, loop_dir, scripts, 6, 30, looplock="-", control=True)
    overlaps = sum(1 for m, s in runs if s == 3)
    successful = sum(1 for m, s in runs if s == 0)
    assert overlaps > 0 or count != successful, "the unprotected control showed no race"


def test_plain_load_loses_nothing_and_never_overlaps(tmp_path, loop_dir, scripts):
    count, runs, err = load(tmp_path, loop_dir, scripts, PROCS, CYCLES)
    assert [r for r in runs if r != ("tick", 0)] == [], "a run failed or overlapped (exit 3)"
    assert len(runs) == PROCS * CYCLES
    assert count == PROCS * CYCLES
    assert err == ""
    assert not (loop_dir / ".occupied").exists()
    rec = read_record(loop_dir)
    assert rec["released_at"] is not None
    assert lock_is_free(loop_dir)


def test_load_with_the_lock_file_unlinked_inside_the_critical_section(tmp_path, loop_dir, scripts):
    """Every 5th iteration of each worker, the holder deletes the lock file
    inside its critical section (and does nothing else). Those runs report
    "loop dir vanished mid-lock" (74) and the worker carries on until its
    ticks have all succeeded; waiters blocked on the deleted file must notice
    and lock the new one instead of running on the orphan. The count equals
    the successful ticks: no update lost, no overlap, ever."""
    count, runs, err = load(tmp_path, loop_dir, scripts, PROCS, CYCLES, unlink_every=UNLINK_EVERY)
    ticks = [s for m, s in runs if m == "tick"]
    unlinks = [s for m, s in runs if m == "unlink"]
    assert 3 not in ticks, "two ticks overlapped"
    assert ticks == [0] * len(ticks), f"tick statuses: {sorted(set(ticks))}"
    assert len(ticks) == PROCS * CYCLES
    assert unlinks and unlinks == [EX_VANISHED] * len(unlinks), f"unlink statuses: {sorted(set(unlinks))}"
    assert count == len(ticks)
    check_looplock_lines(err, ["vanished mid-lock", "never delete", "deleted or replaced"])
    assert err.count("loop dir vanished mid-lock") == len(unlinks)
    assert not (loop_dir / ".occupied").exists()


def test_load_after_a_kill_9_holder_left_a_stale_record(tmp_path, loop_dir, scripts):
    h = hold(loop_dir, tool="looplock")
    stale = read_record(loop_dir)
    assert stale["pid"] == h.pid and stale["released_at"] is None
    os.kill(h.pid, signal.SIGKILL)
    assert h.proc.wait(timeout=TIMEOUT) == -signal.SIGKILL
    wait_until(lambda: lock_is_free(loop_dir), "the killed holder's command to let go of the lock")
    assert read_record(loop_dir) == stale, "the record of the killed holder stays until the next holder"

    count, runs, err = load(tmp_path, loop_dir, scripts, PROCS, CYCLES)
    assert [r for r in runs if r != ("tick", 0)] == []
    assert count == PROCS * CYCLES
    assert err == ""
    rec = read_record(loop_dir)
    assert rec["pid"] != stale["pid"] and rec["released_at"] is not None


# --- (b) concurrent incident rows -----------------------------------------------------


def test_concurrent_timeouts_append_whole_rows(loop_dir):
    h = hold(loop_dir, tool="looplock", extra=("--agent", "A" * 300, "--operation", "O" * 300))
    try:
        total = 0
        for rnd in range(WRITER_ROUNDS):
            ps = [subprocess.Popen([LOOPLOCK, "-w", "0.2", "--agent", f"w{rnd}-{i:02d}-" + "x" * 250,
                                    str(loop_dir), "--", "true"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True) for i in range(WRITERS)]
            for p in ps:
                _, err = p.communicate(timeout=TIMEOUT)
                assert p.returncode == EX_TEMPFAIL, err
                assert "cannot append" not in err, err
            total += WRITERS
            raw = (loop_dir / ".state.lock.incidents.jsonl").read_bytes()
            lines = raw.split(b"\n")
            assert lines[-1] == b"", "the file must end with a whole line"
            rows = [json.loads(l.decode("utf-8")) for l in lines[:-1]]  # any corrupt line raises
            assert len(rows) == total
            this_round = [r for r in rows if r["waiter"]["agent_id"].startswith(f"w{rnd}-")]
            assert sorted(r["waiter"]["pid"] for r in this_round) == sorted(p.pid for p in ps)
            for r in this_round:
                assert r["holder"]["pid"] == h.pid
                assert r["error_code"] == "lock_acquire_timeout"
    finally:
        h.release()
    assert len(incident_rows(loop_dir)) == WRITERS * WRITER_ROUNDS


# --- (c) kill -9 of looplock mid-hold, repeated ----------------------------------------

# The command of a looplock that will be killed: first checks that the
# previous round's command is gone (no /proc entry, a zombie, or PF_EXITING
# set: it can run no more code), then holds until killed.
KILLED_CMD = r"""
old=$1
if [ "$old" != 0 ]; then
  s=$(cat "/proc/$old/stat" 2>/dev/null)
  if [ -n "$s" ]; then
    set -- ${s##*) }
    case "$1" in
      Z | X) ;;
      *) [ $(( $7 & 4 )) -ne 0 ] || { echo "OVERLAP $old is still running ($1)"; exit 3; } ;;
    esac
  fi
fi
echo "ready $$"
exec sleep 1000
"""

PF_EXITING = 0x4


def command_gone(pid):
    """No /proc entry, a zombie, or already exiting (PF_EXITING: the kernel
    closes its files, releasing the lock, just before it turns zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & PF_EXITING)


def test_kill_9_mid_hold_never_lets_a_second_holder_in(loop_dir):
    """looplock is killed with SIGKILL while its command runs; the command is
    then killed by the parent-death signal. The lock must become free only
    once that command is gone: checked by polling (even rounds) and by a
    waiter started at once whose command checks the old one is gone (odd
    rounds)."""
    prev_cmd = 0
    p = None
    killed = []
    try:
        for rnd in range(KILL_ROUNDS):
            p = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(loop_dir), "--", "sh", "-c", KILLED_CMD, "sh",
                                  str(prev_cmd)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            seen = expect_line_prefix(p, ("ready ", "OVERLAP"))
            assert seen.startswith("ready "), f"round {rnd}: {seen.strip()}"
            cmd = int(seen.split()[1])
            killed.append(cmd)
            assert not lock_is_free(loop_dir)
            os.kill(p.pid, signal.SIGKILL)
            assert p.wait(timeout=TIMEOUT) == -signal.SIGKILL
            if rnd % 2 == 0:
                end = time.monotonic() + 10
                while True:
                    if lock_is_free(loop_dir):
                        assert command_gone(cmd), f"round {rnd}: lock free while command {cmd} still runs"
                        break
                    assert time.monotonic() < end, f"round {rnd}: the lock was never freed"
                    time.sleep(0.001)
            prev_cmd = cmd
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
        for cmd in killed:
            if not command_gone(cmd):
                try:
                    os.kill(cmd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    wait_until(lambda: all(command_gone(c) for c in killed), "every killed looplock's command to exit")
    # command_gone() counts a command that is exiting (PF_EXITING) as gone,
    # but the kernel closes its files, the lock among them, a moment later:
    # wait for the lock as the next run would, not assert it at once.
    wait_until(lambda: lock_is_free(loop_dir), "the lock to be free once the last command has exited")
    rec = read_record(loop_dir)
    assert rec["released_at"] is None, "a SIGKILLed holder writes no release"
    # The next ordinary run simply replaces the stale record.
    r = run([loop_dir, "--", "true"])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert read_record(loop_dir)["released_at"] is not None


def expect_line_prefix(proc, prefixes, timeout=TIMEOUT):
    found, seen = read_until(proc, proc.stdout, lambda line: line.startswith(prefixes), timeout)
    if not found:
        raise AssertionError(f"no line starting with {prefixes} from pid {proc.pid}")
    return seen[-1]
