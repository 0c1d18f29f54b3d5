"""Users (looplock(1): --agent; looplock-files(5)): looplock run by users
that /etc/passwd does not list, and files that a group shares.

- The static looplock never asks NSS for a user name (glibc would load the
  modules /etc/nsswitch.conf names, such as systemd's, into a static
  program, which crashes there): `nm` shows no NSS entry point, and every
  entry point runs as a uid without a passwd entry under
  "passwd: files systemd" (a private mount namespace binds that
  nsswitch.conf).
- A group shares a loop dir and a metrics dir: every file looplock creates
  there follows one mode rule (the lock file, run ledger and incidents file
  0660 less the umask; the metrics files node_exporter reads 0664 less the
  umask, their update lock 0660), so that under umask 002 every member of
  the group can run, and the modes never change afterwards.

Every subprocess has a timeout; holders print "ready" before the test goes on.
"""
import json
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import (EX_TEMPFAIL, LOOPLOCK, PY, TIMEOUT, blocked_waiters, expect_line, helper, incident_rows,
                      wait_until)

LOCK = ".state.lock"


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to run looplock as other users")
    for tool in ("setpriv", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"{tool}(1) is needed")


@pytest.fixture
def base(public_base):
    """A root-owned 0755 directory under /tmp that any uid can search."""
    need_root()
    return public_base


# --- no NSS in the static binary ----------------------------------------------------

# Entry points that load NSS modules: the passwd, group and shadow databases,
# and name resolution. (getgroups(2) is a system call, not NSS.)
NSS_SYMBOL = re.compile(r"^_*(getpw|getgrnam|getgrgid|getgrent|getgrouplist|initgroups|getspnam|getaddrinfo|"
                        r"gethostbyname|nss_module_load|nss_)")


def is_static(path):
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    return b"/ld-linux" not in head and b"ld-linux-x86-64" not in head


def test_the_static_binary_has_no_nss_entry_point():
    if not shutil.which("nm"):
        pytest.skip("nm(1) is needed")
    if not is_static(LOOPLOCK):
        pytest.skip("looplock is linked dynamically here (a sanitizer build): NSS works there")
    out = subprocess.run(["nm", LOOPLOCK], capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        pytest.skip(f"nm cannot read {LOOPLOCK}: {out.stderr.strip()}")
    names = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    assert names, "nm listed no symbols (a stripped binary cannot be checked)"
    found = sorted({n for n in names if NSS_SYMBOL.match(n)})
    assert found == [], f"the static looplock links NSS entry points: {found}"


NSSWITCH = "passwd: files systemd\ngroup: files systemd\nshadow: files\n"
# uids (and their group) that /etc/passwd does not list.
U1, U2, U3 = 23451, 23452, 23453
GID = 23450


def unlisted(uid):
    for line in Path("/etc/passwd").read_text().splitlines():
        if line.split(":")[2:3] == [str(uid)]:
            pytest.skip(f"uid {uid} is in /etc/passwd here")


@pytest.fixture
def as_unlisted(base):
    """argv prefix: in a private mount namespace whose /etc/nsswitch.conf says
    "passwd: files systemd", as uid U (group GID, no other groups), under
    umask 002 (the group's files are group-writable)."""
    for u in (U1, U2, U3):
        unlisted(u)
    conf = base / "nsswitch.conf"
    conf.write_text(NSSWITCH)
    os.chmod(conf, 0o644)
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            f"mount --bind {conf} /etc/nsswitch.conf && grep -q systemd /etc/nsswitch.conf"],
                           capture_output=True, text=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount nsswitch.conf in a mount namespace here: {probe.stderr.strip()}")

    def prefix(uid):
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'umask 002 && mount --bind {conf} /etc/nsswitch.conf && exec "$@"', "sh",
                "setpriv", f"--reuid={uid}", f"--regid={GID}", "--clear-groups"]

    return prefix


def test_every_entry_point_runs_as_a_uid_without_a_passwd_entry(base, as_unlisted):
    """A run, a skip, a timeout, --once-per, --metrics-dir, and --inspect of a
    holder and a waiter of other unlisted uids: no crash, the agent is the
    number."""
    d = base / "loop"
    d.mkdir()
    os.chown(d, U1, GID)
    os.chmod(d, 0o2770)
    metrics = base / "metrics"
    metrics.mkdir()
    os.chown(metrics, U1, GID)

    def looplock(uid, *args, **kw):
        return subprocess.run([*as_unlisted(uid), LOOPLOCK, *map(str, args)], capture_output=True, text=True,
                              timeout=TIMEOUT, cwd="/", **kw)

    r = looplock(U1, "--metrics-dir", metrics, d, "--", "true")
    assert (r.returncode, r.stderr) == (0, ""), r
    assert json.loads((d / LOCK).read_text())["agent_id"] == str(U1)
    assert list(metrics.glob("looplock_*.prom")), list(metrics.iterdir())
    r = looplock(U1, "--once-per", "1m", "--operation", "tick", d, "--", "true")
    assert (r.returncode, r.stderr) == (0, ""), r
    r = looplock(U1, "--once-per", "1m", "--operation", "tick", d, "--", "true")
    assert r.returncode == 0 and "noop-already-run" in r.stderr, r
    assert f"(agent {U1})" in r.stderr, r.stderr

    # A holder (uid U2) and a waiter (uid U3), both unlisted; the lock file
    # is U1's (DIR's owner), 0660 in group GID.
    holder = subprocess.Popen([*as_unlisted(U2), LOOPLOCK, "-p", "blocking", str(d), "--", PY,
                               helper("wait_stdin.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd="/")
    waiter = None
    try:
        expect_line(holder, "ready")
        r = looplock(U1, "-p", "single_flight", d, "--", "true")
        assert r.returncode == 0 and "noop-locked" in r.stderr and f"agent {U2}" in r.stderr, r
        r = looplock(U1, "-w", "0.1", d, "--", "true")
        assert r.returncode == EX_TEMPFAIL and "lock_acquire_timeout" in r.stderr, r
        assert incident_rows(d)[-1]["waiter"]["agent_id"] == str(U1)
        waiter = subprocess.Popen([*as_unlisted(U3), LOOPLOCK, "-p", "blocking", "--operation", "waits", str(d),
                                   "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        wait_until(lambda: blocked_waiters(d / LOCK), "the waiter to block in flock(2)")
        r = looplock(U1, "--inspect", "--json", d)
        assert r.returncode == 0, r
        report = json.loads(r.stdout)
        assert report["record"]["holder"]["agent_id"] == str(U2), report
        (w,) = report["waiters"]
        assert (w["agent_id"], w["operation"]) == (str(U3), "waits"), w
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
        if waiter:
            waiter.wait(timeout=TIMEOUT)
    assert holder.returncode == 0 and waiter.returncode == 0, (holder.stderr.read(), waiter.stderr.read())


# --- a group shares a loop dir and a metrics dir -----------------------------------


def member(uid, umask="002"):
    """argv prefix: as uid (group GID) under `umask`."""
    return ["setpriv", f"--reuid={uid}", f"--regid={GID}", "--clear-groups", "sh", "-c", f'umask {umask}; exec "$@"',
            "sh"]


def as_member(uid, *args, umask="002"):
    return subprocess.run([*member(uid, umask), LOOPLOCK, *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd="/")


def group_dirs(base):
    """DIR and METRICS, given to group GID (setgid, group-writable): the
    looplock-files(5)'s recipe for a loop a group shares."""
    for u in (U1, U2):
        unlisted(u)
    d, metrics = base / "loop", base / "metrics"
    for x in (d, metrics):
        x.mkdir()
        os.chown(x, 0, GID)
        os.chmod(x, 0o2770)
    # DIR's owner makes the lock file once (a member's would be refused).
    subprocess.run(["install", "-m", "0660", "-g", str(GID), "/dev/null", str(d / LOCK)], check=True, timeout=TIMEOUT)
    return d, metrics


def modes(directory):
    return {p.name: stat_mode(p) for p in directory.iterdir()}


def stat_mode(p):
    return os.lstat(p).st_mode & 0o7777


def counts(metrics, outcome="success"):
    """looplock_runs_total{outcome=...} over every operation."""
    (prom,) = metrics.glob("looplock_*.prom")
    found = re.findall(r'looplock_runs_total\{[^}]*,outcome="' + outcome + r'"\} (\d+)', prom.read_text())
    return sum(int(n) for n in found)


def test_a_group_shares_a_metrics_dir_under_umask_002_every_member_updates_it(base):
    d, metrics = group_dirs(base)
    # Each run its own slot (an operation of its own) in the shared ledger,
    # and one series of the shared metrics file.
    for i, uid in enumerate([U1, U2, U1, U2, U2, U1]):
        r = as_member(uid, "--metrics-dir", metrics, "--once-per", "1m", "--operation", f"tick{i}", d, "--", "true")
        assert (r.returncode, r.stderr) == (0, ""), (uid, r)
        assert counts(metrics) == i + 1, (uid, next(metrics.glob("*.prom")).read_text())
    r = as_member(U2, "--once-per", "1m", "--operation", "tick0", d, "--", "true")
    assert r.returncode == 0 and "noop-already-run" in r.stderr and f"(agent {U1})" in r.stderr, r
    m = modes(metrics)
    lock_name = next(n for n in m if n.endswith(".prom.lock"))
    assert m[lock_name] == 0o660, m
    assert all(mode == 0o664 for name, mode in m.items() if name != lock_name), m  # .prom, .prom.next
    assert not [n for n in m if n.endswith(".tmp")], m
    assert modes(d) == {".state.lock": 0o660, ".state.lock.runs.json": 0o660}, modes(d)


def test_under_umask_077_the_files_are_the_creators_alone_and_never_chmodded(base):
    d, metrics = group_dirs(base)
    r = as_member(U1, "--metrics-dir", metrics, d, "--", "true", umask="077")
    assert (r.returncode, r.stderr) == (0, ""), r
    m = modes(metrics)
    assert sorted(m.values()) == [0o600, 0o600], m  # the file and its update lock; no staging file yet
    (lock,) = metrics.glob(".looplock_*.prom.lock")
    # A second member cannot update them: one warning, never another status.
    r = as_member(U2, "--metrics-dir", metrics, d, "--", "true")
    assert r.returncode == 0, r
    assert "cannot update the metrics" in r.stderr and "Permission denied" in r.stderr and "chmod g+rw" in r.stderr
    r = as_member(U2, "-q", "--metrics-dir", metrics, d, "--", "true")
    assert (r.returncode, r.stderr) == (0, ""), r
    # The creator under umask 002: files made now are 0664; the update
    # lock keeps its mode (looplock never changes one).
    r = as_member(U1, "--metrics-dir", metrics, d, "--", "true")
    assert (r.returncode, r.stderr) == (0, ""), r
    assert stat_mode(lock) == 0o600
    assert [mode for name, mode in modes(metrics).items() if name.endswith(".prom.next")] == [0o600]
    assert [mode for name, mode in modes(metrics).items() if name.endswith(".prom")] == [0o664]


def test_a_metrics_file_a_member_made_unreadable_is_never_replaced_without_its_counters(base):
    """One member's run under umask 077 leaves the shared metrics file its
    own (0600): the next member's run cannot read it, so it warns and
    leaves it as it is, with every counter. Before, it wrote a new file
    from nothing: 3 runs of a and 1 of b became 1 run of a."""
    d, metrics = group_dirs(base)
    for _ in range(3):
        r = as_member(U1, "--metrics-dir", metrics, "--operation", "a", d, "--", "true")
        assert (r.returncode, r.stderr) == (0, ""), r
    r = as_member(U2, "--metrics-dir", metrics, "--operation", "b", d, "--", "true", umask="077")
    assert r.returncode == 0, r
    assert counts(metrics) == 4
    r = as_member(U1, "--metrics-dir", metrics, "--operation", "a", d, "--", "true")
    assert r.returncode == 0, r
    if stat_mode(next(metrics.glob("looplock_*.prom"))) & 0o040:  # still group-readable: updated
        assert (r.stderr, counts(metrics)) == ("", 5), r
    else:
        assert "so it was not updated (its counters would be lost)" in r.stderr and "chmod g+rw" in r.stderr, r
        assert counts(metrics) == 4


def test_a_0644_update_lock_of_an_earlier_version_still_serves_a_second_member(base):
    d, metrics = group_dirs(base)
    r = as_member(U1, "--metrics-dir", metrics, "--operation", "tick", d, "--", "true")
    assert r.returncode == 0, r
    (lock,) = metrics.glob(".looplock_*.prom.lock")
    os.chmod(lock, 0o644)  # as looplock 0.1 and 0.2 before this fix made it
    r = as_member(U2, "--metrics-dir", metrics, "--operation", "tick", d, "--", "true")
    assert (r.returncode, r.stderr) == (0, ""), r
    assert counts(metrics) == 2
    assert stat_mode(lock) == 0o644
    # Any user could hold it and stall every update: --inspect says how to fix it.
    i = as_member(U2, "--inspect", "--check", "--metrics-dir", metrics, d)
    assert i.returncode == 1 and "any local user can open this update lock" in i.stdout and "chmod 0660" in i.stdout, i


def test_inspect_judges_the_group_files_for_the_caller_and_check_fails_on_them(base):
    """Made by one member under umask 077, the run ledger, the incidents
    file and the metrics files are that member's alone: every --once-per
    run of another member exits 73, its timeouts lose their rows, its
    metrics updates fail. --inspect by that member says so, with the fix,
    and --check fails; for their creator there is nothing to say."""
    d, metrics = group_dirs(base)
    r = as_member(U1, "--metrics-dir", metrics, "--once-per", "1m", "--operation", "tick", d, "--", "true",
                  umask="077")
    assert (r.returncode, r.stderr) == (0, ""), r
    flock = subprocess.Popen(["flock", str(d / LOCK), "sh", "-c", "echo ready; read x"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        expect_line(flock, "ready")
        r = as_member(U1, "-w", "0", d, "--", "true", umask="077")  # U1's incidents file, 0600
        assert r.returncode == EX_TEMPFAIL, r
    finally:
        flock.stdin.close()
        flock.wait(timeout=TIMEOUT)
    assert stat_mode(d / ".state.lock.runs.json") == 0o600 and stat_mode(d / ".state.lock.incidents.jsonl") == 0o600

    r = as_member(U2, "--log-format", "json", "--once-per", "1m", "--operation", "other", d, "--", "true")
    assert r.returncode == 73, r
    line = json.loads(r.stderr.splitlines()[-1])
    assert line["event"] == "run_ledger_unusable" and "Permission denied" in line["message"], line
    assert "chmod g+rw" in line["hint"], line

    i = as_member(U2, "--inspect", "--check", "--json", "--metrics-dir", metrics, d)
    assert i.returncode == 1, i
    warnings = json.loads(i.stdout)["warnings"]
    assert any(".state.lock.runs.json: every --once-per run by you exits 73: you cannot read it (owner uid "
               f"{U1}, mode 0600)" in w for w in warnings), warnings
    assert any(".state.lock.incidents.jsonl: your runs' incident rows are lost" in w for w in warnings), warnings
    assert any(".prom.lock: your runs cannot update the metrics" in w for w in warnings), warnings
    assert any(".prom: only uid" in w and "node_exporter" in w for w in warnings), warnings
    # The fixes are for whoever can make them: the files' owner, or root.
    assert all(f"Ask its owner (uid {U1}) or root" in w for w in warnings if "chgrp" in w), warnings
    assert "its owner (uid 23451) or root lets the group" in line["hint"], line
    # Their creator: only what the collector cannot read.
    i = as_member(U1, "--inspect", "--json", "--metrics-dir", metrics, d)
    mine = [w for w in json.loads(i.stdout)["warnings"] if "/.state.lock." in w or ".prom" in w]
    assert len(mine) == 1 and ".prom: only uid" in mine[0], mine


def test_a_member_holding_the_lock_is_no_warning_for_inspect_check(base):
    """In looplock-files(5)'s group recipe a member who is neither the lock
    file's owner nor DIR's holds the lock as it should: --inspect --check by
    another member passes while it does. The control: a user outside the
    group holding it (the file made readable to all) is named."""
    d, _ = group_dirs(base)
    holder = subprocess.Popen([*member(U2), LOOPLOCK, "-p", "blocking", str(d), "--", PY, helper("wait_stdin.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        expect_line(holder, "ready")
        i = as_member(U1, "--inspect", "--check", d)
        assert i.returncode == 0, i
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
    os.chmod(d, 0o2775)  # others may reach it
    os.chmod(d / LOCK, 0o664)  # and open it
    outsider = subprocess.Popen(["setpriv", "--reuid=23459", "--regid=23459", "--clear-groups", PY, "-c",
                                 "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\n"
                                 "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('ready', flush=True)\nsys.stdin.read()\n",
                                 str(d / LOCK)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        expect_line(outsider, "ready")
        i = as_member(U1, "--inspect", "--check", d)
        assert i.returncode == 1 and "holds the lock as uid 23459" in i.stdout, i
    finally:
        outsider.stdin.close()
        outsider.wait(timeout=TIMEOUT)


def test_inspect_by_a_user_who_cannot_read_the_files_says_so(base):
    """A user outside the loop's group may search DIR but not read its lock
    file or incidents file (0640, as looplock makes them under umask 022):
    --inspect says it cannot read them, names the holder as the kernel shows
    it without calling it another tool's, and never reports the incidents
    as none."""
    d = base / "loop"
    d.mkdir()
    os.chmod(d, 0o755)
    assert subprocess.run([LOOPLOCK, d, "--", "true"], timeout=TIMEOUT).returncode == 0  # makes the lock file
    flock = subprocess.Popen(["flock", str(d / LOCK), "sh", "-c", "echo ready; read x"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        expect_line(flock, "ready")
        r = subprocess.run([LOOPLOCK, "-w", "0", d, "--", "true"], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == EX_TEMPFAIL, r
    finally:
        flock.stdin.close()
        flock.wait(timeout=TIMEOUT)
    holder = subprocess.Popen([LOOPLOCK, "-p", "blocking", str(d), "--", PY, helper("wait_stdin.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        expect_line(holder, "ready")
        assert stat_mode(d / LOCK) == 0o640 and stat_mode(d / ".state.lock.incidents.jsonl") == 0o640
        i = subprocess.run(["setpriv", f"--reuid={U3}", f"--regid={U3}", "--clear-groups", LOOPLOCK, "--inspect", d],
                           capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        j = subprocess.run(["setpriv", f"--reuid={U3}", f"--regid={U3}", "--clear-groups", LOOPLOCK, "--inspect",
                            "--json", d], capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
    assert i.returncode == 0, i
    assert "record    not read: Permission denied" in i.stdout, i.stdout
    assert "(looplock): its holder record cannot be read here" in i.stdout, i.stdout
    assert "flock(1), Python fcntl.flock or another tool" not in i.stdout, i.stdout
    assert "incidents not read: Permission denied" in i.stdout, i.stdout
    report = json.loads(j.stdout)
    assert report["record"]["status"] == "unread", report["record"]
    assert report["incidents"]["count"] is None and report["incidents"]["error"] == "Permission denied"


def test_a_member_holding_a_lock_file_it_may_only_read_is_named_as_a_looplock(base):
    """The group recipe under umask 022: a member made the lock file 0640, so
    another member's looplock locks it read-only and writes no record (it
    says so, with the fix). --inspect names that holder as a looplock that
    may only read the file, not as another tool's, and --check passes."""
    d, _ = group_dirs(base)
    (d / LOCK).unlink()
    assert as_member(U2, d, "--", "true", umask="022").returncode == 0  # U2 makes it, 0640
    assert stat_mode(d / LOCK) == 0o640
    holder = subprocess.Popen([*member(U3), LOOPLOCK, "-p", "blocking", str(d), "--", PY, helper("wait_stdin.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        expect_line(holder, "ready")
        i = as_member(U1, "--inspect", "--check", d)
        # Every report names the holder the same way (the verdict is judged
        # once): the timeout line, the skip line and the incident row too.
        timed_out = as_member(U1, "-w", "0.1", d, "--", "true")
        skipped = as_member(U1, "-p", "single_flight", "--log-format", "json", d, "--", "true")
        rows = incident_rows(d)
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
    err = holder.stderr.read()
    assert "is read-only for looplock" in err and f"its owner, uid {U2}, or root makes it group-writable" in err, err
    assert i.returncode == 0, i
    named = "(looplock): no holder record (the lock file is read-only for it"
    assert named in i.stdout, i.stdout
    assert "flock(1)" not in i.stdout, i.stdout
    assert timed_out.returncode == EX_TEMPFAIL, timed_out
    assert named in timed_out.stderr and "no looplock record" not in timed_out.stderr, timed_out.stderr
    line = json.loads(skipped.stderr)
    assert named in line["message"] and "without a current holder record" not in skipped.stderr, line
    (row,) = [r for r in rows if r["error_code"] == "lock_acquire_timeout"]
    assert not any("without a current holder record" in w for w in row.get("warnings", [])), row


def test_a_lock_file_a_member_made_under_umask_077_tells_dirs_owner_how_to_mend_it(base):
    d = base / "loop"
    d.mkdir()
    os.chown(d, U1, GID)
    os.chmod(d, 0o2770)
    assert as_member(U2, d, "--", "true", umask="077").returncode == 0  # U2 runs first: the lock file is 0600
    assert stat_mode(d / LOCK) == 0o600
    r = as_member(U1, d, "--", "true")
    assert r.returncode == 73 and "Permission denied" in r.stderr, r
    assert f"It is uid {U2}'s, mode 0600: as DIR's owner, replace it with one of your own" in r.stderr, r.stderr
    r = as_member(U3, d, "--", "true")
    assert r.returncode == 73 and "its owner or root lets the group that shares DIR read and write it" in r.stderr, r
    i = as_member(U1, "--inspect", "--check", d)
    assert i.returncode == 1 and "every run by you exits 73: you cannot open it" in i.stdout, i


def test_a_sticky_group_dir_shares_the_ledger_its_owner_made_and_refuses_a_members(base):
    """In a sticky DIR members cannot replace each other's files: a run
    ledger the first member made is refused for the others (with who may
    mend it); the one DIR's owner makes with looplock-files(5)'s recipe serves
    every member."""
    d, _ = group_dirs(base)
    os.chmod(d, 0o3770)
    r = as_member(U2, "--once-per", "1m", "--operation", "a", d, "--", "true")
    assert r.returncode == 0, r
    r = as_member(U3, "--once-per", "1m", "--operation", "b", d, "--", "true")
    assert r.returncode == 73 and "unsafe run ledger" in r.stderr and "ask DIR's owner (uid 0)" in r.stderr, r
    (d / ".state.lock.runs.json").unlink()
    subprocess.run(["install", "-m", "0660", "-g", str(GID), "/dev/null", str(d / ".state.lock.runs.json")],
                   check=True, timeout=TIMEOUT)
    for uid, op in ((U2, "a"), (U3, "b"), (U1, "c"), (U3, "a")):
        r = as_member(uid, "--once-per", "1m", "--operation", op, d, "--", "true")
        assert r.returncode == 0, (uid, op, r)
    assert "noop-already-run" in r.stderr  # a ran in this slot, by another member


def test_a_dir_its_own_owner_cannot_write_is_named_as_the_cause_and_inspect_warns(base):
    """DIR (its lock file made) turned 0555: its owner still locks it, but
    cannot create the run ledger or the incidents file there. The --once-per
    run's 73 names DIR as the cause (not a sticky DIR, not the ledger's mode),
    and --inspect warns of both files, so --check fails."""
    d = base / "ro-loop"
    d.mkdir()
    os.chown(d, U1, GID)
    assert as_member(U1, d, "--", "true").returncode == 0  # makes the lock file
    os.chmod(d, 0o555)
    r = as_member(U1, "--once-per", "1m", "--operation", "x", d, "--", "true")
    assert r.returncode == 73, r
    assert "You may not create files in DIR" in r.stderr and "mode 0555" in r.stderr, r.stderr
    assert "which is yours: make it writable (chmod u+w" in r.stderr, r.stderr
    assert "sticky" not in r.stderr and "chmod g+rw" not in r.stderr, r.stderr
    i = as_member(U1, "--inspect", "--check", d)
    assert i.returncode != 0, i
    assert ".state.lock.runs.json" in i.stdout and "you cannot create it in DIR" in i.stdout, i.stdout
    assert "incident rows are lost" in i.stdout, i.stdout
    assert "Make DIR writable for yourself (chmod u+w" in i.stdout and "Let DIR's owner" not in i.stdout, i.stdout
    # A member who may only read the lock file still runs there (a read
    # descriptor locks), so it is warned as a run by it would fare; one who
    # cannot open the lock file is told that, not of every file it would need.
    os.chmod(d / LOCK, 0o640)
    i = as_member(U2, "--inspect", "--check", d)
    assert i.returncode == 1 and "you cannot create it in DIR" in i.stdout, i
    assert "Let DIR's owner make DIR writable for you" in i.stdout, i.stdout
    os.chmod(d / LOCK, 0o600)
    i = as_member(U2, "--inspect", "--check", d)
    assert i.returncode == 1 and "you cannot open it" in i.stdout, i
    assert "you cannot create it in DIR" not in i.stdout and "incident rows are lost" not in i.stdout, i.stdout
    os.chmod(d / LOCK, 0o660)
    # The control: DIR writable again, the same run records its slot, and --inspect is quiet.
    os.chmod(d, 0o755)
    assert as_member(U1, "--once-per", "1m", "--operation", "x", d, "--", "true").returncode == 0
    i = as_member(U1, "--inspect", "--check", d)
    assert i.returncode == 0, i


def test_a_coalesce_seat_a_member_made_under_umask_077_never_costs_another_members_tick(base, tmp_path):
    """-p coalesce: the first member made the operation's seat under umask
    077 (0600, theirs); a second member who cannot write it is warned and
    waits for the lock without a seat, and its tick runs (no 73, no tick
    lost)."""
    d, _ = group_dirs(base)
    history = base / "history"
    history.touch()
    os.chmod(history, 0o666)
    tick = [PY, helper("slot_tick.py"), str(history)]
    holder = subprocess.Popen([*member(U1), LOOPLOCK, "--operation", "tick", d, "--", *tick, "holder", "hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    expect_line(holder)
    first = subprocess.Popen([*member(U1, "077"), LOOPLOCK, "-p", "coalesce", "--operation", "tick", d, "--", *tick,
                              "first"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    wait_until(lambda: first.pid in blocked_waiters(d / LOCK) or any(
        p in blocked_waiters(d / LOCK) for p in children_of(first.pid)), "the first coalescing tick to wait")
    [seat] = [p for p in d.iterdir() if p.name.startswith(".state.lock.coalesce.")]
    assert stat_mode(seat) == 0o600
    second = subprocess.Popen([*member(U2), LOOPLOCK, "-p", "coalesce", "--operation", "tick", d, "--", *tick,
                               "second"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    wait_until(lambda: len(blocked_waiters(d / LOCK)) == 2, "the second member's tick to wait without a seat")
    # --inspect tells the second member what its runs do (before: "exits 73").
    i = as_member(U2, "--inspect", d)
    assert ("a -p coalesce run of its operation that finds the lock held by you cannot take it: it says so "
            "(coalesce_unavailable) and waits for the lock without absorbing later runs") in i.stdout, i.stdout
    assert "exits 73" not in i.stdout, i.stdout
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0
    assert first.wait(timeout=TIMEOUT) == 0
    assert second.wait(timeout=TIMEOUT) == 0
    err = second.stderr.read()
    assert "-p coalesce cannot take the seat of tick (you may not write it (owner uid" in err, err
    assert "chmod g+rw" in err and "waits for the lock without absorbing later runs" in err
    ran = [line.split()[0] for line in history.read_text().splitlines()]
    assert sorted(ran) == ["first", "holder", "second"]


def test_a_seat_read_only_for_its_owner_gets_a_hint_its_owner_can_use(base, tmp_path):
    """Its owner took its own write permission away: the hint is chmod u+w
    (g+rw would not help), and the tick still runs."""
    d, _ = group_dirs(base)
    history = base / "history-ro"
    history.touch()
    os.chmod(history, 0o666)
    tick = [PY, helper("slot_tick.py"), str(history)]
    holder = subprocess.Popen([*member(U1), LOOPLOCK, "--operation", "other", d, "--", *tick, "holder", "hold"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    expect_line(holder)
    seat = d / (".state.lock.coalesce." + hashlib.sha256(b"tick").hexdigest()[:16])
    subprocess.run([*member(U1), "sh", "-c", f"touch {seat} && chmod 0444 {seat}"], check=True, timeout=TIMEOUT)
    r = subprocess.Popen([*member(U1), LOOPLOCK, "-p", "coalesce", "--operation", "tick", d, "--", *tick, "tick"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/")
    wait_until(lambda: len(blocked_waiters(d / LOCK)) == 1, "the tick to wait without a seat")
    holder.stdin.close()
    assert holder.wait(timeout=TIMEOUT) == 0 and r.wait(timeout=TIMEOUT) == 0
    err = r.stderr.read()
    assert f"you may not write it, though it is yours (mode 0444): make it writable (chmod u+w {seat})" in err, err
    assert "g+rw" not in err, err


def children_of(pid):
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_holders_a_members_index_made_under_umask_077_names_every_index_file_to_fix(base):
    """--holders: the fix names all the index files at once, not one a try."""
    d, _ = group_dirs(base)
    r = as_member(U1, "--holders", "3", d, "--", "true", umask="077")
    assert r.returncode == 0, r.stderr
    r = as_member(U2, "--holders", "3", d, "--", "true")
    assert r.returncode == 73, r.stderr
    assert f"chmod g+rw {d}/.state.lock.holders.*" in r.stderr, r.stderr
    subprocess.run(f"chmod g+rw {d}/.state.lock.holders.*", shell=True, check=True, timeout=TIMEOUT)
    r = as_member(U2, "--holders", "3", d, "--", "true")
    assert r.returncode == 0, r.stderr
