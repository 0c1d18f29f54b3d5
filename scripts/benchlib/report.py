"""The Markdown report (docs/BENCHMARKS.md), as a pure function of the
scenarios' results: render() takes the results, the machine's rows, the
targets (figures.verdicts) and the run's context, and returns the text. It
reads no file, starts no process and looks at no clock; scripts/bench
gathers all of that and writes the file.

The section "What was tried" is kept by hand: tried_section() finds it in
the previous report's text, and render() ends with it, verbatim.
"""
import math

from .figures import (cluster, contended_ratio, deadline_ratio, handoff_ratios, keepalive_rows, memory,
                      uncontended)
from .stats import median, ms, pct, rt

TRIED_HEADING = "## What was tried"
EMPTY_TRIED = (f"{TRIED_HEADING}\n\n_Nothing recorded yet. Notes on optimisation attempts go here: "
               "`scripts/bench` copies this section verbatim into the next report._\n")

COMMANDS = {"looplock": "`looplock DIR -- /bin/true`", "flock": "`flock DIR/.state.lock /bin/true`",
            "bare": "`/bin/true` (the limit)",
            "empty": "`empty /bin/true` (a static vfork, exec and wait: the limit of a wrapper)",
            "looplock -F": "`looplock -F DIR -- /bin/true`",
            "flock -F": "`flock -F DIR/.state.lock /bin/true`",
            "looplock metrics": "`looplock --metrics-dir M DIR -- /bin/true`",
            "looplock once-per": "`looplock --once-per 1ms --operation bench DIR -- /bin/true`",
            "looplock -x": "`looplock -x DIR -- /bin/true` (-x is the default: one option that changes nothing)",
            "looplock metrics env": "`LOOPLOCK_METRICS_DIR=M looplock DIR -- /bin/true` (the metrics without the option)"}
CLUSTER_NAMES = {"looplock": "`looplock --etcd`", "etcdctl": "`etcdctl lock`"}


def tried_section(previous):
    """Everything from the "## What was tried" heading to the end of the
    previous report's text, verbatim (ending with a newline); None when
    there is no previous report or no such heading."""
    if previous is None:
        return None
    lines = previous.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip() == TRIED_HEADING:
            text = "".join(lines[i:])
            return text if text.endswith("\n") else text + "\n"
    return None


def render(res, info, targets, *, quick, plot_note, tried, elapsed, load_start, load_end, others=None,
           short=False):
    """The report. res: the scenarios' results by name; info: the Machine
    table's rows; targets: figures.verdicts(res) (judged unless quick; short:
    a run of `scripts/bench --short`, fewer runs, judged all the same);
    plot_note: why there is no plot, or None; tried: tried_section() of the
    previous report, or None; elapsed: the run's seconds; load_start,
    load_end: /proc/loadavg's first three fields; others: the CPUs other
    processes kept busy during the run, on average (machine.OtherLoad), or
    None if unknown."""
    return "".join([
        header(quick, busy_note(load_start, others, info), short),
        machine(info, load_start, load_end, elapsed, others),
        uncontended_section(res["uncontended"]),
        contended_section(res["contended"]),
        handoff_section(res["handoff"]),
        deadline_section(res["deadline"]),
        memory_section(res["memory"]),
        cluster_section(res["cluster"]),
        targets_section(targets, judged=not quick),
        plot_section(plot_note),
        tried if tried else EMPTY_TRIED,
    ])


# Other processes may use this much of the CPUs, on average, before the
# report calls the machine busy: a quiet machine's daemons and kernel
# threads stay well under it.
BUSY_OTHERS = 0.25


def busy_note(load_start, others, info):
    """A warning when other processes competed for the CPUs: they kept more
    than BUSY_OTHERS CPUs busy during the run. Where that is unknown (no
    /proc/stat), a 1-minute load average of a CPU per CPU or more when the
    run started. The load average at the end says nothing: the bench raises
    it itself (and at the start it may still show an earlier run's)."""
    if others is not None:
        if others <= BUSY_OTHERS:
            return ""
        said = f"other processes kept {others:.2f} CPUs busy on average while it ran"
    else:
        try:
            cpus = int(info["CPUs (nproc)"])
            start = float(load_start.split()[0])
        except (ValueError, IndexError, KeyError):
            return ""
        if start < cpus:
            return ""
        said = f"the 1-minute load average was {start:g} on {cpus} CPUs when it started"
    return (f"> **Busy machine**: {said}, so other processes competed with the tools and the "
            "times are noisy (a tool that uses more CPU is preempted more). Regenerate on a quiet machine "
            "before drawing conclusions.\n\n")


def header(quick, busy, short=False):
    mode = " --quick" if quick else " --short" if short else ""
    o = ["# looplock benchmarks\n\n",
         "<!-- Generated by scripts/bench: do not edit by hand, except the section\n"
         "     \"What was tried\", which scripts/bench copies into the next report. -->\n\n",
         "Generated by `scripts/bench" + mode + "`: do not edit by hand "
         "(except the section *What was tried*, which the script keeps). Every scenario runs looplock, "
         "util-linux `flock(1)` and, where it makes sense, the bare command (the physical limit) side by "
         "side in the same run, alternating the tools run by run after a warm-up; the verdicts are "
         "ratios between them, never one absolute time.\n\n",
         busy]
    if quick:
        o.append("> **Smoke run (`--quick`)**: counts are tiny, so these numbers mean nothing; "
                 "no target is judged.\n\n")
    elif short:
        o.append("> **Short run (`--short`)**: about a minute, with fewer runs than the full report; the spreads "
                 "say how far to trust each ratio.\n\n")
    o.append("Each ratio is given with its spread, the least and the largest of the same ratio over the "
             "repetitions of its scenario (min..max), and, where the launcher measured it, the same ratio of CPU "
             "time (user + system of the tool and its command, from `wait4`), which other load disturbs less "
             "than wall time.\n\n")
    return "".join(o)


def machine(info, load_start, load_end, elapsed, others=None):
    o = ["## Machine\n\n| | |\n|---|---|\n"]
    o += [f"| {k} | {v} |\n" for k, v in info.items()]
    o.append(f"| load average (start → end; the bench's own scenarios raise it) | {load_start} → {load_end} |\n")
    shown = "unknown" if others is None else f"{others:.2f} CPUs on average"
    o.append(f"| CPU used by other processes during the run (/proc/stat less the bench's own) | {shown} |\n")
    o.append(f"| bench wall time | {elapsed:.0f} s |\n\n")
    return "".join(o)


def spread_text(lo, hi):
    """A spread over repetitions, "0.76..0.80", or None when there is none."""
    return None if math.isnan(lo) else f"{rt(lo)}..{rt(hi)}"


def ratio_cells(r):
    """A Ratio's cells: value, spread, CPU ratio."""
    return f"{rt(r.value)} | {spread_text(r.lo, r.hi) or '—'} | {rt(r.cpu)}"


def uncontended_section(u):
    f = uncontended(u)
    med = f["med"]
    o = ["## 1. Uncontended: wall time of one wrapped `/bin/true`\n\n",
         f"Each tool runs `/bin/true` {u['reps']} × {u['runs']} times (after {u['warmup']} warm-up rounds), "
         "interleaved run by run; each run is timed around `posix_spawn` + `wait4` from the same Python launcher. "
         "CPU is user+system time of the tool and its command (from `wait4`), less sensitive to "
         "other load than wall time.\n\n",
         "| tool | command | median ms | p10 ms | p90 ms | CPU median ms |\n|---|---|---:|---:|---:|---:|\n"]
    commands = dict(COMMANDS)
    if "baseline" in u["tools"]:
        at = u.get("baseline", "an earlier commit")
        commands["baseline"] = f"`looplock DIR -- /bin/true` as built at {at} (`--baseline`)"
        commands["baseline -F"] = f"`looplock -F DIR -- /bin/true` as built at {at}"
    for t in u["tools"]:
        o.append(f"| {t} | {commands[t]} | {ms(med[t])} | {ms(pct(u['wall'][t], 10))} | "
                 f"{ms(pct(u['wall'][t], 90))} | {ms(median(u['cpu'][t]))} |\n")
    o += [f"\n| ratio | wall | spread over {u['reps']} repetitions | CPU |\n|---|---:|---:|---:|\n",
          f"| looplock / flock(1) | {ratio_cells(f['wall'])} |\n",
          f"| (looplock − true) / (flock(1) − true), overhead | {ratio_cells(f['overhead'])} |\n",
          f"| (looplock − true) / (empty wrapper − true): looplock's cost against the least any wrapper costs "
          f"| {ratio_cells(f['wrapper'])} |\n",
          f"| looplock -F / flock -F | {ratio_cells(f['nofork'])} |\n",
          f"| (looplock -F − true) / (flock -F − true), overhead | {ratio_cells(f['nofork_overhead'])} |\n",
          f"| looplock --metrics-dir / looplock (what the metrics file costs a run; "
          f"{ms(f['metrics_added'])} ms) | {ratio_cells(f['metrics'])} |\n",
          f"| looplock --once-per / looplock (the run ledger's read and two writes, a slot per run) "
          f"| {ratio_cells(f['once_per'])} |\n",
          f"| looplock -x / looplock (what one option on the command line costs: cxxopts declares it, and "
          f"checks option names against `std::locale::classic()`, whose first use builds every facet) "
          f"| {ratio_cells(f['one_option'])} |\n",
          f"| LOOPLOCK_METRICS_DIR looplock / looplock (the metrics file's update alone) "
          f"| {ratio_cells(f['metrics_env'])} |\n"]
    if "baseline" in u["tools"]:
        at = u.get("baseline", "an earlier commit")
        o += [f"| looplock / looplock at {at} (this build against the earlier one, side by side) "
              f"| {ratio_cells(f['baseline'])} |\n",
              f"| looplock -F / looplock -F at {at} | {ratio_cells(f['baseline_nofork'])} |\n"]
    o.append("\n")
    if "empty" not in u["tools"]:
        o.append("No empty wrapper: it could not be built (a C compiler and a static C library are needed).\n\n")
    return "".join(o)


def contended_section(c):
    o = ["## 2. Contended throughput: time per run with N processes on one lock\n\n",
         f"N `sh` loops each run the wrapped `/bin/true` M times on the same lock, all released at once "
         f"through a gate; time per run = wall time / (N·M). looplock uses `-p blocking`; flock(1) blocks "
         f"by default. Each (N, tool) cell is repeated {c['reps']} times, the tools alternating cell by "
         "cell; the table shows the median. *bare* runs `/bin/true` with no lock at all (not serialised: "
         "the floor of the driver and spawning).\n\n",
         "| N | M | looplock ms/run | flock(1) ms/run | bare ms/run | looplock / flock(1) |\n"
         "|---:|---:|---:|---:|---:|---:|\n"]
    for row in c["rows"]:
        p = row["per"]
        o.append(f"| {row['n']} | {row['m']} | {ms(p['looplock'])} | {ms(p['flock'])} | {ms(p['bare'])} | "
                 f"{rt(contended_ratio(row))} |\n")
    o.append("\n")
    return "".join(o)


def handoff_section(h):
    o = ["## 3. Hand-off latency: from the holder's release to the next command's start\n\n"]
    if h.get("skipped"):
        o.append(f"Skipped: {h['skipped']}.\n\n")
        return "".join(o)
    o += [f"N processes contend for the lock (so N−1 wait at each release), each running a wrapped "
          f"`stamp` (a small C program compiled with `cc -O2` at bench start) that writes "
          f"CLOCK_MONOTONIC at its start and just before its exit with one O_APPEND write, after "
          f"holding the lock {h['hold_us'] / 1000:g} ms. Sorting the stamps by start time, hand-off "
          f"latency = start of the next command − end of the previous one: the command's exit, the "
          f"wrapper's reaping and release, the waiter's wake-up and the next fork/exec. "
          f"{h['reps']} repetition(s) per (N, tool), alternating.\n\n",
          "| N | hand-offs | looplock p50 | p90 | p99 | max | flock(1) p50 | p90 | p99 | max | "
          "p50 ratio | p99 ratio |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"]
    for row in h["rows"]:
        a, b = row["stats"]["looplock"], row["stats"]["flock"]
        r50, r99 = handoff_ratios(row)
        o.append(f"| {row['n']} | {len(row['gaps']['looplock'])} | {ms(a[50])} | {ms(a[90])} | {ms(a[99])} | "
                 f"{ms(a[100])} | {ms(b[50])} | {ms(b[90])} | {ms(b[99])} | {ms(b[100])} | "
                 f"{rt(r50)} | {rt(r99)} |\n")
    o.append("\nTimes in ms.\n\n")
    return "".join(o)


def deadline_section(d):
    o = ["## 4. Deadline precision: overshoot of `-w` against a held lock\n\n",
         "The lock is held by `flock DIR/.state.lock sleep 1000` for the whole scenario; each run's wall "
         "time minus the deadline is its overshoot (process start and exit included). "
         "looplock `-w D DIR -- /bin/true` (exit 75) alternates with `flock -w D DIR/.state.lock /bin/true` "
         "(exit 1).\n\n",
         "| deadline s | runs | looplock p50 ms | looplock max ms | flock(1) p50 ms | flock(1) max ms | "
         "p50 ratio |\n|---:|---:|---:|---:|---:|---:|---:|\n"]
    for row in d["rows"]:
        a, b = row["stats"]["looplock"], row["stats"]["flock"]
        o.append(f"| {row['deadline']:g} | {row['runs']} | {ms(a[50])} | {ms(a[100])} | {ms(b[50])} | "
                 f"{ms(b[100])} | {rt(deadline_ratio(row))} |\n")
    o.append("\n")
    return "".join(o)


def memory_section(m):
    f = memory(m)
    hw = f["hwm"]
    o = ["## 5. Memory: peak resident size of the wrapper\n\n",
         f"VmHWM (and VmRSS) from `/proc/PID/status` of the wrapper itself, read while it holds the lock "
         f"and its command (`sleep {m['sleep']}`) runs; median of {m['reps']} run(s), alternating. "
         "(`-F` execs the command in place, so it has no wrapper to measure.)\n\n",
         "| process | VmHWM median KiB | VmHWM max KiB | VmRSS median KiB |\n|---|---:|---:|---:|\n"]
    for t in m["tools"]:
        o.append(f"| {t} | {hw[t]:.0f} | {max(m['hwm'][t])} | {median(m['rss'][t]):.0f} |\n")
    if m["hwm"]["sleep"]:
        o.append(f"| the command (`sleep`), for scale | {hw['sleep']:.0f} | {max(m['hwm']['sleep'])} | — |\n")
    o.append(f"\nlooplock − flock(1): {f['diff']:+.0f} KiB (ratio {rt(f['ratio'])}).\n\n")
    return "".join(o)


def cluster_section(c):
    o = ["## 6. Cluster lock: `looplock --etcd` against `etcdctl lock`\n\n"]
    if c.get("skipped"):
        o.append(f"Skipped: {c['skipped']}.\n\n")
        return "".join(o)
    where = "on tmpfs" if c.get("tmpfs") else "on disk (no /dev/shm)"
    o += [f"One etcd member on loopback, started by the bench, its data {where}. Uncontended: "
          f"`looplock --etcd URL DIR -- /bin/true` against `etcdctl lock NAME /bin/true`, {c.get('reps', 1)} × "
          f"{c['runs']} runs each, alternating; looplock's time includes its hand-over to `looplock-etcd`. Writes: "
          "etcd's committed raft proposals per run (`etcd_server_proposals_committed_total`). Hand-off: two "
          f"\"hosts\" (two loop dirs for looplock) each run the `stamp` command {c['per_host']} times under one lock "
          f"name, holding it {c['hold_us'] / 1000:g} ms; latency = next command's start − previous command's end, "
          "across hosts.\n\n",
          "| tool | median ms | p10 ms | p90 ms | etcd writes per run | hand-off p50 ms | p90 ms | max ms |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|\n"]
    for t in c["tools"]:
        g, wall = c["hand"].get(t, []), c["wall"][t]
        o.append(f"| {CLUSTER_NAMES[t]} | {ms(median(wall))} | {ms(pct(wall, 10))} | {ms(pct(wall, 90))} "
                 f"| {c['writes'][t]:.1f} | {ms(pct(g, 50))} | {ms(pct(g, 90))} | {ms(pct(g, 100))} |\n")
    f = cluster(c)
    w = f["wall"]
    sp = spread_text(w.lo, w.hi)
    spread = f" ({sp} over {c.get('reps', 1)} repetitions)" if sp else ""
    o.append(f"\nlooplock / etcdctl: uncontended wall {rt(w.value)}{spread}, hand-off p50 {rt(f['handoff'])}.\n\n")
    o.append(breakdown_part(f["breakdown"]))
    if c.get("once_wall"):
        o.append(f"`looplock --etcd --once-per 1ms` (a slot per run: the ledger read inside the acquisition's "
                 f"transaction, its start and end written): median {ms(median(c['once_wall']))} ms, "
                 f"{ms(f['once_added'])} ms more than without; {c['once_writes']:.1f} etcd writes per run, "
                 f"{f['once_writes']:+.1f}.\n\n")
    o.append(keepalive_part(c))
    o.append(scale_part(c))
    o.append(failover_part(c))
    return "".join(o)


def breakdown_part(b):
    """Where each tool's uncontended run goes, from runs of its parts."""
    if not b:
        return ""
    o = ["Where the time goes (medians of runs of the parts, interleaved with the runs above: each tool's "
         "start-up alone (`--version`, `etcdctl version`), and `looplock-etcd` run directly, without the hop "
         "from `looplock`):\n\n| tool | part | ms |\n|---|---|---:|\n"]
    for tool, parts in b.items():
        for part, v in parts.items():
            o.append(f"| {CLUSTER_NAMES[tool]} | {part} | {ms(v)} |\n")
    o.append("\n")
    return "".join(o)


def keepalive_part(c):
    """The holder's keepalives in a hold, against the lease timing."""
    if not c.get("keepalives"):
        return ""
    o = [f"Keepalives while holding: `looplock --etcd --ttl T DIR -- sleep {c['hold_s']:g}` "
         "(etcd's LeaseKeepAlive messages during the run):\n\n"
         "| --ttl | keepalives | renewal interval s (man page) | expected |\n|---:|---:|---:|---:|\n"]
    for ttl, n, every, expected in keepalive_rows(c):
        o.append(f"| {ttl} | {n:.0f} | {every:.2f} | {expected:.1f} |\n")
    o.append("\n")
    return "".join(o)


def scale_part(c):
    """W waiters on one name: etcd's load per hand-off, and the hand-off."""
    if not c.get("scale"):
        return ""
    o = ["Waiters on one name: W + 1 contenders (each its own loop dir for looplock), each running the `stamp` "
         f"command under the lock (holding it {c['hold_us'] / 1000:g} ms) in a loop, about "
         f"{c['scale'][0]['runs']} hand-offs per W. *requests*: etcd's gRPC messages received per run (a "
         "request through the HTTP gateway is one; each message of a stream one more: etcdctl's keepalives); "
         "*woken*: watch events sent per release (each wakes one watcher); *writes*: raft proposals per run.\n\n"
         "| W | tool | requests per run | woken per release | writes per run | hand-off p50 ms | p99 ms |\n"
         "|---:|---|---:|---:|---:|---:|---:|\n"]
    for row in c["scale"]:
        for t in ("looplock", "etcdctl"):
            x = row["tools"][t]
            o.append(f"| {row['waiters']} | {CLUSTER_NAMES[t]} | {x['requests']:.1f} | {x['events']:.2f} | "
                     f"{x['writes']:.1f} | {ms(pct(x['gaps'], 50))} | {ms(pct(x['gaps'], 99))} |\n")
    o.append("\n")
    return "".join(o)


def failover_part(c):
    o = [f"Failover: the same run with a blackholed first endpoint (a loopback listener that drops every SYN, "
         f"as a partitioned member does) and the member second, against the member alone, {c['failover_runs']} "
         "runs each, interleaved. looplock gives the blackholed endpoint one connect attempt (40 ms at first, "
         "looplock-cluster(7)), not the request's attempt (a tenth of the TTL: 1 s at the default TTL).\n\n",
         "| tool | member alone: median ms | blackholed first: median ms | p90 ms | added (median) ms |\n"
         "|---|---:|---:|---:|---:|\n"]
    for t in c["tools"]:
        d, b = c["failover"][t]["direct"], c["failover"][t]["blackholed"]
        o.append(f"| {CLUSTER_NAMES[t]} | {ms(median(d))} | {ms(median(b))} | {ms(pct(b, 90))} | "
                 f"{ms(median(b) - median(d))} |\n")
    o.append("\n")
    return "".join(o)


def measured(target):
    """The Targets table's "measured" cell: the label, then the number in
    its unit, then its spread when there is one."""
    if target.unit == "count":
        number = f"{target.value:.1f}"
    elif target.unit == "ms":
        number = f"{ms(target.value)} ms"
    elif target.unit == "writes":
        number = f"{target.value:+.1f} writes"
    elif target.unit == "KiB":
        number = f"{target.value:+.0f} KiB"
    else:
        number = rt(target.value)
    if target.spread and spread_text(*target.spread):
        number += f" ({spread_text(*target.spread)})"
    return f"{target.label} {number}" if target.label else number


def verdict(met, judged):
    """The Targets table's "verdict" cell."""
    if not judged:
        return "not judged (--quick)"
    if met is None:
        return "no data"
    return "met" if met else "**not met**"


def targets_section(targets, judged):
    o = ["## Targets\n\nRatios in the same run on a 2-core machine; a ratio is judged on all its runs, and its "
         "spread over the repetitions is in brackets. *What was tried* says, with numbers, why a target that is "
         "not met is not, and where its limit lies.\n\n",
         "| target | measured | verdict |\n|---|---|---|\n"]
    o += [f"| {t.name} | {measured(t)} | {verdict(t.met, judged)} |\n" for t in targets]
    o.append("\n")
    return "".join(o)


def plot_section(plot_note):
    if plot_note:
        return f"## Plot\n\n{plot_note}\n\n"
    return "## Plot\n\n![hand-off latency and time per run vs N](benchmarks.png)\n\n"
