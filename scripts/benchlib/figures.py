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
    spread: tuple = ()  # (least, largest) over the repetitions, when measured


@dataclass(frozen=True)
class Ratio:
    """A ratio measured in one run: over all its runs (the ratio of the
    medians), its spread (the least and the largest of the repetitions'
    ratios), and the same ratio of CPU time (nan where none was measured)."""
    value: float
    lo: float
    hi: float
    cpu: float = math.nan


def repetitions(xs, reps):
    """xs cut into reps equal consecutive slices (the repetitions)."""
    n = len(xs) // reps if reps else 0
    return [xs[i * n:(i + 1) * n] for i in range(reps)] if n else []


def ratio_of(wall, reps, f, cpu=None):
    """The Ratio of f (a function of tool → median ns) over measurements
    (tool → ns per run, `reps` repetitions after each other): overall, per
    repetition, and on CPU time (tool → ns, when given)."""
    med = {t: median(v) for t, v in wall.items()}
    per_rep = []
    cut = {t: repetitions(v, reps) for t, v in wall.items()}
    for i in range(min(len(c) for c in cut.values()) if cut else 0):
        per_rep.append(f({t: median(c[i]) for t, c in cut.items()}))
    per_rep = [r for r in per_rep if not math.isnan(r)]
    c = f({t: median(v) for t, v in cpu.items()}) if cpu else math.nan
    return Ratio(f(med), min(per_rep, default=math.nan), max(per_rep, default=math.nan), c)


def uncontended(u):
    """The uncontended scenario's medians (tool → ns) and ratios (Ratio)."""
    med = {t: median(u["wall"][t]) for t in u["tools"]}
    has = set(u["tools"])

    def r(f, *needs):
        if not has.issuperset(needs):
            return Ratio(math.nan, math.nan, math.nan)
        return ratio_of({t: u["wall"][t] for t in needs}, u.get("reps", 1), f, {t: u["cpu"][t] for t in needs})

    return dict(
        med=med,
        wall=r(lambda m: ratio(m["looplock"], m["flock"]), "looplock", "flock"),
        overhead=r(lambda m: ratio(m["looplock"] - m["bare"], m["flock"] - m["bare"]), "looplock", "flock", "bare"),
        wrapper=r(lambda m: ratio(m["looplock"] - m["bare"], m["empty"] - m["bare"]), "looplock", "empty", "bare"),
        nofork=r(lambda m: ratio(m["looplock -F"], m["flock -F"]), "looplock -F", "flock -F"),
        nofork_overhead=r(lambda m: ratio(m["looplock -F"] - m["bare"], m["flock -F"] - m["bare"]), "looplock -F",
                          "flock -F", "bare"),
        metrics=r(lambda m: ratio(m["looplock metrics"], m["looplock"]), "looplock metrics", "looplock"),
        metrics_added=med["looplock metrics"] - med["looplock"] if has >= {"looplock metrics"} else math.nan,
        once_per=r(lambda m: ratio(m["looplock once-per"], m["looplock"]), "looplock once-per", "looplock"),
        one_option=r(lambda m: ratio(m["looplock -x"], m["looplock"]), "looplock -x", "looplock"),
        metrics_env=r(lambda m: ratio(m["looplock metrics env"], m["looplock"]), "looplock metrics env", "looplock"),
        baseline=r(lambda m: ratio(m["looplock"], m["baseline"]), "looplock", "baseline"),
        baseline_nofork=r(lambda m: ratio(m["looplock -F"], m["baseline -F"]), "looplock -F", "baseline -F"),
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


def holder_renewal_s(ttl):
    """How often a holder renews at this TTL with the default kill-after, as
    looplock's lease timing says (the man page's table): T - kill-after -
    margin - max(2.5 s, T/4), between T/12 and T/3."""
    kill_after = min(5.0, ttl / 6)
    margin = 0.2 + ttl / 100
    return min(max(ttl - kill_after - margin - max(2.5, ttl / 4), ttl / 12), ttl / 3)


def keepalive_rows(c):
    """The holder's keepalives in a hold of hold_s seconds, by TTL: (ttl,
    keepalives, renewal interval s, keepalives expected), TTLs in order."""
    rows = []
    for ttl, n in sorted(c.get("keepalives", {}).items()):
        every = holder_renewal_s(ttl)
        rows.append((ttl, n, every, c["hold_s"] / every))
    return rows


def cluster(c):
    """looplock --etcd / etcdctl lock: uncontended wall time (a Ratio), its
    breakdown (ms: where looplock's and etcdctl's time goes), hand-off p50,
    and what --once-per adds."""
    wall = c["wall"]
    parts = c.get("parts", {})
    med = {t: median(v) for t, v in {**wall, **parts}.items()}
    breakdown = {}
    if parts:
        breakdown = {
            "looplock": {"start-up (static looplock)": med["looplock --version"],
                         "exec hop to looplock-etcd": med["looplock"] - med["helper"],
                         "dynamic loading (libcurl and its libraries)": med["looplock-etcd --version"]
                         - med["looplock --version"],
                         "etcd round trips and the run's work": med["helper"] - med["looplock-etcd --version"]},
            "etcdctl": {"start-up (etcdctl, one static Go binary)": med["etcdctl version"],
                        "connection, round trips and the run's work": med["etcdctl"] - med["etcdctl version"]},
        }
    return dict(
        wall=ratio_of({"looplock": wall["looplock"], "etcdctl": wall["etcdctl"]}, c.get("reps", 1),
                      lambda m: ratio(m["looplock"], m["etcdctl"])),
        breakdown=breakdown,
        handoff=ratio(pct(c["hand"].get("looplock", []), 50), pct(c["hand"].get("etcdctl", []), 50)),
        once_added=median(c["once_wall"]) - median(c["wall"]["looplock"]) if c.get("once_wall") else math.nan,
        once_writes=c["once_writes"] - c["writes"]["looplock"] if "once_writes" in c else math.nan,
    )


def uncontended_targets(u):
    f = uncontended(u)
    out = []
    for name, key, bound in (("uncontended wall time looplock / flock(1) ≤ 0.80", "wall", 0.80),
                             ("uncontended (looplock − true) / (empty static vfork wrapper − true) ≤ 1.5", "wrapper",
                              1.5),
                             ("uncontended wall time looplock -F / flock -F ≤ 0.90", "nofork", 0.90),
                             ("uncontended wall time looplock --metrics-dir / looplock ≤ 1.05", "metrics", 1.05),
                             ("uncontended wall time looplock --once-per / looplock ≤ 1.10", "once_per", 1.10)):
        v = f[key]
        out.append(Target(name, v.value, "ratio", nan_le(v.value, bound), spread=(v.lo, v.hi)))
    return out


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
    """Uncontended wall time and hand-off p50 against etcdctl lock, the
    writes of --once-per, the holder's keepalives, and the waiters woken per
    release."""
    names = ("cluster: uncontended looplock --etcd / etcdctl lock ≤ 0.60",
             "cluster: hand-off p50 looplock --etcd ≤ etcdctl lock",
             "cluster: --once-per adds ≤ 2 etcd writes per run",
             "cluster: holder keepalives in a hold = hold / renewal interval (± 1) at --ttl 3 and 10",
             "cluster: waiters woken per release ≤ 1.1 at every number of waiters")
    if c.get("skipped"):
        units = ("ratio", "ratio", "writes", "count", "count")
        return [Target(name, math.nan, unit, None) for name, unit in zip(names, units)]
    f = cluster(c)
    off = max((abs(n - expected) for _, n, _, expected in keepalive_rows(c)), default=math.nan)
    woken = max((row["tools"]["looplock"]["events"] for row in c.get("scale", [])), default=math.nan)
    return [Target(names[0], f["wall"].value, "ratio", nan_le(f["wall"].value, 0.60), spread=(f["wall"].lo, f["wall"].hi)),
            Target(names[1], f["handoff"], "ratio", nan_le(f["handoff"], 1.0)),
            # Judged on the nearest whole number: etcd's own proposals (lease
            # checkpoints, compaction) add a fraction per run to both counts.
            Target(names[2], f["once_writes"], "writes",
                   nan_le(round(f["once_writes"]) if not math.isnan(f["once_writes"]) else math.nan, 2.0)),
            Target(names[3], off, "count", nan_le(off, 1.0), "largest difference"),
            Target(names[4], woken, "count", nan_le(woken, 1.1), "worst")]


def verdicts(res):
    """Every target, in the order of the report's sections."""
    return (uncontended_targets(res["uncontended"]) + contended_targets(res["contended"])
            + handoff_targets(res["handoff"]) + deadline_targets(res["deadline"])
            + memory_targets(res["memory"]) + cluster_targets(res["cluster"]))
