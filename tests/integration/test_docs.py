"""The documentation says exactly what looplock prints (issue: docs tested
against output). Every sample in README.md and every man page of man/
(looplock(1) and the topic pages it names: a fenced block of stderr lines,
an --inspect report, a holder record, an incident row, a metrics file) and
every stderr line quoted in their prose ("looplock: ...") is compared with
what real runs print, allowing for what varies from run to
run: pids, times, durations, lock ids and the loop directory's path (the
runs use TMP/loops/nightly, the docs /srv/loops/nightly). A sample wrapped
for width compares the same, and "..." in a sample stands for anything.

The runs: a holder (agent cron, operation status.py) with a waiter (agent ci,
operation deploy.py) behind it; a timeout and a skip behind it; --inspect
then; a holder killed with KILL, and --inspect after; a command that leaves a
daemon holding the lock; a wait on a terminal; a metrics directory. And with
a real etcd on loopback (skipped without one): a cluster lock holder with two
waiters queued behind it, and --inspect --etcd then.

And the manual holds together: what the man pages list (every JSON key, log
event, environment variable, error code) is looked for in the page where it
lives now; looplock(1) renders to at most 1,000 lines at 80 columns, each of
its options' entries names the page that explains it, and every page is
self-contained (NAME, DESCRIPTION, SEE ALSO; no reference to a section it
does not have) and named in looplock(1)'s SEE ALSO.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from etcdtest import ETCD, HELPER, start_member

from conftest import (LOOPLOCK, PY, TIMEOUT, blocked_waiters, expect_line, expect_stderr, helper, kill_and_wait_gone,
                      run, start, wait_until)

ROOT = Path(__file__).resolve().parents[2]
MAN_DIR = ROOT / "man"


def man_pages():
    """{"looplock-files(5)": path} for every page of man/, named by its first
    line (scdoc's "NAME(SECTION) ...")."""
    pages = {}
    for path in sorted(MAN_DIR.glob("*.scd")):
        m = re.match(r"([a-z0-9-]+)\((\d)\) ", path.read_text())
        assert m, f"{path.name}: the first line does not name the page: NAME(SECTION) ..."
        pages[f"{m.group(1)}({m.group(2)})"] = path
    return pages


PAGES = man_pages()
DOCS = {"README.md": ROOT / "README.md", **PAGES}
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
    for doc, path in {**DOCS, "docs/HACKING.md": ROOT / "docs" / "HACKING.md"}.items():
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
    """The classifier above sees the samples, in the page each lives in (so a
    renamed or moved one is not silently skipped)."""
    kinds = {(doc, kind) for doc, kind, _ in BLOCKS}
    expected = {("README.md", "stderr"), ("README.md", "inspect"), ("looplock(1)", "stderr"),
                ("looplock-schedules(7)", "stderr"), ("looplock-sharing(7)", "stderr"),
                ("looplock-jobs(7)", "stderr"), ("looplock-inspect(7)", "inspect"),
                ("looplock-cluster(7)", "cluster"), ("looplock-files(5)", "record"),
                ("looplock-files(5)", "incident"), ("looplock-files(5)", "metrics")}
    assert expected <= kinds, sorted(expected - kinds)


# --- what the man pages list ------------------------------------------------------------

MAN = "\n".join(path.read_text() for path in PAGES.values())


def sections(text):
    """{title: body} of a page's top-level sections ("# TITLE"), read outside
    its fenced samples (where "# HELP ..." is a metrics line)."""
    out, title, fenced = {}, None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("# "):
            title = line[2:].strip()
            out[title] = ""
            continue
        if title is not None:
            out[title] += line + "\n"
    return out


def man_section(title, page=None):
    """The section TITLE of the page that has it (of `page` when given): the
    content moved between pages, the test looks for it where it lives."""
    found = [(p, sections(path.read_text())[title]) for p, path in PAGES.items()
             if (page is None or p == page) and title in sections(path.read_text())]
    assert len(found) == 1, f"section {title}: in {[p for p, _ in found] or 'no page'}"
    return found[0][1]


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
    assert not missing, f"JSON keys no man page names: {missing}"


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
    env = man_section("ENVIRONMENT", "looplock(1)")
    missing = sorted(n for n in names if f"*{n}*" not in env)
    assert not missing, f"variables looplock(1)'s ENVIRONMENT does not list: {missing}"


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


# --- the manual holds together ----------------------------------------------------------

MAX_LINES = 1000  # looplock(1) at 80 columns: what every user reads first


def render(path):
    """The page as man shows it at 80 columns (scdoc, then man -l)."""
    for tool, package in (("scdoc", "scdoc"), ("man", "man-db")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian package {package}): cannot render {path.name}")
    with open(path) as src:
        roff = subprocess.run(["scdoc"], stdin=src, capture_output=True, timeout=TIMEOUT)
    assert roff.returncode == 0, roff.stderr.decode()
    r = subprocess.run(["man", "-l", "-"], input=roff.stdout, capture_output=True, timeout=TIMEOUT,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MANWIDTH": "80", "LANG": "C.UTF-8",
                            "MAN_KEEP_FORMATTING": "", "MANPAGER": "cat", "PAGER": "cat"})
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode()


def test_looplock_1_renders_to_at_most_1000_lines():
    lines = len(render(PAGES["looplock(1)"]).splitlines())
    assert 100 < lines <= MAX_LINES, f"looplock(1) renders to {lines} lines at 80 columns (at most {MAX_LINES})"


def option_entries(page="looplock(1)"):
    """{term line: entry text} of a page's OPTIONS: an entry is a line that
    starts with an option ("*-p*, *--policy* _NAME_") and the indented lines
    below it."""
    entries, term = {}, None
    for line in man_section("OPTIONS", page).splitlines():
        if line.startswith("*-"):
            term = line
            entries[term] = ""
        elif term and (line.startswith("\t") or not line.strip()):
            entries[term] += line + "\n"
        else:
            term = None
    return entries


PAGE_REF = re.compile(r"\*(looplock(?:-[a-z]+)?)\*\((\d)\)")


def test_every_option_entry_in_looplock_1_names_a_page_that_exists():
    """Every option keeps a short entry in looplock(1), which names the page
    that explains it (or, for what looplock(1) itself explains, its
    section)."""
    entries = option_entries()
    assert len(entries) > 40 and any(t.startswith("*--once-per*") for t in entries), sorted(entries)
    own = set(sections(PAGES["looplock(1)"].read_text()))
    unnamed, missing = [], []
    for term, text in entries.items():
        pages = {f"{m.group(1)}({m.group(2)})" for m in PAGE_REF.finditer(text)} - {"looplock(1)"}
        titles = {t for t in re.findall(r"\*([A-Z][A-Z ]+[A-Z])\*", re.sub(r"\s+", " ", text)) if t in own}
        if not pages and not titles:
            unnamed.append(term)
        missing += [f"{term}: {p}" for p in sorted(pages) if p not in PAGES]
    assert not unnamed, f"option entries of looplock(1) that name no page (\"See *looplock-X*(7).\"): {unnamed}"
    assert not missing, f"option entries of looplock(1) that name a page man/ does not have: {missing}"
    # The detailed pages are the ones the entries name.
    named = {f"{m.group(1)}({m.group(2)})" for m in PAGE_REF.finditer("".join(entries.values()))}
    assert {"looplock-schedules(7)", "looplock-sharing(7)", "looplock-jobs(7)", "looplock-events(7)",
            "looplock-inspect(7)", "looplock-cluster(7)", "looplock-files(5)"} <= named, named


# Sections that no page has any more: a reference to one is a dangling one.
RETIRED_SECTIONS = {"CLUSTER", "WINDOWS"}


def prose(text):
    return re.sub(r"```.*?```", "", text, flags=re.S)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_page_is_self_contained(page):
    """Its own NAME, DESCRIPTION and SEE ALSO; every section it refers to
    ("see *FILES*", "*Durations* under *NOTES*") is on it, and every page it
    names exists; a section of another page is named with that page."""
    path = PAGES[page]
    name, section = page[:-1].split("(")
    assert path.name == f"{name}.{section}.scd", f"{path.name} is page {page}"
    text = path.read_text()
    own = sections(text)
    for title in ("NAME", "DESCRIPTION", "SEE ALSO"):
        assert title in own, f"{page} has no {title}"
    assert re.match(rf"\s*{re.escape(name)} - \S", own["NAME"]), own["NAME"]
    elsewhere = {t for p in PAGES.values() for t in sections(p.read_text())} | RETIRED_SECTIONS
    flat = re.sub(r"\s+", " ", prose(text))
    dangling = []
    for m in re.finditer(r"\*([A-Z][A-Z0-9 ,:'-]*[A-Z])\*", flat):
        if m.group(1) in elsewhere and m.group(1) not in own:
            dangling.append(m.group(0))
    for m in re.finditer(r"\b[Ss]ee (?:also )?([A-Z][A-Z ]+[A-Z])\b", flat):
        if m.group(1) not in own:
            dangling.append(m.group(0))
    subsections = {s for p in PAGES.values() for s in re.findall(r"^## (.+)$", prose(p.read_text()), re.M)}
    here = set(re.findall(r"^## (.+)$", prose(text), re.M))
    for m in re.finditer(r"\*([A-Z][a-z][^*]*)\*", flat):  # *Lock names in keys*: a subsection of this page
        if m.group(1) in subsections and m.group(1) not in here:
            dangling.append(m.group(0))
    for m in re.finditer(r"[*\"]([A-Za-z][^*\"]*)[*\"] under \*([A-Z][A-Z ]+[A-Z])\*", flat):
        sub, top = m.groups()
        if top not in own or f"\n## {sub}\n" not in "\n" + own[top]:
            dangling.append(m.group(0))
    assert not dangling, f"{page} refers to sections it does not have: {dangling}"
    unknown = sorted({f"{m.group(1)}({m.group(2)})" for m in PAGE_REF.finditer(text)} - set(PAGES))
    assert not unknown, f"{page} names pages man/ does not have: {unknown}"


def test_looplock_1_names_every_page_in_see_also():
    see_also = man_section("SEE ALSO", "looplock(1)")
    named = {f"{m.group(1)}({m.group(2)})" for m in PAGE_REF.finditer(see_also)}
    assert set(PAGES) - {"looplock(1)"} <= named, sorted(set(PAGES) - {"looplock(1)"} - named)
    for page in PAGES:
        if page != "looplock(1)":
            assert "*looplock*(1)" in man_section("SEE ALSO", page), f"{page}'s SEE ALSO does not name looplock(1)"


def test_the_documents_cite_only_the_repository():
    """The manual and the README stand alone: no path outside the
    repository."""
    for doc, path in {**DOCS, "docs/HACKING.md": ROOT / "docs" / "HACKING.md"}.items():
        text = path.read_text()
        assert "../" not in text and not re.search(r"\bSPEC(?:\.md)?\b", text), doc
