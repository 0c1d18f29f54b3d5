"""Cluster lock names that hold '/' or '%' against a real etcd on loopback:
each name has keys of its own ("x" and "x/lock/y" no longer exclude each
other), and such a name still excludes the looplock of an earlier version
(LEGACY_COMMIT, built from git history: etcdtest.legacy_helper) and etcdctl
lock, which keep its keys under the unencoded prefix looplock/NAME/lock/:
a holder of either layout blocks a contender of the other, both ways.

Every handshake is a line a process printed or a key etcd holds; the order in
which commands ran comes from what they wrote, never from timing."""
import json
import os
import re
import socket
import subprocess

import pytest

from conftest import EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, expect_line, expect_stderr, helper, incident_rows, run
from etcdtest import etcd, ETCDCTL, bounded_wait, fresh_name, legacy_helper, needs_etcd

pytestmark = needs_etcd

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def legacy():
    return legacy_helper()


@pytest.fixture
def procs():
    made = []
    yield made
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=TIMEOUT)


def cluster(etcd, name, *extra):
    return ["--etcd", etcd.url, "--lock-name", name, *extra]


def popen(exe, args, made, **kw):
    p = subprocess.Popen([exe, *[str(a) for a in args]], stdin=kw.pop("stdin", subprocess.PIPE),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    made.append(p)
    return p


def hold(exe, etcd, name, d, made, log=None):
    """A looplock (today's, or the legacy one) holding cluster lock `name`
    until its stdin closes; it appends "NAME end" to `log` when its command ends."""
    command = [PY, helper("wait_stdin.py")] if log is None else \
        ["sh", "-c", f'echo ready; cat >/dev/null; echo "$0 end" >> {log}', os.path.basename(exe)]
    p = popen(exe, [*cluster(etcd, name), "-p", "blocking", d, "--", *command], made)
    expect_line(p, "ready")
    return p


def release(p):
    p.stdin.close()
    assert p.wait(timeout=TIMEOUT) == 0, p.stderr.read()


def run_with(exe, args):
    return subprocess.run([exe, *[str(a) for a in args]], capture_output=True, text=True, timeout=TIMEOUT)


def keys(etcd, prefix):
    r = etcd.ctl("get", "--prefix", "--keys-only", prefix)
    assert r.returncode == 0, r.stderr
    return [k for k in r.stdout.splitlines() if k]


@pytest.fixture
def dirs(tmp_path):
    out = []
    for i in range(4):
        d = tmp_path / f"host{i}"
        d.mkdir()
        out.append(d)
    return out


def test_the_legacy_layout_puts_x_lock_y_under_x(etcd, legacy, dirs, procs):
    """The collision, on the code before the fix: a legacy holder of x/lock/y
    makes a legacy single_flight run of x skip. Today's x runs."""
    x = fresh_name()
    h = hold(legacy, etcd, f"{x}/lock/y", dirs[0], procs)
    r = run_with(legacy, [*cluster(etcd, x), "-p", "single_flight", dirs[1], "--", "echo", "ran"])
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert "noop-locked" in r.stderr and f"pid {h.pid}" in r.stderr, r.stderr
    # Today's x is not blocked by it: that key is x/lock/y's, not x's.
    r = run([*cluster(etcd, x), "-p", "single_flight", dirs[1], "--", "echo", "ran"])
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    r = run([*cluster(etcd, x), "-w", "0", dirs[1], "--", "echo", "ran"])
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    release(h)


@pytest.mark.parametrize("holding, other", [("{x}/lock/y", "{x}"), ("{x}", "{x}/lock/y"),
                                            ("{x}/lock/y", "{x}%2Flock%2Fy"), ("{x}%2Flock%2Fy", "{x}/lock/y"),
                                            ("{x}/a", "{x}/a/lock/b"), ("{x}%", "{x}%25")])
def test_names_that_differ_do_not_exclude_each_other(etcd, dirs, procs, holding, other):
    x = fresh_name()
    holding, other = holding.format(x=x), other.format(x=x)
    h = hold(LOOPLOCK, etcd, holding, dirs[0], procs)
    for extra in (["-p", "single_flight"], ["-w", "0"]):
        r = run([*cluster(etcd, other), *extra, dirs[1], "--", "sh", "-c", 'echo "ran $LOOPLOCK_ETCD_KEY"'])
        assert r.returncode == 0, (extra, r.stderr)
        ran, key = r.stdout.split()
        assert ran == "ran"
        encoded = other.replace("%", "%25").replace("/", "%2F")
        assert re.fullmatch(rf"looplock/{re.escape(encoded)}/lock/[0-9a-f]+", key), key
    # And the same name excludes, of course.
    r = run([*cluster(etcd, holding), "-p", "single_flight", dirs[1], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert "noop-locked" in r.stderr and f"pid {h.pid}" in r.stderr
    release(h)


def test_a_new_holder_blocks_a_legacy_contender(etcd, legacy, dirs, procs, tmp_path):
    name = f"{fresh_name()}/lock/y"
    log = tmp_path / "order"
    h = hold(LOOPLOCK, etcd, name, dirs[0], procs, log=log)
    # Its key, and the same key under the unencoded prefix for the legacy one.
    lease = keys(etcd, f"looplock/{name.replace('/', '%2F')}/lock/")[0].rsplit("/", 1)[1]
    assert keys(etcd, f"looplock/{name}/lock/") == [f"looplock/{name}/lock/{lease}"]
    r = run_with(legacy, [*cluster(etcd, name), "-p", "single_flight", dirs[1], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert "noop-locked" in r.stderr and f"pid {h.pid}" in r.stderr, r.stderr
    r = run_with(legacy, [*cluster(etcd, name), "-w", "0.3", dirs[2], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (EX_TEMPFAIL, ""), r.stderr
    assert "lock_acquire_timeout" in r.stderr and f"pid {h.pid}" in r.stderr, r.stderr
    assert incident_rows(dirs[2])[-1]["cluster"]["holder"]["pid"] == h.pid
    # A legacy waiter runs only once the new holder's command has ended.
    w = popen(legacy, ["-v", *cluster(etcd, name), "-p", "blocking", dirs[3], "--", "sh", "-c",
                       f"echo legacy start >> {log}"], procs)
    expect_stderr(w, "waiting for cluster lock")
    release(h)
    assert w.wait(timeout=TIMEOUT) == 0, w.stderr.read()
    assert log.read_text() == f"{os.path.basename(LOOPLOCK)} end\nlegacy start\n"
    assert keys(etcd, f"looplock/{name}/lock/") == []


def test_a_legacy_holder_blocks_a_new_contender(etcd, legacy, dirs, procs, tmp_path):
    name = f"{fresh_name()}/lock/y"
    log = tmp_path / "order"
    h = hold(legacy, etcd, name, dirs[0], procs, log=log)
    r = run([*cluster(etcd, name), "-p", "single_flight", dirs[1], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (0, ""), r.stderr
    assert "noop-locked" in r.stderr and f"pid {h.pid}" in r.stderr, r.stderr
    r = run([*cluster(etcd, name), "-w", "0.3", dirs[2], "--", "echo", "must not run"])
    assert (r.returncode, r.stdout) == (EX_TEMPFAIL, ""), r.stderr
    assert "lock_acquire_timeout" in r.stderr and f"pid {h.pid}" in r.stderr, r.stderr
    assert incident_rows(dirs[2])[-1]["cluster"]["holder"]["pid"] == h.pid
    # A new waiter queues behind it; --inspect sees both layouts, in order.
    w = popen(LOOPLOCK, ["-v", *cluster(etcd, name), "-p", "blocking", dirs[3], "--", "sh", "-c",
                         f"echo new start >> {log}"], procs)
    expect_stderr(w, "waiting for cluster lock")
    r = run(["--inspect", "--json", *cluster(etcd, name), dirs[1]])
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["cluster"]
    assert c["lock_name"] == name and c["contenders"] == 2
    assert c["holder"]["pid"] == h.pid and c["holder"]["key"].startswith(f"looplock/{name}/lock/")
    assert [x["pid"] for x in c["waiting"]] == [w.pid]
    assert c["waiting"][0]["key"].startswith(f"looplock/{name.replace('/', '%2F')}/lock/")
    text = run(["--inspect", *cluster(etcd, name), dirs[1]]).stdout
    assert f"cluster   held by host {HOST} pid {h.pid} " in text, text
    assert f"key looplock/{name}/lock/" in text  # the legacy layout, named
    assert f"cluster   waiting 1: host {HOST} pid {w.pid} " in text, text
    release(h)
    assert w.wait(timeout=TIMEOUT) == 0, w.stderr.read()
    assert log.read_text() == f"{os.path.basename(legacy)} end\nnew start\n"


def test_etcdctl_lock_on_the_unencoded_name_and_looplock_exclude_each_other(etcd, dirs, procs, tmp_path):
    """etcdctl lock looplock/NAME/lock keeps the legacy layout: a stand-in
    for an earlier looplock that needs no build."""
    name = f"{fresh_name()}/b"
    legacy_prefix = f"looplock/{name}/lock/"
    done = tmp_path / "done"
    log = tmp_path / "order"
    env = dict(os.environ, ETCDCTL_API="3")
    ctl = popen(ETCDCTL, ["--endpoints", etcd.url, "lock", legacy_prefix.rstrip("/"), "--", "sh", "-c",
                          f"echo ready; while [ ! -e {done} ]; do sleep 0.02; done"], procs,
                stdin=subprocess.DEVNULL, env=env)
    try:
        expect_line(ctl, "ready")
        r = run([*cluster(etcd, name), "-p", "single_flight", dirs[0], "--", "echo", "must not run"])
        assert (r.returncode, r.stdout) == (0, ""), r.stderr
        assert "noop-locked" in r.stderr and "etcdctl lock" in r.stderr, r.stderr
    finally:
        done.touch()
    assert ctl.wait(timeout=TIMEOUT) == 0
    # Now looplock holds, and etcdctl lock waits for it.
    h = hold(LOOPLOCK, etcd, name, dirs[0], procs, log=log)
    ctl = popen(ETCDCTL, ["--endpoints", etcd.url, "lock", legacy_prefix.rstrip("/"), "--", "sh", "-c",
                          f"echo etcdctl start >> {log}"], procs, stdin=subprocess.DEVNULL, env=env)
    bounded_wait(lambda: len(keys(etcd, legacy_prefix)) == 2, "etcdctl lock to queue")
    release(h)
    assert ctl.wait(timeout=TIMEOUT) == 0, ctl.stderr.read()
    assert log.read_text() == f"{os.path.basename(LOOPLOCK)} end\netcdctl start\n"
