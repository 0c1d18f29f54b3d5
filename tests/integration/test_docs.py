"""The documentation says exactly what looplock prints (issue: docs tested
against output). Every sample in README.md and the man page (a fenced block
of stderr lines, an --inspect report, a holder record, an incident row, a
metrics file) and every stderr line quoted in their prose ("looplock: ...")
is compared with what real runs print, allowing for what varies from run to
run: pids, times, durations, lock ids and the loop directory's path (the
runs use TMP/loops/nightly, the docs /srv/loops/nightly). A sample wrapped
for width compares the same, and "..." in a sample stands for anything.

The runs: a holder (agent cron, operation status.py) with a waiter (agent ci,
operation deploy.py) behind it; a timeout and a skip behind it; --inspect
then; a holder killed with KILL, and --inspect after; a command that leaves a
daemon holding the lock; a wait on a terminal; a metrics directory. And with
a real etcd on loopback (skipped without one): a cluster lock holder with two
waiters queued behind it, and --inspect --etcd then.
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from etcdtest import ETCD, HELPER, start_member

from conftest import (LOOPLOCK, PY, TIMEOUT, blocked_waiters, expect_line, expect_stderr, helper, kill_and_wait_gone,
                      run, start, wait_until)

ROOT = Path(__file__).resolve().parents[2]
DOCS = {"README.md": ROOT / "README.md", "looplock(1)": ROOT / "man" / "looplock.1.scd"}
DOC_BASE = "/srv/loops"


def normalize(text, base):
    """What may differ between a documented sample and a real run, made equal."""
    t = text.replace(str(base), DOC_BASE)
    t = t.replace("\\\\", "\\")  # scdoc escapes a backslash
    t = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "<TS>", t)
    t = re.sub(r"\bhost \S+ pid\b", "host <HOST> pid", t)  # the cluster lock's hosts
    t = re.sub(r"\b[0-9a-f]{16}\b", "<ID>", t)
    t = re.sub(r"\b\d+(?:\.\d+)?(?:ms|s|m|h|d)\b", "<DUR>", t)
    t = re.sub(r"\d+(?:\.\d+)?", "<N>", t)
    return re.sub(r"\s+", " ", t).strip()


def found_in(sample, real, base):
    """Whether the sample (with "..." as a wildcard) is in the real text."""
    parts = [normalize(p, base) for p in sample.split("...")]
    hay = normalize(real, base)
    at = 0
    for p in parts:
        if not p:
            continue
        i = hay.find(p, at)
        if i < 0:
            return False
        at = i + len(p)
    return True


def doc_blocks():
    """(doc, kind, text) for every sample block of the docs."""
    out = []
    for doc, path in DOCS.items():
        text = path.read_text()
        for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
            block = m.group(1)
            first = block.lstrip().splitlines()[0] if block.strip() else ""
            if first.startswith("looplock: "):
                out.append((doc, "stderr", block))
            elif first.startswith("$ looplock --inspect --etcd"):
                out.append((doc, "cluster", block.split("\n", 1)[1]))
            elif first.startswith(("$ looplock --inspect", "lock      ")):
                out.append((doc, "inspect", block.replace("$ looplock --inspect /srv/loops/nightly\n", "")))
            elif first.startswith('{"schema":"file_lock_holder_v0"'):
                out.append((doc, "record", block))
            elif first.startswith('{"schema":"file_lock_incident_v0"'):
                out.append((doc, "incident", block))
            elif first.startswith("# HELP looplock_"):
                out.append((doc, "metrics", block))
        # Stderr lines quoted in prose.
        for m in re.finditer(r'"(looplock: [^"]+)"', text):
            out.append((doc, "stderr", m.group(1)))
    return out


BLOCKS = doc_blocks()


def ids(b):
    return f"{b[0]}:{b[1]}:{b[2].strip()[:40]}"


# --- the runs -------------------------------------------------------------------


class Runs:
    """Every text the documented situations make looplock print."""

    def __init__(self, base):
        self.base = base
        self.stderr = []
        self.inspect = []
        self.records = []
        self.incidents = []
        self.metrics = ""
        self.inspect_json = []
        self.log_json = []


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("docs") / "loops"
    scripts = base / "scripts"
    scripts.mkdir(parents=True)
    # The loop's scripts, named as in the docs.
    (scripts / "status.py").write_text((Path(helper("wait_stdin.py"))).read_text())
    (scripts / "deploy.py").write_text("import sys; sys.stdin.read()\n")
    (scripts / "monitor.sh").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(scripts / "monitor.sh", 0o755)
    loop = base / "nightly"
    loop.mkdir()
    metrics = base / "metrics"
    metrics.mkdir()
    R = Runs(base)
    env = {"LOOPLOCK_METRICS_DIR": str(metrics)}

    def looplock(args, **kw):
        r = run(args, env=env, **kw)
        R.stderr.append(r.stderr)
        return r

    # A tick holds the lock; another waits behind it.
    holder = start(["--agent", "cron", loop, "--", "python3", scripts / "status.py"], env=env)
    expect_line(holder, "ready")
    waiter = start(["--agent", "ci", "-w", "60", loop, "--", "python3", scripts / "deploy.py"], env=env)
    coalescer = None
    try:
        wait_until(lambda: waiter.pid in blocked_waiters(loop / ".state.lock"), "the waiter to block")
        for extra in (["-p", "single_flight"], ["-w", "0.1"]):
            r = run(["--log-format", "json", *extra, loop, "--", "true"], env=env)
            R.log_json += [json.loads(line) for line in r.stderr.splitlines()]
        for _ in range(3):
            looplock(["--agent", "ci", "-w", "0.2", loop, "--", "python3", scripts / "status.py"])
        looplock(["-p", "single_flight", loop, "--", scripts / "monitor.sh"])
        R.inspect.append(run(["--inspect", loop]).stdout)
        R.inspect_json.append(json.loads(run(["--inspect", "--json", loop]).stdout))
        R.records.append((loop / ".state.lock").read_text())
        R.incidents += [line for line in (loop / ".state.lock.incidents.jsonl").read_text().splitlines() if line]
        # -p coalesce: one tick waits, the next is absorbed by it.
        coalescer = start(["--agent", "cron", "-p", "coalesce", "--operation", "tick", loop, "--", "true"], env=env,
                          stdin=subprocess.DEVNULL)
        wait_until(lambda: coalescer.pid in blocked_waiters(loop / ".state.lock"), "the coalescing tick to wait")
        looplock(["-p", "coalesce", "--operation", "tick", loop, "--", "true"])
        r = run(["--log-format", "json", "-p", "coalesce", "--operation", "tick", loop, "--", "true"], env=env)
        R.log_json += [json.loads(line) for line in r.stderr.splitlines()]
        R.inspect_json.append(json.loads(run(["--inspect", "--json", loop]).stdout))
        # A wait on a terminal: its status line.
        master, slave = os.openpty()
        import fcntl
        import struct
        import termios
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 400, 0, 0))
        t = subprocess.Popen([LOOPLOCK, "-w", "3", str(loop), "--", "true"], stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        got, end = b"", time.monotonic() + TIMEOUT
        while b"left" not in got and time.monotonic() < end:
            try:
                got += os.read(master, 4096)
            except OSError:
                break
        t.wait(timeout=TIMEOUT)
        os.close(master)
        R.stderr.append(got.decode(errors="replace").replace("\r", "\n").replace("\x1b[K", ""))
    finally:
        holder.stdin.close()
        holder.wait(timeout=TIMEOUT)
        waiter.stdin.close()
        waiter.wait(timeout=TIMEOUT)
        if coalescer:
            coalescer.wait(timeout=TIMEOUT)
    # --holders 2: two deploys hold the lock, a third gives up.
    deploy = base / "deploy"
    deploy.mkdir()
    deploys = [start(["--holders", "2", "--agent", "ci", deploy, "--", "python3", scripts / "status.py"], env=env)
               for _ in range(2)]
    try:
        for d in deploys:
            expect_line(d, "ready")
        looplock(["--holders", "2", "--agent", "ci", "-w", "0.5", deploy, "--", "python3", scripts / "deploy.py"])
    finally:
        for d in deploys:
            d.stdin.close()
            d.wait(timeout=TIMEOUT)
    # A holder killed before it could release.
    killed = start(["--agent", "cron", loop, "--", "python3", scripts / "status.py"], env=env)
    expect_line(killed, "ready")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=TIMEOUT)
    wait_until(lambda: run(["--inspect", "--json", loop]).stdout.count('"held":false'), "the lock to be free")
    R.inspect.append(run(["--inspect", loop]).stdout)
    # A command that leaves a daemon holding the lock.
    r = looplock([loop, "--", PY, helper("spawn_daemon.py"), "30"])
    daemon = int(r.stdout)
    try:
        looplock(["-w", "0.1", loop, "--", "true"])
    finally:
        kill_and_wait_gone(daemon)
    # --once-per: a tick, then a second scheduler's in its slot; the ledger in --inspect.
    looplock(["--agent", "cron", "--once-per", "4m", "--operation", "tick", loop, "--", "true"])
    looplock(["--once-per", "4m", "--operation", "tick", loop, "--", "true"])
    R.inspect.append(run(["--inspect", loop]).stdout)
    R.inspect_json.append(json.loads(run(["--inspect", "--json", loop]).stdout))
    for args in (["-v", loop, "--", "true"], ["--max-time", "0.1", loop, "--", "sleep", "5"],
                 ["--once-per", "4m", "--operation", "tick", loop, "--", "true"],
                 ["-v", "--jitter", "10ms", "--max-time", "1", "--warn-before", "0.5", loop, "--", PY, "-c",
                  "import signal, time; signal.signal(signal.SIGUSR1, lambda *a: None); time.sleep(3)"]):
        r = run(["--log-format", "json", *args], env=env)
        R.log_json += [json.loads(line) for line in r.stderr.splitlines()]
    R.incidents += [line for line in (loop / ".state.lock.incidents.jsonl").read_text().splitlines() if line]
    R.metrics = "\n".join(p.read_text() for p in metrics.glob("*.prom"))
    return R


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
    """--inspect --etcd, text and JSON, while a holder (agent cron, operation
    status.py) has two waiters (agent ci, operation deploy.py) queued behind
    it on cluster lock nightly; None without etcd or looplock-etcd."""
    if not os.access(ETCD, os.X_OK) or not HELPER or not os.access(HELPER, os.X_OK):
        return None
    base = tmp_path_factory.mktemp("docs-cluster") / "loops"
    scripts = base / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "status.py").write_text((Path(helper("wait_stdin.py"))).read_text())
    (scripts / "deploy.py").write_text("import sys; sys.stdin.read()\n")
    hosts = [base / f"web-{i}" / "nightly" for i in (1, 2, 3)]
    for d in hosts:
        d.mkdir(parents=True)
    etcd = start_member()
    procs = []
    try:
        cl = ["--etcd", etcd.url]
        holder = start([*cl, "--agent", "cron", hosts[0], "--", "python3", scripts / "status.py"])
        procs.append(holder)
        expect_line(holder, "ready")
        for d in hosts[1:]:
            w = start(["-v", *cl, "--agent", "ci", "-p", "blocking", d, "--", "python3", scripts / "deploy.py"])
            procs.append(w)
            expect_stderr(w, "waiting for cluster lock")  # queued, before the next one
        text = run(["--inspect", *cl, hosts[0]]).stdout
        report = json.loads(run(["--inspect", "--json", *cl, hosts[0]]).stdout)
        assert [w["pid"] for w in report["cluster"]["waiting"]] == [p.pid for p in procs[1:]]
        return {"base": base, "text": text, "json": report}
    finally:
        for p in procs:
            p.stdin.close()
        for p in procs:
            p.wait(timeout=TIMEOUT)
        etcd.remove()


# --- the comparisons ---------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "stderr"], ids=ids)
def test_documented_stderr_lines_are_printed(runs, block):
    doc, _, sample = block
    pool = "\n".join(runs.stderr)
    # One documented line at a time: each must be what a run printed.
    lines = re.split(r"\n(?=looplock: )", sample.strip())
    for line in lines:
        assert any(found_in(line, real, runs.base) for real in runs.stderr), \
            f"{doc} quotes a line no run printed:\n{line}\n--- real output:\n{pool}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "inspect"], ids=ids)
def test_documented_inspect_reports_are_printed(runs, block):
    doc, _, sample = block
    assert any(found_in(sample, real, runs.base) for real in runs.inspect), \
        f"{doc}'s --inspect report differs from every real one:\n{sample}\n--- real reports:\n" + "\n".join(runs.inspect)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "cluster"], ids=ids)
def test_documented_cluster_reports_are_printed(cluster_runs, block):
    if cluster_runs is None:
        pytest.skip(f"{ETCD} or looplock-etcd is missing: the cluster samples cannot be compared")
    doc, _, sample = block
    real = cluster_runs["text"]
    assert found_in(sample, real, cluster_runs["base"]), \
        f"{doc}'s --inspect --etcd report differs from the real one:\n{sample}\n--- real report:\n{real}"


def shape(value, real, base, where=""):
    """The documented JSON value has the real one's keys, in order, and the
    same values but for what varies."""
    if isinstance(value, dict):
        assert isinstance(real, dict), where
        assert list(value) == list(real), f"{where}: keys {list(value)} != {list(real)}"
        for k in value:
            shape(value[k], real[k], base, f"{where}.{k}")
    elif isinstance(value, list):
        assert isinstance(real, list), where
        for a, b in zip(value, real):
            shape(a, b, base, where + "[]")
    else:
        assert type(value) is type(real) or (value is None) == (real is None), f"{where}: {value!r} vs {real!r}"
        if isinstance(value, str):
            assert normalize(value, base) == normalize(real, base), f"{where}: {value!r} vs {real!r}"


def doc_json(sample):
    return json.loads(re.sub(r"\s*\n\s*", " ", sample.strip()).replace('" "', '""'))


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] in ("record", "incident")], ids=ids)
def test_documented_records_and_rows_are_written(runs, block):
    _, kind, sample = block
    documented = doc_json(sample)
    reals = [json.loads(r.strip()) for r in (runs.records if kind == "record" else runs.incidents)]
    errors = []
    for real in reals:
        try:
            shape(documented, real, runs.base)
            return
        except AssertionError as e:
            errors.append(str(e))
    pytest.fail(f"the documented {kind} matches no real one: {errors}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b[1] == "metrics"], ids=ids)
def test_documented_metrics_file_is_written(runs, block):
    parser = pytest.importorskip("prometheus_client.parser")
    _, _, sample = block
    real = {(f.name, tuple(sorted(s.labels))): f for f in parser.text_string_to_metric_families(runs.metrics)
            for s in f.samples}
    for line in sample.splitlines():
        if line.startswith("# HELP") or line.startswith("# TYPE"):
            assert line in runs.metrics.splitlines(), line
    for fam in parser.text_string_to_metric_families(sample):
        for s in fam.samples:
            assert (fam.name, tuple(sorted(s.labels))) in real, s


def test_every_documented_sample_is_checked():
    """The classifier above sees the samples (so a renamed one is not
    silently skipped)."""
    kinds = {(doc, kind) for doc, kind, _ in BLOCKS}
    for doc in DOCS:
        assert (doc, "stderr") in kinds and (doc, "inspect") in kinds
    assert ("looplock(1)", "cluster") in kinds
    assert ("looplock(1)", "metrics") in kinds and ("looplock(1)", "record") in kinds


# --- what the man page lists ------------------------------------------------------------

MAN = DOCS["looplock(1)"].read_text()


def man_section(title):
    m = re.search(rf"^# {title}\n(.*?)(?=^# )", MAN, re.S | re.M)
    assert m, title
    return m.group(1)


def keys_of(value, out):
    if isinstance(value, dict):
        for k, v in value.items():
            out.add(k)
            keys_of(v, out)
    elif isinstance(value, list):
        for v in value:
            keys_of(v, out)
    return out


def test_the_man_page_names_every_json_key(runs, cluster_runs):
    """Of holder records, incident rows, --inspect --json reports (--etcd
    too) and log lines."""
    found = keys_of(cluster_runs["json"]["cluster"], {"cluster"}) if cluster_runs else set()
    for text in runs.records + runs.incidents:
        keys_of(json.loads(text.strip()), found)
    for obj in runs.inspect_json + runs.log_json:
        keys_of(obj, found)
    missing = sorted(k for k in found if f"*{k}*" not in MAN)
    assert not missing, f"JSON keys the man page does not name: {missing}"


SRC = ROOT / "src"


def events_in_source():
    events = set()
    for f in SRC.rglob("*.cpp"):
        text = f.read_text()
        events |= set(re.findall(r'\blog_?\.(?:error|warn|warn_always|result|verbose)\(\s*"([a-z_-]+)"', text))
        # An event given to Fatal: its last argument, a literal.
        for m in re.finditer(r"Fatal\(", text):
            call = text[m.end():text.find(";", m.end())]
            last = re.search(r',\s*(?:[a-z_]+ \? )?"([a-z]+(?:_[a-z]+)+)"(?:\s*:\s*"([a-z]+(?:_[a-z]+)+)")?\)\s*$', call)
            if last:
                events |= {e for e in last.groups() if e}
        # The event of a refusal (lockfile.cpp's Refusal{why, hint, event}).
        events |= set(re.findall(r'Refusal\{[^;]*?"([a-z]+(?:_[a-z]+)+)"\}', text, re.S))
    events |= set(re.findall(r'return "([a-z_]+)";', (SRC / "base" / "error.cpp").read_text()))
    events |= set(re.findall(r'\\"event\\":\\"([a-z_]+)\\"', (SRC / "cli" / "app.cpp").read_text()))
    return events


def test_the_man_page_lists_every_log_event():
    events = events_in_source()
    assert {"lock_acquire_timeout", "noop-locked", "usage_error", "unsafe_lock_file", "etcd_unreachable",
            "out_of_memory"} <= events, events  # the search above finds them
    table = man_section("LOG LINES")
    missing = sorted(e for e in events if f"|  *{e}*" not in table)
    assert not missing, f"events the LOG LINES table does not list: {missing}"


def test_the_man_page_lists_every_environment_variable():
    names = set(re.findall(r'"(LOOPLOCK_[A-Z_]+)"', (SRC / "base" / "environment.hpp").read_text()))
    assert len(names) > 10
    env = man_section("ENVIRONMENT")
    missing = sorted(n for n in names if f"*{n}*" not in env)
    assert not missing, f"variables ENVIRONMENT does not list: {missing}"


def test_the_man_page_lists_every_error_code(runs):
    codes = {json.loads(r)["error_code"] for r in runs.incidents} | {"lease_lost"}
    files = man_section("FILES")
    for code in codes:
        assert f"*{code}*" in files, code


def test_notify_on_knows_every_event_of_the_log_lines_table():
    """--notify-on refuses a name it does not know: its list (run/notify.cpp)
    is the LOG LINES table's events and started, ended, skipped."""
    src = (SRC / "run" / "notify.cpp").read_text()
    listed = src[src.index("constexpr std::array kEvents"):]
    listed = set(re.findall(r'"([a-z_\-]+)"', listed[:listed.index("};")]))
    table = set(re.findall(r"^\|  \*([a-z_\-]+)\*", man_section("LOG LINES"), re.M))
    assert listed == table | {"started", "ended", "skipped"}, (listed ^ (table | {"started", "ended", "skipped"}))
