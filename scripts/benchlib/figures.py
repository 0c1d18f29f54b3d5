"""The numbers the report derives from the scenarios' results (medians,
ratios, worst cases), and the targets judged on them. Pure: results in,
numbers out, nothing written; report.py writes them as text.

verdicts(results) is the Targets table before it is written: one Target per
row, whose `met` is True, False or None (no data). Whether a row is judged
at all (not in a --quick run) is the report's business, not this module's.
"""
import math
from dataclasses import dataclass

from .stats import median, nan_le, pct, ratio


@dataclass(frozen=True)
class Target:
    """One target: what is aimed at, the number measured (nan: none), its
    unit ("ratio", "ms" for a value in nanoseconds, "KiB", or "writes"), a label
    written before the number ("worst", or empty), and whether it is met
    (None: no data to judge on)."""
    name: str
    value: float
    unit: str
    met: object
    label: str = ""


def uncontended(u):
    """The uncontended scenario's medians (tool → ns) and ratios."""
    med = {t: median(u["wall"][t]) for t in u["tools"]}
    return dict(
        med=med,
        wall=ratio(med["looplock"], med["flock"]),
        overhead=ratio(med["looplock"] - med["bare"], med["flock"] - med["bare"]),
        cpu=ratio(median(u["cpu"]["looplock"]), median(u["cpu"]["flock"])),
        nofork=ratio(med["looplock -F"], med["flock -F"]),
        nofork_overhead=ratio(med["looplock -F"] - med["bare"], med["flock -F"] - med["bare"]),
        metrics=ratio(med["looplock metrics"], med["looplock"]),
        metrics_added=med["looplock metrics"] - med["looplock"],
        once_per=ratio(med["looplock once-per"], med["looplock"]) if "looplock once-per" in med else math.nan,
    )


def contended_ratio(row):
    """looplock / flock(1), time per run, in one row (one N) of the
    contended scenario."""
    return ratio(row["per"]["looplock"], row["per"]["flock"])


def handoff_ratios(row):
    """looplock / flock(1) at p50 and at p99, in one row of the hand-off
    scenario."""
    a, b = row["stats"]["looplock"], row["stats"]["flock"]
    return ratio(a[50], b[50]), ratio(a[99], b[99])


def deadline_ratio(row):
    """looplock / flock(1), p50 overshoot, in one row of the deadline
    scenario."""
    return ratio(row["stats"]["looplock"][50], row["stats"]["flock"][50])


def memory(m):
    """The memory scenario's VmHWM medians (process → KiB), looplock's peak
    less flock(1)'s (KiB) and their ratio."""
    hwm = {t: median(v) for t, v in m["hwm"].items()}
    return dict(hwm=hwm, diff=hwm["looplock"] - hwm["flock"], ratio=ratio(hwm["looplock"], hwm["flock"]))


def cluster(c):
    """looplock --etcd / etcdctl lock: uncontended median wall time, and
    hand-off p50."""
    return dict(
        wall=ratio(median(c["wall"]["looplock"]), median(c["wall"]["etcdctl"])),
        handoff=ratio(pct(c["hand"].get("looplock", []), 50), pct(c["hand"].get("etcdctl", []), 50)),
        once_added=median(c["once_wall"]) - median(c["wall"]["looplock"]) if c.get("once_wall") else math.nan,
        once_writes=c["once_writes"] - c["writes"]["looplock"] if "once_writes" in c else math.nan,
    )


def uncontended_targets(u):
    f = uncontended(u)
    return [Target("uncontended wall time looplock / flock(1) ≤ 1.00", f["wall"], "ratio", nan_le(f["wall"], 1.0)),
            Target("uncontended wall time looplock -F / flock -F ≤ 1.00", f["nofork"], "ratio",
                   nan_le(f["nofork"], 1.0)),
            Target("uncontended wall time looplock --once-per / looplock ≤ 1.10", f["once_per"], "ratio",
                   nan_le(f["once_per"], 1.10))]


def contended_targets(c):
    """The worst ratio over every N; met when every N's ratio is ≤ 1."""
    worst = math.nan
    all_met = True
    for row in c["rows"]:
        r = contended_ratio(row)
        worst = r if math.isnan(worst) else max(worst, r)
        all_met = all_met and bool(nan_le(r, 1.0))
    return [Target("contended time per run looplock / flock(1) ≤ 1.00 at every N", worst, "ratio",
                   None if math.isnan(worst) else all_met, "worst")]


def handoff_targets(h):
    """p50 against flock(1)'s and p99 under 2 ms, both at every N."""
    if h.get("skipped"):
        return [Target("hand-off p50 looplock ≤ flock(1) and p99 < 2 ms", math.nan, "ratio", None)]
    p50_ok, p99_ok = True, True
    worst_p99 = 0.0
    for row in h["rows"]:
        a, b = row["stats"]["looplock"], row["stats"]["flock"]
        p50_ok = p50_ok and bool(nan_le(a[50], b[50]))
        p99_ok = p99_ok and a[99] < 2e6
        worst_p99 = max(worst_p99, a[99])
    worst_ratio = max(handoff_ratios(row)[0] for row in h["rows"])
    return [Target("hand-off p50 looplock ≤ flock(1) at every N", worst_ratio, "ratio", p50_ok, "worst p50 ratio"),
            Target("hand-off p99 looplock < 2 ms at every N", worst_p99, "ms", p99_ok, "worst")]


def deadline_targets(d):
    """looplock's worst p50 and its largest overshoot over every deadline."""
    d_p50, d_max = 0.0, 0.0
    for row in d["rows"]:
        a = row["stats"]["looplock"]
        d_p50, d_max = max(d_p50, a[50]), max(d_max, a[100])
    return [Target("deadline overshoot looplock p50 < 5 ms", d_p50, "ms", d_p50 < 5e6, "worst"),
            Target("deadline overshoot looplock max < 20 ms", d_max, "ms", d_max < 20e6)]


def memory_targets(m):
    diff = memory(m)["diff"]
    return [Target("peak memory looplock ≤ flock(1) + 1 MiB", diff, "KiB", diff <= 1024)]


def cluster_targets(c):
    """Uncontended wall time and hand-off p50, each against etcdctl lock."""
    names = ("cluster: uncontended median looplock --etcd ≤ etcdctl lock",
             "cluster: hand-off p50 looplock --etcd ≤ etcdctl lock",
             "cluster: --once-per adds ≤ 2 etcd writes per run")
    if c.get("skipped"):
        return [Target(names[0], math.nan, "ratio", None), Target(names[1], math.nan, "ratio", None),
                Target(names[2], math.nan, "writes", None)]
    f = cluster(c)
    return [Target(names[0], f["wall"], "ratio", nan_le(f["wall"], 1.0)),
            Target(names[1], f["handoff"], "ratio", nan_le(f["handoff"], 1.0)),
            # Judged on the nearest whole number: etcd's own proposals (lease
            # checkpoints, compaction) add a fraction per run to both counts.
            Target(names[2], f["once_writes"], "writes",
                   nan_le(round(f["once_writes"]) if not math.isnan(f["once_writes"]) else math.nan, 2.0))]


def verdicts(res):
    """Every target, in the order of the report's sections."""
    return (uncontended_targets(res["uncontended"]) + contended_targets(res["contended"])
            + handoff_targets(res["handoff"]) + deadline_targets(res["deadline"])
            + memory_targets(res["memory"]) + cluster_targets(res["cluster"]))
