"""The benchmark report is a pure function of the results: scripts/benchlib's
figures.verdicts() and report.render() are run here on results built by
hand (no process, no file, no clock), and the text is checked: every
section in order, ratios computed from the numbers given (0.80 from 8 ms /
10 ms), targets shown met or not met as the numbers say, a --quick report
judging nothing, a skipped scenario saying why, and the "What was tried"
notes carried verbatim. No timing of this machine is involved."""
import copy
import subprocess
import sys

import pytest

from conftest import BENCH_SECTIONS, BENCH_TRIED, ROOT, bench_section

sys.path.insert(0, str(ROOT / "scripts"))
from benchlib import figures, machine, report  # noqa: E402

MS = 1_000_000  # nanoseconds

INFO = {
    "CPU": "Fixture CPU",
    "CPUs (nproc)": "2",
    "kernel": "6.0.0-fixture",
    "looplock": "looplock 0.0.0 (fixture)",
    "flock(1)": "flock from util-linux 2.38 (fixture)",
    "lock directory file system": "tmpfs",
    "date": "2026-01-01 00:00 UTC",
}
QUIET = ("0.50 0.40 0.30", "0.60 0.40 0.30")  # below 2 CPUs: no "busy machine" note


def ns(*millis):
    return [round(x * MS) for x in millis]


def uncontended():
    # Three repetitions of one run each. Medians: looplock 8 ms, flock 10,
    # bare 2, the empty wrapper 5, -F 6 against 5, metrics 8.4, --once-per 9.2.
    wall = {"looplock": ns(7, 8, 9), "flock": ns(9, 10, 11), "bare": ns(1, 2, 3), "empty": ns(4, 5, 6),
            "looplock -F": ns(5, 6, 7), "flock -F": ns(4, 5, 6), "looplock metrics": ns(8.4, 8.4, 8.4),
            "looplock once-per": ns(9.2, 9.2, 9.2), "looplock -x": ns(8.2, 8.2, 8.2),
            "looplock metrics env": ns(8.4, 8.4, 8.4)}
    cpu = {t: ns(1, 1, 1) for t in wall}
    cpu["looplock"], cpu["flock"] = ns(4, 4, 4), ns(5, 5, 5)
    return dict(tools=list(wall), wall=wall, cpu=cpu, reps=3, runs=1, warmup=1)


def contended():
    rows = [dict(n=1, m=3, per={"looplock": 5 * MS, "flock": 5 * MS, "bare": 2 * MS}, all={}),
            dict(n=2, m=3, per={"looplock": 4.5 * MS, "flock": 5 * MS, "bare": 2 * MS}, all={})]
    return dict(tools=["looplock", "flock", "bare"], rows=rows, reps=1)


def handoff():
    stats = {"looplock": {50: 1 * MS, 90: 1.2 * MS, 99: 1.5 * MS, 100: 1.6 * MS},
             "flock": {50: 1.25 * MS, 90: 1.5 * MS, 99: 2 * MS, 100: 2.5 * MS}}
    row = dict(n=2, k=3, gaps={"looplock": ns(1, 1, 1, 1.2, 1.6), "flock": ns(1, 1.25, 1.5, 2, 2.5)},
               overlaps={"looplock": 0, "flock": 0}, stats=stats)
    return dict(tools=["looplock", "flock"], rows=[row], hold_us=5000, reps=1)


def deadline():
    stats = {"looplock": {50: 3 * MS, 100: 25 * MS}, "flock": {50: 2 * MS, 100: 4 * MS}}
    return dict(tools=["looplock", "flock"], rows=[dict(deadline=0.05, runs=2, over={}, stats=stats)])


def memory():
    hwm = {"looplock": [1500, 1600, 1700], "flock": [1000, 1100, 1200], "sleep": [600, 650, 700]}
    rss = {"looplock": [1400, 1400, 1400], "flock": [900, 900, 900]}
    return dict(tools=["looplock", "flock"], hwm=hwm, rss=rss, reps=3, sleep="0.5")


def cluster():
    failover = {"looplock": {"direct": ns(30, 32, 34), "blackholed": ns(70, 72, 74)},
                "etcdctl": {"direct": ns(40, 40, 40), "blackholed": ns(1040, 1040, 1040)}}
    parts = {"helper": ns(26, 27, 28), "looplock --version": ns(2, 2, 2), "looplock-etcd --version": ns(8, 8, 8),
             "etcdctl version": ns(20, 20, 20)}
    scale_row = dict(waiters=10, runs=22, tools={
        "looplock": dict(gaps=ns(10, 12, 14), requests=6.5, events=1.0, writes=3.1),
        "etcdctl": dict(gaps=ns(20, 22, 24), requests=9.0, events=1.05, writes=3.2)})
    return dict(tools=["looplock", "etcdctl"], wall={"looplock": ns(30, 32, 34), "etcdctl": ns(38, 40, 42)},
                parts=parts, reps=3, writes={"looplock": 3.0, "etcdctl": 3.0}, once_wall=ns(33, 35, 37),
                once_writes=5.0, hand={"looplock": ns(5, 6, 7), "etcdctl": ns(4, 5, 6)},
                runs=1, tmpfs=True, failover=failover, failover_runs=3, hold_us=5000, per_host=60,
                keepalives={3: 20, 10: 1}, hold_s=5, scale=[scale_row], stamp_missing=False)


def results():
    return dict(uncontended=uncontended(), contended=contended(), handoff=handoff(), deadline=deadline(),
                memory=memory(), cluster=cluster())


def render(res=None, quick=False, plot_note=None, tried=None, load=QUIET, short=False, others=0.03):
    res = results() if res is None else res
    return report.render(res, INFO, figures.verdicts(res), quick=quick, plot_note=plot_note, tried=tried,
                         elapsed=42.0, load_start=load[0], load_end=load[1], others=others, short=short)


def rows(body):
    """The cells of each table row in a part of the report (separators left
    out)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in body.splitlines() if line.startswith("|") and not line.startswith("|--")]


def targets(text):
    """The Targets table: target → (measured, verdict)."""
    return {r[0]: (r[1], r[2]) for r in rows(bench_section(text, "## Targets"))[1:]}


# What the fixture's numbers make of each target (spreads: the three
# repetitions' ratios, least..largest).
EXPECTED_TARGETS = {
    "uncontended wall time looplock / flock(1) ≤ 0.80": ("0.80 (0.78..0.82)", "met"),
    "uncontended (looplock − true) / (empty static vfork wrapper − true) ≤ 1.5": ("2.00 (2.00..2.00)", "**not met**"),
    "uncontended wall time looplock -F / flock -F ≤ 0.90": ("1.20 (1.17..1.25)", "**not met**"),
    "uncontended wall time looplock --metrics-dir / looplock ≤ 1.05": ("1.05 (0.93..1.20)", "met"),
    "uncontended wall time looplock --once-per / looplock ≤ 1.10": ("1.15 (1.02..1.31)", "**not met**"),
    "contended time per run looplock / flock(1) ≤ 1.00 at every N": ("worst 1.00", "met"),
    "hand-off p50 looplock ≤ flock(1) at every N": ("worst p50 ratio 0.80", "met"),
    "hand-off p99 looplock < 2 ms at every N": ("worst 1.500 ms", "met"),
    "deadline overshoot looplock p50 < 5 ms": ("worst 3.000 ms", "met"),
    "deadline overshoot looplock max < 20 ms": ("25.000 ms", "**not met**"),
    "peak memory looplock ≤ flock(1) + 1 MiB": ("+500 KiB", "met"),
    "cluster: uncontended looplock --etcd / etcdctl lock ≤ 0.60": ("0.80 (0.79..0.81)", "**not met**"),
    "cluster: hand-off p50 looplock --etcd ≤ etcdctl lock": ("1.20", "**not met**"),
    "cluster: --once-per adds ≤ 2 etcd writes per run": ("+2.0 writes", "met"),
    "cluster: holder keepalives in a hold = hold / renewal interval (± 1) at --ttl 3 and 10":
        ("largest difference 0.5", "met"),
    "cluster: waiters woken per release ≤ 1.1 at every number of waiters": ("worst 1.0", "met"),
}


def test_every_section_is_there_in_order():
    text = render()
    positions = [text.find(s) for s in BENCH_SECTIONS]
    assert all(p >= 0 for p in positions), [s for s, p in zip(BENCH_SECTIONS, positions) if p < 0]
    assert positions == sorted(positions), "sections out of order"
    table = dict((r[0], r[1]) for r in rows(bench_section(text, "## Machine"))[1:])
    assert {k: table[k] for k in INFO} == INFO
    assert table["load average (start → end; the bench's own scenarios raise it)"] == f"{QUIET[0]} → {QUIET[1]}"
    assert table["CPU used by other processes during the run (/proc/stat less the bench's own)"] == \
        "0.03 CPUs on average"
    assert table["bench wall time"] == "42 s"
    assert "Busy machine" not in text and "Smoke run" not in text
    assert "Generated by `scripts/bench`:" in text


def test_the_targets_are_met_or_not_as_the_numbers_say():
    assert targets(render()) == EXPECTED_TARGETS
    met = {t.name: t.met for t in figures.verdicts(results())}
    assert met == {name: verdict == "met" for name, (_, verdict) in EXPECTED_TARGETS.items()}


def test_the_ratios_are_computed_from_the_numbers():
    text = render()
    body = bench_section(text, "## 1. Uncontended")
    ratios = {r[0]: r[1:] for r in rows(body)[11:]}
    assert ratios == {
        "ratio": ["wall", "spread over 3 repetitions", "CPU"],
        "looplock / flock(1)": ["0.80", "0.78..0.82", "0.80"],  # 8 / 10; 7 / 9, 9 / 11; CPU 4 / 5
        # (8 − 2) / (10 − 2); CPU (4 − 1) / (5 − 1)
        "(looplock − true) / (flock(1) − true), overhead": ["0.75", "0.75..0.75", "0.75"],
        "(looplock − true) / (empty wrapper − true): looplock's cost against the least any wrapper costs":
            ["2.00", "2.00..2.00", "—"],  # (8 − 2) / (5 − 2); CPU (4 − 1) / (1 − 1): none
        "looplock -F / flock -F": ["1.20", "1.17..1.25", "1.00"],  # 6 / 5
        "(looplock -F − true) / (flock -F − true), overhead": ["1.33", "1.33..1.33", "—"],  # (6 − 2) / (5 − 2)
        "looplock --metrics-dir / looplock (what the metrics file costs a run; 0.400 ms)":
            ["1.05", "0.93..1.20", "0.25"],  # 8.4 / 8; CPU 1 / 4
        "looplock --once-per / looplock (the run ledger's read and two writes, a slot per run)":
            ["1.15", "1.02..1.31", "0.25"],  # 9.2 / 8; CPU 1 / 4
        "looplock -x / looplock (what one option on the command line costs: cxxopts declares it, and checks option "
        "names against `std::locale::classic()`, whose first use builds every facet)":
            ["1.02", "0.91..1.17", "0.25"],  # 8.2 / 8
        "LOOPLOCK_METRICS_DIR looplock / looplock (the metrics file's update alone)":
            ["1.05", "0.93..1.20", "0.25"],  # 8.4 / 8
    }
    tools = rows(body)[1:11]
    assert tools[0] == ["looplock", "`looplock DIR -- /bin/true`", "8.000", "7.200", "8.800", "4.000"]
    assert tools[3][0] == "empty"
    assert rows(bench_section(text, "## 2. Contended"))[1:] == [
        ["1", "3", "5.000", "5.000", "2.000", "1.00"], ["2", "3", "4.500", "5.000", "2.000", "0.90"]]
    assert rows(bench_section(text, "## 3. Hand-off"))[1] == [
        "2", "5", "1.000", "1.200", "1.500", "1.600", "1.250", "1.500", "2.000", "2.500", "0.80", "0.75"]
    assert rows(bench_section(text, "## 4. Deadline"))[1] == ["0.05", "2", "3.000", "25.000", "2.000", "4.000", "1.50"]
    memory = bench_section(text, "## 5. Memory")
    assert rows(memory)[1:] == [["looplock", "1600", "1700", "1400"], ["flock", "1100", "1200", "900"],
                                ["the command (`sleep`), for scale", "650", "700", "—"]]
    assert "looplock − flock(1): +500 KiB (ratio 1.45)." in memory
    cluster = bench_section(text, "## 6. Cluster lock")
    assert ("looplock / etcdctl: uncontended wall 0.80 (0.79..0.81 over 3 repetitions), hand-off p50 1.20."
            in cluster)
    assert "median 35.000 ms, 3.000 ms more than without; 5.0 etcd writes per run, +2.0." in cluster
    assert ["`looplock --etcd`", "32.000", "30.400", "33.600", "3.0", "6.000", "6.800", "7.000"] in rows(cluster)
    assert ["`etcdctl lock`", "40.000", "1040.000", "1040.000", "1000.000"] in rows(cluster)
    # The breakdown: 32 = 2 (start-up) + 5 (hop: 32 − 27) + 6 (loading: 8 − 2) + 19 (27 − 8).
    assert ["`looplock --etcd`", "start-up (static looplock)", "2.000"] in rows(cluster)
    assert ["`looplock --etcd`", "exec hop to looplock-etcd", "5.000"] in rows(cluster)
    assert ["`looplock --etcd`", "dynamic loading (libcurl and its libraries)", "6.000"] in rows(cluster)
    assert ["`looplock --etcd`", "etcd round trips and the run's work", "19.000"] in rows(cluster)
    assert ["`etcdctl lock`", "connection, round trips and the run's work", "20.000"] in rows(cluster)
    # Keepalives against the lease timing (0.25 s at --ttl 3, 3.33 s at 10).
    assert ["3", "20", "0.25", "20.0"] in rows(cluster)
    assert ["10", "1", "3.33", "1.5"] in rows(cluster)
    assert ["10", "`looplock --etcd`", "6.5", "1.00", "3.1", "12.000", "13.960"] in rows(cluster)
    assert ["10", "`etcdctl lock`", "9.0", "1.05", "3.2", "22.000", "23.960"] in rows(cluster)


def test_a_baseline_build_runs_side_by_side_and_its_ratios_follow_the_numbers():
    """scripts/bench --baseline REV: looplock as built at REV is two more
    tools of the uncontended scenario, with two ratios; the targets do not
    change. Without it, no such row."""
    res = results()
    u = res["uncontended"]
    u["wall"]["baseline"], u["wall"]["baseline -F"] = ns(7.5, 8, 8.5), ns(6, 6, 6)  # looplock 8, -F 6
    u["cpu"]["baseline"], u["cpu"]["baseline -F"] = ns(5, 5, 5), ns(1, 1, 1)  # looplock's CPU 4, -F 1
    u["tools"] += ["baseline", "baseline -F"]
    u["baseline"] = "v1 (commit 0123456789ab)"
    text = render(res)
    body = bench_section(text, "## 1. Uncontended")
    ratios = {r[0]: r[1:] for r in rows(body)}
    assert ratios["looplock / looplock at v1 (commit 0123456789ab) (this build against the earlier one, side by "
                  "side)"] == ["1.00", "0.93..1.06", "0.80"]  # 8 / 8; 7 / 7.5, 9 / 8.5; CPU 4 / 5
    assert ratios["looplock -F / looplock -F at v1 (commit 0123456789ab)"] == ["1.00", "0.83..1.17", "1.00"]
    assert ratios["baseline"][0] == "`looplock DIR -- /bin/true` as built at v1 (commit 0123456789ab) (`--baseline`)"
    assert targets(text) == EXPECTED_TARGETS
    assert "as built at" not in render()


@pytest.mark.parametrize("looplock, flock, shown, met", [
    (7, 10, "0.70", True), (8, 10, "0.80", True), (9, 10, "0.90", False), (10, 8, "1.25", False)])
def test_a_ratio_and_its_verdict_follow_the_numbers(looplock, flock, shown, met):
    res = results()
    res["uncontended"]["wall"]["looplock"] = ns(looplock, looplock, looplock)
    res["uncontended"]["wall"]["flock"] = ns(flock, flock, flock)
    first = figures.verdicts(res)[0]
    assert first.value == pytest.approx(looplock / flock)
    assert first.met is met
    text = render(res)
    assert f"| looplock / flock(1) | {shown} | {shown}..{shown} |" in text
    name = "uncontended wall time looplock / flock(1) ≤ 0.80"
    assert targets(text)[name] == (f"{shown} ({shown}..{shown})", "met" if met else "**not met**")


def test_a_short_report_judges_and_says_it_is_short():
    text = render(short=True)
    assert "Generated by `scripts/bench --short`" in text
    assert "> **Short run (`--short`)**" in text
    assert targets(text) == EXPECTED_TARGETS


def test_what_was_tried_is_carried_verbatim():
    previous = "# looplock benchmarks\n\nSTALE-GENERATED-CONTENT\n\n" + BENCH_TRIED
    tried = report.tried_section(previous)
    assert tried == BENCH_TRIED
    text = render(tried=tried)
    assert text.endswith(BENCH_TRIED)
    assert text.count("## What was tried") == 1
    assert "STALE-GENERATED-CONTENT" not in text
    # A section without a final newline gets one; nothing else is touched.
    assert report.tried_section(previous.rstrip("\n")) == BENCH_TRIED


def test_without_previous_notes_the_report_starts_an_empty_section():
    assert report.tried_section(None) is None
    assert report.tried_section("# looplock benchmarks\n\n## Targets\n") is None
    text = render(tried=None)
    notes = text[text.index("## What was tried"):]
    assert text.index("## What was tried") > text.index("## Targets")
    assert "_Nothing recorded yet." in notes and "copies this section verbatim" in notes


def test_a_quick_report_judges_nothing():
    text = render(quick=True)
    assert "Generated by `scripts/bench --quick`" in text
    assert "> **Smoke run (`--quick`)**" in text
    shown = targets(text)
    assert set(shown) == set(EXPECTED_TARGETS)
    assert {verdict for _, verdict in shown.values()} == {"not judged (--quick)"}
    assert {name: measured for name, (measured, _) in shown.items()} == {
        name: measured for name, (measured, _) in EXPECTED_TARGETS.items()}


def test_a_skipped_scenario_says_why_and_its_targets_have_no_data():
    res = results()
    res["handoff"] = dict(skipped="no C compiler (cc) found", tools=["looplock", "flock"], rows=[])
    res["cluster"] = dict(skipped="etcd is missing", tools=["looplock", "etcdctl"])
    text = render(res)
    assert "Skipped: no C compiler (cc) found.\n" in bench_section(text, "## 3. Hand-off")
    assert "Skipped: etcd is missing.\n" in bench_section(text, "## 6. Cluster lock")
    assert rows(bench_section(text, "## 3. Hand-off")) == []
    shown = targets(text)
    assert shown["hand-off p50 looplock ≤ flock(1) and p99 < 2 ms"] == ("—", "no data")
    assert shown["cluster: uncontended looplock --etcd / etcdctl lock ≤ 0.60"] == ("—", "no data")
    assert shown["cluster: hand-off p50 looplock --etcd ≤ etcdctl lock"] == ("—", "no data")
    assert shown["peak memory looplock ≤ flock(1) + 1 MiB"] == ("+500 KiB", "met")


def test_a_busy_machine_is_said_to_be_busy():
    text = render(others=0.6)
    assert "> **Busy machine**: other processes kept 0.60 CPUs busy on average while it ran," in text
    # Whatever /proc/loadavg said (or could not say).
    assert "> **Busy machine**: other processes kept 0.60" in render(load=("unknown", "unknown"), others=0.6)
    assert "Busy machine" not in render(others=0.2)
    # Without /proc/stat, the load average when the run started.
    text = render(load=("2.50 1.00 0.50", "1.00 1.00 0.50"), others=None)
    assert "> **Busy machine**: the 1-minute load average was 2.5 on 2 CPUs when it started," in text
    assert "Busy machine" not in render(load=("1.99 1.00 0.50", "1.00 1.00 0.50"), others=None)


def test_the_benchs_own_load_does_not_make_the_machine_busy():
    # The contended scenarios raise the load average past the CPUs, and an
    # earlier run's may linger at the start: only other processes' CPU time
    # counts.
    assert "Busy machine" not in render(load=("2.40 1.30 0.20", "4.25 2.84 2.55"), others=0.05)
    assert "| CPU used by other processes during the run (/proc/stat less the bench's own) | unknown |" in \
        render(others=None)


def test_other_load_is_the_cpus_busy_time_less_the_benchs_own():
    assert machine.others_cpus(100.0, 130.0, 5.0, 25.0, 20.0) == 0.5
    assert machine.others_cpus(100.0, 110.0, 5.0, 15.5, 20.0) == 0.0  # ticks' grain: never negative
    assert machine.others_cpus(None, 110.0, 5.0, 15.0, 20.0) is None
    assert machine.cpu_busy_seconds() > 0


def test_the_benchs_own_time_counts_its_reaped_children():
    # The tools and etcd are the bench's children: their CPU time is the
    # bench's own, not other processes'.
    before = machine.own_cpu_seconds()
    child = subprocess.run([sys.executable, "-c",
                            "import time, resource\n"
                            "end = time.process_time() + 0.3\n"
                            "while time.process_time() < end: pass\n"
                            "r = resource.getrusage(resource.RUSAGE_SELF)\n"
                            "print(r.ru_utime + r.ru_stime)"],
                           capture_output=True, text=True, check=True, timeout=120)
    assert machine.own_cpu_seconds() - before >= float(child.stdout) - 0.02


def test_the_plot_or_why_there_is_none():
    assert "![hand-off latency and time per run vs N](benchmarks.png)" in render(plot_note=None)
    text = render(plot_note="No plot: matplotlib is not importable.")
    assert "## Plot\n\nNo plot: matplotlib is not importable.\n\n" in text
    assert "benchmarks.png" not in text


# Audit events (sys.audit) that would mean I/O: files, processes, sockets,
# directory listings, imports done late, sleeping.
IO_EVENTS = ("open", "os.", "subprocess.", "socket.", "shutil.", "urllib.", "import", "time.sleep", "ctypes.")
_seen = []
_watching = False


def _audit(event, _args):
    if _watching and event.startswith(IO_EVENTS):
        _seen.append(event)
        raise RuntimeError(f"I/O during the report: {event}")


sys.addaudithook(_audit)  # for the life of this test process; active only while _watching


def without_io(fn):
    """fn()'s value, and the I/O events it caused (each refused)."""
    global _watching
    _seen.clear()
    _watching = True
    try:
        try:
            value = fn()
        except RuntimeError as e:
            value = e
    finally:
        _watching = False
    return value, list(_seen)


def test_the_guard_sees_io():
    value, seen = without_io(lambda: open(__file__).read())
    assert isinstance(value, RuntimeError) and seen == ["open"]


def test_the_report_does_no_io_and_leaves_the_results_alone():
    res = results()
    before = copy.deepcopy(res)
    previous = "# old\n\n" + BENCH_TRIED

    def everything():
        return render(res, tried=report.tried_section(previous))

    text, seen = without_io(everything)
    assert seen == []
    assert isinstance(text, str) and text.endswith(BENCH_TRIED)
    assert res == before, "render changed its results"
    assert render(results(), tried=BENCH_TRIED) == text, "the same results gave another report"


def test_the_lock_dir_file_system_is_named_from_proc_mounts():
    from benchlib.machine import mount_of
    mounts = ("/dev/vda / ext4 rw,relatime 0 0\n"
              "tmpfs /tmp tmpfs rw,nosuid 0 0\n"
              "/dev/vdb /tmp/loops xfs rw 0 0\n"
              "/dev/vdc /srv/with\\040space btrfs rw 0 0\n")
    assert mount_of("/tmp/loops/nightly", mounts) == ("/tmp/loops", "xfs", "/dev/vdb")
    assert mount_of("/tmp/loopsx", mounts) == ("/tmp", "tmpfs", "tmpfs")  # a prefix of the name is no mount
    assert mount_of("/srv/with space/x", mounts) == ("/srv/with space", "btrfs", "/dev/vdc")
    assert mount_of("/home/a", mounts) == ("/", "ext4", "/dev/vda")
    assert mount_of("/home/a", "") is None
