"""--once-per across hosts: the run ledger on etcd, against the suite's real
etcd on loopback. Two loop dirs stand in for two hosts on one cluster lock
name; one of them runs with its clock 3 s behind (faketime(1) reaches the
dynamically linked looplock-etcd that --etcd runs), and a history of who ran
each slot is checked afterwards. The local half is test_once_per.py."""
import base64
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LOOPLOCK, PY, TIMEOUT, expect_line, expect_stderr, helper, incident_rows, run, start, wait_until
from etcdtest import etcd, EX_LEASE_LOST, SANITIZED, needs_etcd

pytestmark = needs_etcd

TICK = helper("slot_tick.py")
CHECKPOINT = helper("checkpoint_tick.py")
FAKETIME = shutil.which("faketime") or "/usr/bin/faketime"


_names = iter(range(1_000_000))


@pytest.fixture
def name():
    return f"once{os.getpid()}-{next(_names)}"


@pytest.fixture
def hosts(tmp_path):
    dirs = []
    for h in ("a", "b"):
        d = tmp_path / h
        d.mkdir()
        dirs.append(d)
    return dirs


def once(etcd, name, loop_dir, duration="60s", *extra):
    return ["--etcd", etcd.url, "--lock-name", name, "--once-per", duration, "--operation", "tick", *extra,
            str(loop_dir), "--"]


def tick(history, label, how="0"):
    return [PY, TICK, str(history), label, how]


def ticks(history):
    p = Path(history)
    return [line.split() for line in p.read_text().splitlines()] if p.exists() else []


def revision(etcd):
    """The store's revision: one more for every write."""
    return int(etcd.post("/v3/kv/range", {"key": base64.b64encode(b"looplock-revision-probe").decode()})
               ["header"]["revision"])


def runs_key(etcd, name):
    r = etcd.ctl("get", "--prefix", f"looplock/{name}/runs/", "--print-value-only")
    assert r.returncode == 0, r.stderr
    return [json.loads(v) for v in r.stdout.splitlines() if v.strip()]


def test_a_fast_run_on_one_host_makes_the_other_hosts_run_a_second_later_skip_and_name_it(etcd, name, hosts,
                                                                                          tmp_path):
    history = tmp_path / "history"
    a = run(once(etcd, name, hosts[0]) + tick(history, "a"))
    assert a.returncode == 0, a.stderr
    time.sleep(1)
    b = run(once(etcd, name, hosts[1]) + tick(history, "b"))
    assert b.returncode == 0, b.stderr
    assert [t[0] for t in ticks(history)] == ["a"]
    a_pid = int(ticks(history)[0][1])
    assert "noop-already-run" in b.stderr and f"host {os.uname().nodename} pid " in b.stderr, b.stderr
    assert " and ended at " in b.stderr and "with status 0" in b.stderr
    [entry] = runs_key(etcd, name)
    assert entry["exit_status"] == 0 and entry["fencing_token"] > 0 and entry["ended_ms"] is not None
    assert entry["pid"] != a_pid  # looplock's pid, not the tick's
    # --inspect --etcd says who ran it, from either host.
    r = run(["--inspect", "--etcd", etcd.url, "--lock-name", name, hosts[1]])
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("cluster   last run"))
    assert "operation tick" in line and f"pid {entry['pid']} " in line and "with status 0" in line
    j = json.loads(run(["--inspect", "--json", "--etcd", etcd.url, "--lock-name", name, hosts[1]]).stdout)
    assert j["cluster"]["runs"][0]["pid"] == entry["pid"]


def test_control_without_once_per_the_other_host_runs_the_tick_again(etcd, name, hosts, tmp_path):
    history = tmp_path / "history"
    for h, label in ((hosts[0], "a"), (hosts[1], "b")):
        r = run(["--etcd", etcd.url, "--lock-name", name, "--operation", "tick", h, "--", *tick(history, label)])
        assert r.returncode == 0, r.stderr
    assert [t[0] for t in ticks(history)] == ["a", "b"]


def test_a_host_killed_mid_run_lets_the_other_host_run_the_slot_once_its_lease_expires(etcd, name, hosts,
                                                                                       tmp_path):
    history = tmp_path / "history"
    a = start(once(etcd, name, hosts[0], "60s", "--ttl", "2") + tick(history, "a", "hold"), start_new_session=True)
    try:
        expect_line(a)
        [entry] = runs_key(etcd, name)
        assert entry["ended_ms"] is None  # its start is on etcd before the command starts
        os.killpg(a.pid, signal.SIGKILL)  # the host dies: looplock, looplock-etcd and the tick
        a.wait(timeout=TIMEOUT)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
            a.wait(timeout=TIMEOUT)
    b = run(once(etcd, name, hosts[1], "60s", "-w", "20") + tick(history, "b"))
    assert b.returncode == 0, b.stderr
    assert [t[0] for t in ticks(history)] == ["a", "b"]
    [entry] = runs_key(etcd, name)
    assert entry["exit_status"] == 0 and entry["pid"] != a.pid


@pytest.mark.skipif(SANITIZED, reason="50 s of schedule, the same code paths as the tests above: the release build runs it")
def test_two_hosts_3s_apart_run_each_slot_of_a_5s_schedule_exactly_once(etcd, name, hosts, tmp_path):
    """10 slots of a 5 s schedule, --once-per 4s, a 1 s tick; host b's clock
    is 3 s behind (faketime). Both fire every slot, in turn first: the
    history shows one run per slot, and b saw a's starts in its future."""
    history = tmp_path / "history"
    skewed = dict(os.environ, FAKETIME_DONT_FAKE_MONOTONIC="1")
    fired = []

    def fire(host, slot):
        cmd = [LOOPLOCK, *map(str, once(etcd, name, hosts[host], "4s", "-w", "20")),
               *tick(history, f"{'ab'[host]}{slot}", "1")]
        if host == 1:
            cmd = [FAKETIME, "-f", "-3s", *cmd]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=skewed if host == 1 else None)

    t0 = time.monotonic()
    for slot in range(10):
        time.sleep(max(0.0, t0 + 5 * slot - time.monotonic()))
        order = (0, 1) if slot % 2 == 0 else (1, 0)
        procs = []
        for host in order:
            procs.append((host, fire(host, slot)))
            time.sleep(0.2)
        for host, p in procs:
            try:
                out, err = p.communicate(timeout=TIMEOUT)
            finally:
                if p.poll() is None:
                    p.kill()
            assert p.returncode == 0, err
            fired.append((slot, host, err))
    runs = ticks(history)
    per_slot = {}
    for label, _pid, wall_ms, _token in runs:
        per_slot.setdefault(int(label[1:]), []).append((label[0], int(wall_ms)))
    assert sorted(per_slot) == list(range(10)), runs
    assert all(len(v) == 1 for v in per_slot.values()), runs
    skips = [err for _slot, _host, err in fired if "noop-already-run" in err]
    assert len(skips) == 10
    # The skew was real: b found a's recorded start 3 s in its future.
    ahead = [err for _slot, host, err in fired if host == 1 and " after this looplock started, by this host's clock" in err]
    assert ahead and all("it counts (it is within --once-per)" in err for err in ahead), fired
    # --inspect says which host ran the last slot.
    r = run(["--inspect", "--etcd", etcd.url, "--lock-name", name, hosts[0]])
    assert "cluster   last run  operation tick: host " in r.stdout, r.stdout


def test_a_runner_killed_mid_slot_never_uses_it_up(etcd, name, hosts, tmp_path):
    """Host a's looplock is KILLed in the middle of its run; its lease lives
    on until its TTL. Host b, fired just after a, waits past its -w for the
    slot's run (it cannot know it crashed), and runs the slot once a's lease
    has expired. Then the other order: a runner already dead when b comes
    is proven dead (this host, this boot, its pid gone) and b says so."""
    history = tmp_path / "history"
    runners = {}
    for op, kill_first in (("tick", False), ("tock", True)):
        a = start(["--etcd", etcd.url, "--lock-name", name, "--ttl", "4", "--once-per", "4m", "--operation", op,
                   str(hosts[0]), "--", *tick(history, f"a-{op}", "hold")])
        b = None
        try:
            expect_line(a)
            if kill_first:
                os.kill(a.pid, signal.SIGKILL)
                a.wait(timeout=TIMEOUT)
            b = start(["-v", "--etcd", etcd.url, "--lock-name", name, "--once-per", "4m", "--operation", op, "-w",
                       "0.5", str(hosts[1]), "--", *tick(history, f"b-{op}")])
            seen = expect_stderr(b, "waiting past the deadline for the slot's run")
            line = [x for x in seen if "waiting past the deadline" in x][0]
            assert f"pid {a.pid} " in line and "has not recorded its end" in line, line
            if kill_first:
                assert "that run's looplock is dead" in line, line
                # --inspect says so too: the key stays until its lease expires.
                i = run(["--inspect", "--etcd", etcd.url, "--lock-name", name, hosts[0]])
                assert f"pid {a.pid} " in i.stdout and "its looplock is dead (this host)" in i.stdout, i.stdout
            else:
                assert "takes the slot if it never does" in line, line
                os.kill(a.pid, signal.SIGKILL)
            out, err = b.communicate(timeout=TIMEOUT)
            assert b.returncode == 0, err
            assert "noop-already-run" not in err, err
            runners[op] = b.pid
        finally:
            for p in (a, b):
                if p and p.poll() is None:
                    p.kill()
                if p:
                    p.wait(timeout=TIMEOUT)
    assert [t[0] for t in ticks(history)] == ["a-tick", "b-tick", "a-tock", "b-tock"]
    entries = {e["operation"]: e for e in runs_key(etcd, name)}
    assert all(entries[op]["exit_status"] == 0 and entries[op]["pid"] == runners[op] for op in runners), entries
    assert entries["tock"]["boot_id"] and entries["tock"]["pid_ns"] and entries["tock"]["pid_start"]


def test_the_warning_comes_before_the_lease_term_when_etcd_stalls(etcd, name, hosts, tmp_path):
    p = start(["--etcd", etcd.url, "--lock-name", name, "--ttl", "4", "--kill-after", "1", "--warn-before", "2s",
               hosts[0], "--", PY, CHECKPOINT, str(tmp_path / "c"), "ignore"])
    stopped = False
    try:
        expect_line(p)
        os.kill(etcd.proc.pid, signal.SIGSTOP)
        stopped = True
        out, err = p.communicate(timeout=TIMEOUT)
    finally:
        if stopped:
            os.kill(etcd.proc.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait(timeout=TIMEOUT)
    assert p.returncode == EX_LEASE_LOST, err
    assert [line.split()[0] for line in out.splitlines()] == ["warned", "term"], out
    assert "the lease's renewals are failing, and its TERM comes in" in err, err
    row = incident_rows(hosts[0])[-1]
    assert row["error_code"] == "lease_lost"
    assert row["warned"]["signal"] == "USR1"


def test_once_per_costs_at_most_two_more_etcd_writes_per_run(etcd, name, hosts):
    # No lease of an earlier test left to expire (its deletions are writes
    # too) while the writes are counted.
    wait_until(lambda: not etcd.post("/v3/lease/leases", {}).get("leases"), "earlier tests' leases to expire",
               timeout=TIMEOUT)

    def writes(*extra):
        before = revision(etcd)
        r = run(["--etcd", etcd.url, "--lock-name", name, "--operation", "w", *extra, hosts[0], "--", "true"])
        assert r.returncode == 0, r.stderr
        return revision(etcd) - before

    plain = writes()
    with_ledger = writes("--once-per", "1ms")
    assert plain >= 2  # its key, then the lease's revoke deleting it
    assert with_ledger - plain == 2, (plain, with_ledger)  # the start, then the end
