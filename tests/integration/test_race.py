"""The read-modify-write race of the loop scripts (helpers/counter.py): N
processes x M ticks. Under looplock (alone, or mixed with the scripts' own
fcntl.flock lock) no update is lost and no two ticks overlap; the control
without any lock loses updates, which shows the test can fail."""
import json
import subprocess

from conftest import LOOPLOCK, PY, helper

N = 4   # concurrent processes
M = 25  # ticks each
# Seconds between read and write in counter.py: the race window. Wide enough
# that the unprotected control reliably loses updates.
PAUSE = "0.01"
WORKER_TIMEOUT = 240

# One worker: M ticks in a row, printing each tick's exit status.
LOOP = 'i=0; while [ $i -lt {m} ]; do "$@"; echo $?; i=$((i + 1)); done'


def tick_looplock(d):
    return [LOOPLOCK, "-p", "blocking", str(d), "--", PY, helper("counter.py"), str(d), PAUSE]


def tick_looplock_deadline(d):
    # mutation with a deadline far beyond the whole test: no tick may time out.
    return [LOOPLOCK, "-w", "200", str(d), "--", PY, helper("counter.py"), str(d), PAUSE]


def tick_flock(d):
    return [PY, helper("counter_flock.py"), str(d), PAUSE]


def tick_plain(d):
    return [PY, helper("counter.py"), str(d), PAUSE]


def race(d, makers):
    """Starts one worker per maker at once; returns every tick's status."""
    procs = [subprocess.Popen(["sh", "-c", LOOP.format(m=M), "sh", *make(d)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for make in makers]
    statuses, errors = [], []
    try:
        for p in procs:
            out, err = p.communicate(timeout=WORKER_TIMEOUT)
            assert p.returncode == 0
            statuses += [int(s) for s in out.split()]
            errors.append(err)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(statuses) == len(makers) * M
    return statuses, "".join(errors)


def count(d):
    return json.loads((d / ".state.loop").read_text())["count"]


def test_control_without_lock_loses_updates(loop_dir):
    statuses, _ = race(loop_dir, [tick_plain] * N)
    assert set(statuses) <= {0, 3}
    assert count(loop_dir) < N * M, "the unprotected control did not lose updates: the race test cannot fail"


def test_looplock_loses_no_update(loop_dir):
    statuses, err = race(loop_dir, [tick_looplock] * N)
    assert statuses == [0] * (N * M), err  # 3 would mean two ticks overlapped
    assert count(loop_dir) == N * M
    assert not (loop_dir / ".occupied").exists()


def test_looplock_mutation_with_deadline_loses_no_update(loop_dir):
    statuses, err = race(loop_dir, [tick_looplock_deadline] * N)
    assert statuses == [0] * (N * M), err
    assert count(loop_dir) == N * M


def test_mixed_looplock_and_fcntl_flock_lose_no_update(loop_dir):
    statuses, err = race(loop_dir, [tick_looplock, tick_flock, tick_looplock, tick_flock])
    assert statuses == [0] * (N * M), err
    assert count(loop_dir) == N * M
    assert not (loop_dir / ".occupied").exists()
