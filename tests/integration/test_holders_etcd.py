"""--holders N with --etcd (looplock-sharing(7), HOLDERS): across hosts (loop dirs
that stand in for hosts, on one cluster lock name), a contender holds when
fewer than N contenders rank ahead of it and none of them is exclusive (a
run without --holders, etcdctl lock). A history of who ran when, checked
afterwards. The local half is test_holders.py."""
import json
import os
import subprocess

import pytest

from conftest import EX_TEMPFAIL, PY, TIMEOUT, expect_line, expect_stderr, run, start
from etcdtest import etcd, ETCDCTL, needs_etcd
from test_holders import TICK, WAIT, history_of, most_at_once

pytestmark = needs_etcd


_names = iter(range(1_000_000))


@pytest.fixture
def cluster(etcd):
    return ["--etcd", etcd.url, "--lock-name", f"holders{os.getpid()}-{next(_names)}"]


@pytest.fixture
def hosts(tmp_path):
    out = []
    for h in ("a", "b", "c", "d"):
        (tmp_path / h).mkdir()
        out.append(tmp_path / h)
    return out


def test_never_more_than_n_across_hosts_and_n_reached(cluster, hosts, tmp_path):
    history = tmp_path / "history"
    procs = [start([*cluster, "--holders", "3", "-p", "blocking", hosts[i % 4], "--", PY, TICK, history, f"h{i}", "3", "4"],
                   stdin=subprocess.DEVNULL) for i in range(8)]
    ends = [(p.wait(timeout=90), p.stderr.read()) for p in procs]
    assert [s for s, _ in ends] == [0] * 8, ends
    h = history_of(history)
    assert len(h) == 16
    assert most_at_once(h) == (3, False)


def test_an_exclusive_run_never_runs_beside_a_holder_across_hosts(cluster, hosts, tmp_path):
    history = tmp_path / "history"
    procs = []
    for i in range(8):
        if i % 4 == 3:
            args = [*cluster, "-p", "blocking", hosts[i % 4], "--", PY, TICK, history, f"x{i}", "1"]
        else:
            args = [*cluster, "--holders", "2", "-p", "blocking", hosts[i % 4], "--", PY, TICK, history, f"h{i}", "2"]
        procs.append(start(args, stdin=subprocess.DEVNULL))
    assert [p.wait(timeout=120) for p in procs] == [0] * 8, [p.stderr.read() for p in procs]
    h = history_of(history)
    assert len(h) == 16
    most, mixed = most_at_once(h)
    assert not mixed, h
    assert most <= 2


def test_all_held_single_flight_skips_and_a_deadline_passes(cluster, hosts):
    hs = []
    for i in range(2):
        hs.append(start([*cluster, "--holders", "2", hosts[i], "--", PY, WAIT]))
        expect_line(hs[-1], "ready")
    try:
        r = run([*cluster, "--holders", "2", "-p", "single_flight", hosts[2], "--", "echo", "must not run"])
        assert (r.returncode, r.stdout) == (0, ""), r.stderr
        assert "noop-locked" in r.stderr
        r = run([*cluster, "--holders", "2", "-w", "0.5", "--log-format", "json", hosts[3], "--", "echo",
                 "must not run"])
        assert (r.returncode, r.stdout) == (EX_TEMPFAIL, ""), r.stderr
        line = json.loads(r.stderr.splitlines()[-1])
        assert line["event"] == "lock_acquire_timeout"
        assert sorted(h["pid"] for h in line["cluster"]["holders"]) == sorted(h.pid for h in hs)
        assert "and 1 more holding it beside that one (--holders 2)" in line["message"]
        # A larger N gets in beside them.
        r = run([*cluster, "--holders", "3", "-p", "single_flight", hosts[2], "--", "echo", "ran"])
        assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)


def test_etcdctl_lock_counts_as_exclusive(etcd, cluster, hosts, tmp_path):
    name = cluster[3]
    done = tmp_path / "done"
    ctl = subprocess.Popen([ETCDCTL, "--endpoints", etcd.url, "lock", f"looplock/{name}/lock", "--", "sh", "-c",
                            f"echo ready; while [ ! -e {done} ]; do sleep 0.02; done"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ, ETCDCTL_API="3"))
    try:
        expect_line(ctl, "ready")
        r = run([*cluster, "--holders", "3", "-p", "single_flight", hosts[0], "--", "echo", "must not run"])
        assert (r.returncode, r.stdout) == (0, ""), r.stderr
        assert "noop-locked" in r.stderr and "etcdctl lock" in r.stderr
        w = start([*cluster, "--holders", "3", "-w", "20", hosts[1], "--", "echo", "ran"])
        done.touch()
        assert ctl.wait(timeout=TIMEOUT) == 0
        out, err = w.communicate(timeout=TIMEOUT)
        assert (w.returncode, out) == (0, "ran\n"), err
    finally:
        done.touch()
        if ctl.poll() is None:
            ctl.kill()
        ctl.wait(timeout=TIMEOUT)


def test_inspect_shows_every_holder_of_the_cluster_lock_and_the_hint_names_the_lock(cluster, hosts):
    hs = []
    for i in range(2):
        hs.append(start([*cluster, "--holders", "2", hosts[i], "--", PY, WAIT]))
        expect_line(hs[-1], "ready")
    w = start([*cluster, "--holders", "2", "-p", "blocking", "-v", hosts[2], "--", "true"])
    try:
        expect_stderr(w, "waiting for cluster lock")
        report = json.loads(run(["--inspect", "--json", *cluster, hosts[0]]).stdout)["cluster"]
        assert report["holder"]["pid"] == hs[0].pid
        assert [h["pid"] for h in report["holders"]] == [hs[1].pid]
        assert [x["pid"] for x in report["waiting"]] == [w.pid]
        text = run(["--inspect", *cluster, hosts[0]]).stdout
        assert "also held by" in text and "(--holders 2)" in text and "waiting 1:" in text
        r = run([*cluster, "--holders", "2", "-w", "0.3", hosts[3], "--", "true"])
        assert r.returncode == EX_TEMPFAIL
        assert f"--lock-name {cluster[3]}" in r.stderr
    finally:
        for h in hs:
            h.stdin.close()
            h.wait(timeout=TIMEOUT)
        assert w.wait(timeout=TIMEOUT) == 0
