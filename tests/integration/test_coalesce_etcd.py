"""-p coalesce with --etcd: the cluster lock's queue decides (a coalescing
waiter of the same operation queued ahead means skip), across two loop dirs
that stand in for two hosts on one cluster lock name. The local half is
test_coalesce.py."""
import os
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, LOOPLOCK, PID_NS, TIMEOUT, expect_line, expect_stderr, incident_rows, need_pid_namespace,
                      run, start, wait_until)
from etcdtest import etcd, needs_etcd
from test_coalesce import BURST, coalesce, finish, fire, settle, tick, ticks

pytestmark = needs_etcd


_names = iter(range(1_000_000))


@pytest.fixture
def cluster(etcd):
    return ["--etcd", etcd.url, "--lock-name", f"coalesce{os.getpid()}-{next(_names)}"]


@pytest.fixture
def hosts(tmp_path):
    out = []
    for h in ("a", "b"):
        (tmp_path / h).mkdir()
        out.append(tmp_path / h)
    return out


def test_ten_ticks_on_two_hosts_fired_while_the_holder_runs_end_as_one_more_run_and_nine_skips(cluster, hosts,
                                                                                                 tmp_path):
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    burst = fire(lambda i: [*cluster, *coalesce(hosts[i % 2]), *tick(history, f"r{i}")])
    [waiter] = settle(burst)
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    ends = finish(burst)
    assert [status for status, _ in ends] == [0] * BURST
    assert ticks(history) == ["holder", f"r{burst.index(waiter)}"]
    for p, (_, err) in zip(burst, ends):
        if p is not waiter:
            assert "noop-coalesced: " in err and f"pid {waiter.pid} (agent " in err, err
            assert f"cluster lock {cluster[3]} (etcd)" in err


def test_control_without_coalesce_every_tick_runs(cluster, hosts, tmp_path):
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    burst = fire(lambda i: [*cluster, "-p", "blocking", "--operation", "tick", str(hosts[i % 2]), "--",
                            *tick(history, f"r{i}")], n=4)
    wait_until(lambda: all(p.poll() is None for p in burst), "the burst to queue")
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    assert [status for status, _ in finish(burst)] == [0] * 4
    assert len(ticks(history)) == 5


def test_a_waiter_that_gives_up_counts_the_ticks_it_absorbed_and_frees_its_place(cluster, hosts, tmp_path):
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    waiter = start([*cluster, *coalesce(hosts[1], "tick", "-w", "3", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    for label, h in (("a", hosts[0]), ("b", hosts[1])):
        r = run([*cluster, *coalesce(h), *tick(history, label)])
        assert "noop-coalesced" in r.stderr, r.stderr
    assert waiter.wait(timeout=TIMEOUT) == EX_TEMPFAIL
    rows = incident_rows(hosts[1])
    assert rows[-1]["policy"] == "coalesce" and rows[-1]["coalesced"] == 2, rows
    nxt = start([*cluster, *coalesce(hosts[0]), *tick(history, "next")], stdin=None)
    holder.stdin.close()
    assert [status for status, _ in finish([holder, nxt])] == [0, 0]
    assert ticks(history) == ["holder", "next"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_waiter_ended_by_a_signal_says_what_it_absorbed_frees_its_place_and_dies_of_it(cluster, hosts, tmp_path,
                                                                                        sig):
    """As a -w deadline does, with --etcd too: its line and incident row
    count the runs it absorbed and say none of them ran, it leaves the
    queue (the next tick takes its place), then it dies of the signal.
    Before, it died at once: no line, no row, its absorbed ticks lost
    unseen."""
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    waiter = start([*cluster, *coalesce(hosts[1], "tick", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    for label, h in (("a", hosts[0]), ("b", hosts[1])):
        r = run([*cluster, *coalesce(h), *tick(history, label)])
        assert "noop-coalesced" in r.stderr, r.stderr
    os.kill(waiter.pid, sig)
    assert waiter.wait(timeout=TIMEOUT) == -sig
    err = waiter.stderr.read()
    assert (f"signal {sig.name[3:]} ended the wait for cluster lock" in err
            and "and the 2 later runs of it that it absorbed, none of which ran" in err), err
    row = incident_rows(hosts[1])[-1]
    assert row["error_code"] == "lock_acquire_timeout" and row["coalesced"] == 2, row
    seen = run([*cluster, "--inspect", "--check", str(hosts[0])])  # said: nothing left to name again
    assert seen.returncode == 0 and "never ran" not in seen.stdout, seen.stdout
    nxt = start([*cluster, *coalesce(hosts[0]), *tick(history, "next")], stdin=None)
    holder.stdin.close()
    assert [status for status, _ in finish([holder, nxt])] == [0, 0]
    assert ticks(history) == ["holder", "next"]


def test_a_waiter_killed_after_it_absorbed_a_tick_is_named_by_the_next_tick_on_its_host(cluster, hosts, tmp_path):
    """The waiter KILLed after it absorbed a tick: the next tick (this host:
    the waiter is proven dead) is not absorbed by it, waits in its place,
    names it and the runs it had absorbed, and runs for them. Before,
    nothing said so."""
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    waiter = start([*cluster, *coalesce(hosts[1], "tick", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    r = run([*cluster, *coalesce(hosts[0]), *tick(history, "a")])
    assert "noop-coalesced" in r.stderr, r.stderr
    waiter.kill()
    waiter.wait(timeout=TIMEOUT)
    nxt = start([*cluster, *coalesce(hosts[0], "tick", "-v"), *tick(history, "next")], stdin=None)
    seen = expect_stderr(nxt, "died in the queue of cluster lock")
    line = [x for x in seen if "died in the queue" in x][0]
    assert (f"pid {waiter.pid} died in the queue of cluster lock {cluster[3]} as the waiter of tick" in line
            and "after it absorbed 1 later run, which never ran: this run waits in its place and runs for them" in line
            ), line
    # A later arrival is absorbed by the one that waits in its place: it
    # names nobody (before, it too said that it runs for them, then skipped).
    later = run([*cluster, *coalesce(hosts[1]), *tick(history, "later")])
    assert later.returncode == 0 and "noop-coalesced" in later.stderr, later.stderr
    assert "died in the queue" not in later.stderr and "runs for them" not in later.stderr, later.stderr
    holder.stdin.close()
    assert [status for status, _ in finish([holder, nxt])] == [0, 0]
    assert ticks(history) == ["holder", "next"]


def test_with_once_per_a_tick_absorbed_on_another_host_after_its_slot_came_due_runs(cluster, hosts, tmp_path):
    """Tick 0 runs on host a (--once-per 2s); tick A queues on host b; tick
    B comes on host a once tick 0's slot is over and is absorbed by A. A is
    judged by B's start (the newest it absorbed), so it runs."""
    import time
    from pathlib import Path
    history = tmp_path / "history"
    args = ["--once-per", "2s"]
    first = start([*cluster, *args, *coalesce(hosts[0]), *tick(history, "tick0", "hold")])
    expect_line(first)
    a = start([*cluster, *args, *coalesce(hosts[1], "tick", "-v"), *tick(history, "A")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (a.stderr.readline() or ""), "A to queue")
    started_ms = int(Path(history).read_text().split()[2])
    wait_until(lambda: time.time() * 1000 - started_ms > 2300, "tick 0's slot to be over", timeout=TIMEOUT)
    b = run([*cluster, *args, *coalesce(hosts[0]), *tick(history, "B")])
    assert b.returncode == 0 and "noop-coalesced" in b.stderr, b.stderr
    first.stdin.close()
    assert [status for status, _ in finish([first, a])] == [0, 0]
    assert ticks(history) == ["tick0", "A"]


def kill_a_waiter_on_another_host(cluster, args, hosts, history):
    """A coalescing waiter (--ttl 2) on "another host" (a pid namespace of
    its own: nobody here can prove it dead) on hosts[1] absorbs a tick fired
    on hosts[0], then is KILLed."""
    unshare = subprocess.Popen([*PID_NS, LOOPLOCK, *cluster, "--ttl", "2", *args, *coalesce(hosts[1], "tick", "-v"),
                                *tick(history, "w")], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: "waiting for cluster lock" in (unshare.stderr.readline() or ""), "the waiter to queue")
        r = run([*cluster, *args, *coalesce(hosts[0]), *tick(history, "a")])
        assert "noop-coalesced" in r.stderr, r.stderr
        [waiter] = [int(c) for c in Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()]
        os.kill(waiter, signal.SIGKILL)
        assert unshare.wait(timeout=TIMEOUT) != 0
    finally:
        if unshare.poll() is None:
            unshare.kill()
            unshare.wait(timeout=TIMEOUT)


def test_a_waiter_killed_on_another_host_after_it_absorbed_a_tick_is_named_by_inspect_and_the_next_tick(
        cluster, hosts, tmp_path):
    """The coalescing waiter runs on "another host" (a pid namespace of its
    own: nobody here can prove it dead) and is KILLed after it absorbed a
    tick. While its lease lives nothing can tell; once it expired, --inspect
    --check warns (exit 1) that the absorbed tick never ran, and the next
    tick that takes the lock names the waiter and runs for it; then --inspect
    --check is clean. Before, the absorbed notes went with the waiter's
    lease: no line anywhere, and --inspect --check exited 0."""
    need_pid_namespace()
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    kill_a_waiter_on_another_host(cluster, [], hosts, history)
    look = [*cluster, "--inspect", "--check", str(hosts[0])]
    wait_until(lambda: "waiting 1:" not in run(look).stdout, "the waiter's lease to expire", timeout=TIMEOUT)
    seen = run(look)
    assert seen.returncode == 1, seen.stdout + seen.stderr
    assert ("1 run of operation tick absorbed by pid 1 on host " in seen.stdout
            and "never ran: it left the queue (its looplock died: KILLed, or its host was lost)" in seen.stdout
            ), seen.stdout
    nxt = start([*cluster, *coalesce(hosts[0], "tick"), *tick(history, "next")], stdin=None)
    holder.stdin.close()
    assert [status for status, _ in finish([holder])] == [0]
    status, err = finish([nxt])[0]
    assert status == 0, err
    assert ("pid 1 on host " in err and ", the waiter of tick in the queue of cluster lock " in err
            and "left it without running the 1 later run it had absorbed" in err
            and "this run runs for them" in err), err
    assert ticks(history) == ["holder", "next"]
    after = run(look)
    assert after.returncode == 0, after.stdout


def test_a_waiter_that_gives_up_leaves_no_notes_behind(cluster, hosts, tmp_path):
    """Its line says none of the runs it absorbed ran: nothing is left for
    --inspect --check or the next tick to name again."""
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    gives_up = start([*cluster, *coalesce(hosts[1], "tick", "-v", "-w", "3"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (gives_up.stderr.readline() or ""), "the waiter to queue")
    r = run([*cluster, *coalesce(hosts[0]), *tick(history, "a")])
    assert "noop-coalesced" in r.stderr, r.stderr
    assert gives_up.wait(timeout=TIMEOUT) == EX_TEMPFAIL
    err = gives_up.stderr.read()
    assert "gave up tick and the 1 later run of it that it absorbed" in err, err
    seen = run([*cluster, "--inspect", "--check", str(hosts[0])])
    assert seen.returncode == 0 and "never ran" not in seen.stdout, seen.stdout
    nxt = start([*cluster, *coalesce(hosts[0], "tick"), *tick(history, "next")], stdin=None)
    holder.stdin.close()
    (held, _), (status, err) = finish([holder, nxt])
    assert held == 0 and status == 0, err
    assert "left it without running" not in err, err
    assert ticks(history) == ["holder", "next"]


def test_with_holders_a_coalescing_run_that_holds_never_absorbs_a_later_tick(cluster, hosts, tmp_path):
    """--holders 2: the second run holds beside the first (its command runs
    already); a later coalescing tick waits for an index of its own and runs,
    and nothing is left for --inspect --check to name. Before, the holding
    run absorbed it (noop-coalesced: "already waits"), and its command never
    ran."""
    history = tmp_path / "history"
    args = [*cluster, "--holders", "2", "--operation", "tick"]
    first = start([*args, str(hosts[0]), "--", *tick(history, "h1", "hold")])
    expect_line(first)
    second = start([*args, "-p", "coalesce", str(hosts[1]), "--", *tick(history, "h2", "hold")])
    expect_line(second)
    third = start([*cluster, "--holders", "2", *coalesce(hosts[0]), *tick(history, "t3")], stdin=None)
    wait_until(lambda: "waiting 1:" in run([*cluster, "--inspect", str(hosts[0])]).stdout, "the third run to queue")
    assert third.poll() is None, third.stderr.read()
    first.stdin.close()
    second.stdin.close()
    assert [status for status, _ in finish([first, second, third])] == [0, 0, 0]
    assert sorted(ticks(history)) == ["h1", "h2", "t3"]
    seen = run([*cluster, "--inspect", "--check", str(hosts[0])])
    assert seen.returncode == 0, seen.stdout


def test_a_killed_waiter_whose_key_is_first_keeps_inspect_check_failing_and_is_named_at_once(cluster, hosts,
                                                                                              tmp_path):
    """The holder ends while the KILLed waiter's key (this host: proven dead)
    is next: its key is first until its lease expires. --inspect --check
    still warns (exit 1), and an arrival names it at once and runs for it.
    Before, --check exited 0 in that window and the arrival said nothing
    until the key had gone."""
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    waiter = start([*cluster, "--ttl", "30", *coalesce(hosts[0], "tick", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    assert "noop-coalesced" in run([*cluster, *coalesce(hosts[1]), *tick(history, "b")]).stderr
    waiter.kill()
    waiter.wait(timeout=TIMEOUT)
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    look = [*cluster, "--inspect", "--check", str(hosts[0])]
    seen = run(look)
    assert f"held by host " in seen.stdout and f"pid {waiter.pid} " in seen.stdout, seen.stdout
    assert seen.returncode == 1 and "died in the queue (this host) without running them" in seen.stdout, seen.stdout
    nxt = start([*cluster, *coalesce(hosts[0], "tick"), *tick(history, "next")], stdin=None)
    seen = expect_stderr(nxt, "died in the queue of cluster lock")
    assert any(f"pid {waiter.pid} died in the queue" in x and "absorbed 1 later run" in x for x in seen), seen
    nxt.kill()  # its place comes when the dead key's 30 s lease expires: not waited for here
    nxt.wait(timeout=TIMEOUT)


def test_with_once_per_runs_left_behind_inside_a_slot_that_ran_are_not_called_lost(cluster, hosts, tmp_path):
    """--once-per: the holder's run counts for the slot; the waiter absorbs
    a tick inside that slot and is KILLed on "another host" (its own pid
    namespace). Once its key is gone, --inspect --check does not warn: the
    run ledger shows that tick needs no run (a coalescing run of it would
    skip). Before, --check failed until a run took the lock after the slot."""
    need_pid_namespace()
    history = tmp_path / "history"
    args = ["--once-per", "1h"]
    holder = start([*cluster, *args, *coalesce(hosts[0]), *tick(history, "holder", "hold")])
    expect_line(holder)
    kill_a_waiter_on_another_host(cluster, args, hosts, history)
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    look = [*cluster, "--inspect", "--check", str(hosts[0])]
    wait_until(lambda: "waiting 1:" not in run(look).stdout and "held by" not in run(look).stdout,
               "the waiter's lease to expire", timeout=TIMEOUT)
    seen = run(look)
    assert seen.returncode == 0 and "never ran" not in seen.stdout, seen.stdout
    assert ticks(history) == ["holder"]


@pytest.mark.parametrize("end", ["runs", "gives_up"])
def test_a_waiter_that_queued_again_after_its_lease_expired_keeps_the_runs_it_absorbed(tmp_path, hosts, end):
    """etcd stops answering for longer than the waiter's TTL (not the
    holder's): the waiter's lease expires and it queues again under a new
    one. The runs it absorbed are still its own: --inspect --check does not
    call them left behind, and the waiter runs without naming itself dead.
    Before, both said its looplock had died (KILLed, or its host lost)."""
    from etcdtest import start_member
    own = start_member()
    try:
        cluster = ["--etcd", own.url, "--lock-name", f"requeue{os.getpid()}"]
        history = tmp_path / "history"
        holder = start([*cluster, "--ttl", "30", "--operation", "tick", str(hosts[0]), "--",
                        *tick(history, "holder", "hold")])
        expect_line(holder)
        bound = ["-w", "15"] if end == "gives_up" else []
        waiter = start([*cluster, "--ttl", "2", *bound, *coalesce(hosts[1], "tick", "-v"), *tick(history, "w")],
                       stdin=None)
        wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
        assert "noop-coalesced" in run([*cluster, *coalesce(hosts[0]), *tick(history, "a")]).stderr
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            import time
            time.sleep(3.5)  # the outage itself: longer than the waiter's 2 s TTL
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)
        seen = expect_stderr(waiter, "queuing again")
        assert any("the etcd lease expired while waiting" in x for x in seen), seen
        look = run([*cluster, "--inspect", "--check", str(hosts[0])])
        assert "never ran" not in look.stdout and "waiting 1:" in look.stdout, look.stdout
        assert "it absorbed 1 later run" in look.stdout, look.stdout
        if end == "gives_up":
            # Its deadline counts the run it absorbed under its first lease too.
            assert waiter.wait(timeout=TIMEOUT) == EX_TEMPFAIL
            err = waiter.stderr.read()
            assert "gave up tick and the 1 later run of it that it absorbed" in err, err
            look = run([*cluster, "--inspect", "--check", str(hosts[0])])
            assert look.returncode == 0 and "never ran" not in look.stdout, look.stdout
            holder.stdin.close()
            assert holder.wait(timeout=TIMEOUT) == 0
            assert ticks(history) == ["holder"]
            return
        holder.stdin.close()
        (held, _), (status, err) = finish([holder, waiter])
        assert held == 0 and status == 0, err
        assert "left it without running" not in err and "died" not in err, err
        assert ticks(history) == ["holder", "w"]
    finally:
        own.remove()


def test_a_waiter_that_absorbed_more_runs_than_one_etcd_transaction_holds_clears_them_all(etcd, cluster, hosts,
                                                                                           tmp_path):
    """150 runs noted under one waiter (etcd takes at most 128 operations in
    a transaction): it takes the lock, runs once for all of them and deletes
    every note, so --inspect --check is clean afterwards. Before, its delete
    (one compare and one delete a note) was refused, and the notes stayed
    for every later run to fail on."""
    import json
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    waiter = start([*cluster, *coalesce(hosts[1], "tick", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    [w] = json.loads(run([*cluster, "--inspect", "--json", str(hosts[0])]).stdout)["cluster"]["waiting"]
    root = f"looplock/{cluster[3]}/absorbed/{w['lease']}/"
    note = json.dumps({"operation": "tick", "started_ms": 1, "waiter": {"host": w["host"], "pid": w["pid"]}})
    script = "".join(f"{etcdtest_ctl(etcd)} put {root}{i:x} '{note}' >/dev/null\n" for i in range(1, 151))
    assert subprocess.run(["sh", "-c", "set -e\n" + script], timeout=TIMEOUT * 2).returncode == 0
    look = run([*cluster, "--inspect", str(hosts[0])])
    assert "it absorbed 150 later runs" in look.stdout, look.stdout
    holder.stdin.close()
    (held, _), (status, err) = finish([holder, waiter])
    assert held == 0 and status == 0, err
    assert "this run absorbed 150 later runs of tick" in err, err
    assert ticks(history) == ["holder", "w"]
    left = etcd.ctl("get", "--prefix", "--keys-only", root)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout
    assert run([*cluster, "--inspect", "--check", str(hosts[0])]).returncode == 0


def etcdtest_ctl(member):
    from etcdtest import ETCDCTL
    return f"ETCDCTL_API=3 {ETCDCTL} --endpoints {member.url}"


def test_with_holders_a_run_beside_a_dead_waiters_key_runs_for_what_it_absorbed(cluster, hosts, tmp_path):
    """--holders 2: the coalescing waiter is KILLed after it absorbed a tick;
    its key (its lease lives on) then takes a place beside a holder. The
    next coalescing run of the operation on this host, which can prove it
    dead, names it, runs for its tick once a place is free, and deletes its
    note: --inspect --check is clean then. Before, that run ran beside the
    dead key but left the note, and --check kept failing."""
    history = tmp_path / "history"
    args = [*cluster, "--holders", "2"]
    h1 = start([*args, "--operation", "h1", str(hosts[0]), "--", *tick(history, "h1", "hold")])
    expect_line(h1)
    h2 = start([*args, "--operation", "h2", str(hosts[0]), "--", *tick(history, "h2", "hold")])
    expect_line(h2)
    waiter = start([*args, "--ttl", "30", *coalesce(hosts[0], "tick", "-v"), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    absorbed = run([*args, *coalesce(hosts[1]), *tick(history, "a")])
    assert "noop-coalesced" in absorbed.stderr, absorbed.stderr
    # The waiter gets in when one place is free (before: "once cluster lock ... is free").
    assert "once a place among the 2 holders of cluster lock " in absorbed.stderr, absorbed.stderr
    waiter.kill()
    waiter.wait(timeout=TIMEOUT)
    h2.stdin.close()
    assert h2.wait(timeout=TIMEOUT) == 0  # the dead waiter's key takes its place
    nxt = start([*args, *coalesce(hosts[0], "tick"), *tick(history, "next")], stdin=None)
    seen = expect_stderr(nxt, "died in the queue of cluster lock")
    assert any("this run waits in its place and runs for them" in x for x in seen), seen
    h1.stdin.close()
    (held, _), (status, err) = finish([h1, nxt])
    assert held == 0 and status == 0, err
    assert ticks(history) == ["h1", "h2", "next"], ticks(history)
    look = run([*cluster, "--inspect", "--check", str(hosts[0])])
    assert look.returncode == 0 and "never ran" not in look.stdout, look.stdout


def test_a_waiter_that_gets_the_cluster_lock_but_not_the_local_one_says_its_absorbed_runs_never_ran(
        cluster, hosts, tmp_path):
    """The waiter takes the cluster lock, then its -w passes on the local
    lock (a flock(1) holder on its host): the runs it absorbed never ran,
    and it says so. Before, it took their notes with the cluster lock, said
    it ran for them, then gave up: the ticks were lost unseen."""
    from conftest import flock_holder, release
    history = tmp_path / "history"
    holder = start([*cluster, "--operation", "tick", str(hosts[0]), "--", *tick(history, "holder", "hold")])
    expect_line(holder)
    local = flock_holder(hosts[1] / ".state.lock")
    try:
        waiter = start([*cluster, *coalesce(hosts[1], "tick", "-v", "-w", "30"), *tick(history, "w")], stdin=None)
        wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
        for label, h in (("a", hosts[0]), ("b", hosts[1])):
            assert "noop-coalesced" in run([*cluster, *coalesce(h), *tick(history, label)]).stderr
        holder.stdin.close()
        assert holder.wait(timeout=TIMEOUT) == 0
        seen = expect_stderr(waiter, "acquired on etcd")  # it holds the cluster lock, and waits for the local one
        assert not any("runs for them" in x for x in seen), seen
        os.kill(waiter.pid, signal.SIGTERM)
        assert waiter.wait(timeout=TIMEOUT) == -signal.SIGTERM
        err = waiter.stderr.read()
        assert ("the 2 later runs of tick this run absorbed in the queue of cluster lock " in err
                and "never ran: this run ended before its command" in err), err
        assert "runs for them" not in err, err
    finally:
        release(local)
    assert ticks(history) == ["holder"]


def test_keys_under_absorbed_that_are_not_notes_are_named_and_cleared(etcd, cluster, hosts, tmp_path):
    """Whatever was put under looplock/NAME/absorbed/ by hand (another
    shape of key, a value that is not a note, a note without its waiter):
    --inspect names each with the etcdctl del that removes it, and the next
    coalescing run that takes the lock deletes them. Before, only two-part
    keys were seen, and a note without its waiter was "absorbed by pid 0"."""
    history = tmp_path / "history"
    root = f"looplock/{cluster[3]}/absorbed/"
    junk = {f"{root}junk": "x", f"{root}a/b/c": "x", root: "x", f"{root}123/456": "not json",
            f"{root}124/457": '{"operation":"tick","started_ms":1}'}
    for key, value in junk.items():
        assert etcd.ctl("put", key, value).returncode == 0
    look = run([*cluster, "--inspect", "--check", str(hosts[0])])
    assert look.returncode == 1, look.stdout
    for key in junk:
        assert f"(not a looplock note): key {key};" in look.stdout, (key, look.stdout)
    assert "pid 0" not in look.stdout, look.stdout
    r = run([*cluster, *coalesce(hosts[0]), *tick(history, "next")])
    assert r.returncode == 0 and "pid 0" not in r.stderr, r.stderr
    left = etcd.ctl("get", "--prefix", "--keys-only", root)
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout
    assert run([*cluster, "--inspect", "--check", str(hosts[0])]).returncode == 0


@pytest.mark.parametrize("end", ["deadline", "term"])
def test_with_once_per_a_waiter_that_absorbed_gives_up_as_any_and_never_waits_on_for_the_slot(cluster, hosts,
                                                                                            tmp_path, end):
    """--once-per: the slot's run holds the lock; a coalescing waiter that
    absorbed a tick reaches its -w (or is TERMed). It gives up as any
    coalescing waiter does: 75 (or it dies of TERM), counting the tick it
    absorbed. Before, --once-per made it wait on for the slot's run and then
    skip as "already run" (exit 0), and the tick (or the signal) was lost
    unseen."""
    history = tmp_path / "history"
    args = ["--once-per", "1h"]
    holder = start([*cluster, *args, *coalesce(hosts[0]), *tick(history, "holder", "hold")])
    expect_line(holder)
    bound = ["-w", "4"] if end == "deadline" else []
    waiter = start([*cluster, *args, *coalesce(hosts[1], "tick", "-v", *bound), *tick(history, "w")], stdin=None)
    wait_until(lambda: "waiting for cluster lock" in (waiter.stderr.readline() or ""), "the waiter to queue")
    assert "noop-coalesced" in run([*cluster, *args, *coalesce(hosts[0]), *tick(history, "b")]).stderr
    if end == "term":
        os.kill(waiter.pid, signal.SIGTERM)
    status = waiter.wait(timeout=TIMEOUT)
    err = waiter.stderr.read()
    assert status == (EX_TEMPFAIL if end == "deadline" else -signal.SIGTERM), err
    assert "the 1 later run of it that it absorbed" in err and "noop-already-run" not in err, err
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    assert ticks(history) == ["holder"]
    assert run([*cluster, "--inspect", "--check", str(hosts[0])]).returncode == 0
