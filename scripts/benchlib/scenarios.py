"""The scenarios: one function each, running the tools and returning what
was measured as plain data (dicts of lists; times in nanoseconds, memory in
KiB), with no formatting. report.py and figures.py read these dicts; each
function's docstring gives the keys of its result.

Every scenario alternates the tools run by run (or cell by cell) after a
warm-up, so that load from other processes falls on all of them alike. A
scenario raises BenchError when a tool misbehaves.
"""
import math
import os
import time
from pathlib import Path

from . import BenchError, log
from .launcher import SLEEP, TRUE, check_ok, exit_of, find_child, proc_status, run_drivers
from .peers import ETCDCTL, Blackhole, EtcdServer, Holder, cluster_skip_reason
from .stats import median, ms, pct

# Counts per mode. Full: about 5 minutes on an idle 2-core machine (well
# under 15 on a busy one). Short: about a minute, every target judged. Quick:
# a few seconds, a smoke test.
FULL = dict(
    unc_warmup=30, unc_reps=5, unc_runs=120,
    con_ns=[1, 2, 4, 8, 16, 32], con_reps=3, con_m=lambda n: max(20, 400 // n),
    hand_ns=[2, 4, 8], hand_reps=2, hand_per_rep=200, hand_hold_us=5000,
    dl_cases=[(0.05, 30), (0.3, 20), (1.0, 10)],
    mem_reps=5, mem_sleep="0.5",
    etcd_warmup=10, etcd_reps=3, etcd_runs=50, etcd_writes_runs=20, etcd_hand_per_host=60, etcd_hand_hold_us=5000,
    etcd_failover_runs=30, etcd_hold_s=5, etcd_waiters=[1, 10, 50], etcd_handoffs=100,
)
SHORT = dict(
    unc_warmup=10, unc_reps=3, unc_runs=60,
    con_ns=[1, 4, 16], con_reps=1, con_m=lambda n: max(10, 120 // n),
    hand_ns=[2, 8], hand_reps=1, hand_per_rep=60, hand_hold_us=5000,
    dl_cases=[(0.05, 10), (0.3, 5)],
    mem_reps=3, mem_sleep="0.3",
    etcd_warmup=3, etcd_reps=3, etcd_runs=15, etcd_writes_runs=5, etcd_hand_per_host=15, etcd_hand_hold_us=5000,
    etcd_failover_runs=5, etcd_hold_s=5, etcd_waiters=[1, 10], etcd_handoffs=30,
)
QUICK = dict(
    unc_warmup=2, unc_reps=2, unc_runs=3,
    con_ns=[1, 2], con_reps=1, con_m=lambda n: 3,
    hand_ns=[2], hand_reps=1, hand_per_rep=6, hand_hold_us=2000,
    dl_cases=[(0.05, 2)],
    mem_reps=1, mem_sleep="0.3",
    etcd_warmup=1, etcd_reps=1, etcd_runs=3, etcd_writes_runs=2, etcd_hand_per_host=3, etcd_hand_hold_us=2000,
    etcd_failover_runs=2, etcd_hold_s=1, etcd_waiters=[1, 3], etcd_handoffs=6,
)


def steps(L, T, cfg, stamp, why, work):
    """The scenarios in the order they run: (name in the results, a function
    of no arguments that runs it). stamp is the `stamp` command's path, or
    None and why it could not be built."""
    return [
        ("uncontended", lambda: uncontended(L, T, cfg)),
        ("contended", lambda: contended(L, T, cfg)),
        ("handoff", lambda: handoff(L, T, cfg, stamp, work) if stamp else handoff_skipped(why)),
        ("deadline", lambda: deadline(L, T, cfg)),
        ("memory", lambda: memory(L, T, cfg)),
        ("cluster", lambda: cluster(L, T, cfg, stamp, work)),
    ]


def uncontended(L, T, cfg):
    """Each tool runs /bin/true, interleaved run by run, in `reps`
    repetitions of `runs` runs. Result: tools (those of Tools.wrap that can
    run here: no empty wrapper without a static C library), wall and cpu
    (tool → ns per run, repetition after repetition), reps, runs (per
    repetition), warmup."""
    tools = ["looplock", "flock", "bare", "empty", "looplock -F", "flock -F", "looplock metrics", "looplock once-per",
             "looplock -x", "looplock metrics env"]
    if T.empty is None:
        tools.remove("empty")
    if T.baseline is not None:
        tools += ["baseline", "baseline -F"]
    argv = {t: T.wrap(t, [TRUE]) for t in tools}
    env = {t: T.env_for(t) for t in tools}
    wall = {t: [] for t in tools}
    cpu = {t: [] for t in tools}
    for i in range(cfg["unc_warmup"] + cfg["unc_reps"] * cfg["unc_runs"]):
        for t in tools:  # A B C D E A B C D E ...
            w, st, c = L.timed(argv[t], env=env[t])
            check_ok(" ".join(argv[t]), st)
            if i >= cfg["unc_warmup"]:
                wall[t].append(w)
                cpu[t].append(c)
    return dict(tools=tools, wall=wall, cpu=cpu, reps=cfg["unc_reps"], runs=cfg["unc_runs"], baseline=T.baseline_label,
                warmup=cfg["unc_warmup"])


def contended(L, T, cfg):
    """N driver loops run the wrapped /bin/true M times each on one lock.
    Result: tools (looplock, flock, bare), reps, and rows, one per N: n, m,
    per (tool → median ns per run) and all (tool → ns per run, each rep)."""
    tools = ["looplock", "flock", "bare"]
    argv = {"looplock": T.wrap("looplock", [TRUE], ["-p", "blocking"]),
            "flock": T.wrap("flock", [TRUE]),
            "bare": [TRUE]}
    run_drivers(L, 2, 3, argv["looplock"])  # warm-up
    run_drivers(L, 2, 3, argv["flock"])
    rows = []
    for n in cfg["con_ns"]:
        m = cfg["con_m"](n)
        per = {t: [] for t in tools}
        for rep in range(cfg["con_reps"]):
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]
            for t in order:
                per[t].append(run_drivers(L, n, m, argv[t]) / (n * m))
        rows.append(dict(n=n, m=m, per={t: median(v) for t, v in per.items()}, all=per))
        log(f"  contended N={n}: looplock {ms(rows[-1]['per']['looplock'])} ms/run, "
            f"flock {ms(rows[-1]['per']['flock'])} ms/run")
    return dict(tools=tools, rows=rows, reps=cfg["con_reps"])


def handoff_gaps(logfile):
    """From the `stamp` lines (start, end, pid) of one run: the gaps between
    one command's end and the next one's start, how many commands overlapped
    the one before, and how many stamps there were."""
    recs = []
    for line in Path(logfile).read_text().splitlines():
        t0, t1, _pid = line.split()
        recs.append((int(t0), int(t1)))
    recs.sort()
    gaps = []
    overlaps = 0
    for (_, end), (start, _) in zip(recs, recs[1:]):
        if start < end:
            overlaps += 1
        gaps.append(start - end)
    return gaps, overlaps, len(recs)


def handoff_skipped(why):
    """The hand-off result when the `stamp` command could not be built."""
    return dict(skipped=why, tools=["looplock", "flock"], rows=[])


def handoff(L, T, cfg, stamp, work):
    """N processes contend for the lock, each running `stamp` K times.
    Result: tools (looplock, flock), hold_us, reps, and rows, one per N: n,
    k, gaps (tool → ns), overlaps (tool → count), stats (tool → percentile
    50, 90, 99 or 100 → ns)."""
    tools = ["looplock", "flock"]
    rows = []
    seq = 0
    for n in cfg["hand_ns"]:
        k = max(2, math.ceil(cfg["hand_per_rep"] / n))
        gaps = {t: [] for t in tools}
        overlaps = {t: 0 for t in tools}
        for rep in range(cfg["hand_reps"]):
            order = tools if rep % 2 == 0 else tools[::-1]
            for t in order:
                seq += 1
                logf = str(Path(work) / f"stamps-{seq}.log")
                cmd = [stamp, logf, str(cfg["hand_hold_us"])]
                argv = (T.wrap("looplock", cmd, ["-p", "blocking"]) if t == "looplock" else T.wrap("flock", cmd))
                run_drivers(L, n, k, argv)
                g, o, count = handoff_gaps(logf)
                if count != n * k:
                    raise BenchError(f"{t}: {count} stamps for {n * k} runs")
                gaps[t].extend(g)
                overlaps[t] += o
        row = dict(n=n, k=k, gaps=gaps, overlaps=overlaps,
                   stats={t: {p: pct(gaps[t], p) for p in (50, 90, 99, 100)} for t in tools})
        rows.append(row)
        log(f"  hand-off N={n}: p50 looplock {ms(row['stats']['looplock'][50])} ms, "
            f"flock {ms(row['stats']['flock'][50])} ms")
        bad = [t for t in tools if overlaps[t]]
        if bad:
            raise BenchError(f"hand-off N={n}: commands overlapped under {bad} ({overlaps}): the lock did not exclude")
    return dict(tools=tools, rows=rows, hold_us=cfg["hand_hold_us"], reps=cfg["hand_reps"])


def deadline(L, T, cfg):
    """`-w D` against a held lock, for each deadline D. Result: tools
    (looplock, flock) and rows, one per D: deadline (s), runs, over (tool →
    ns past the deadline), stats (tool → percentile 50 or 100 → ns)."""
    tools = ["looplock", "flock"]
    expected = {"looplock": 75, "flock": 1}
    rows = []
    holder = Holder(T)
    try:
        for secs, runs in cfg["dl_cases"]:
            w = f"{secs:g}"
            argv = {"looplock": T.wrap("looplock", [TRUE], ["-w", w]),
                    "flock": [T.flock, "-w", w, T.lock, TRUE]}
            over = {t: [] for t in tools}
            for i in range(runs):
                order = tools if i % 2 == 0 else tools[::-1]
                for t in order:
                    wall, st, _ = L.timed(argv[t], stderr=L.devnull)  # the timeout lines are expected
                    if exit_of(st) != expected[t]:
                        raise BenchError(f"{' '.join(argv[t])} exited with {exit_of(st)}, expected {expected[t]}")
                    over[t].append(wall - int(secs * 1e9))
            rows.append(dict(deadline=secs, runs=runs, over=over,
                             stats={t: {50: pct(over[t], 50), 100: max(over[t])} for t in tools}))
            log(f"  deadline {w} s: overshoot p50 looplock {ms(rows[-1]['stats']['looplock'][50])} ms, "
                f"flock {ms(rows[-1]['stats']['flock'][50])} ms")
    finally:
        holder.stop()
    return dict(tools=tools, rows=rows)


def wait_for_child(pid, comm, argv):
    """The pid of pid's child named comm, waited for up to 10 s."""
    end = time.monotonic() + 10
    child = None
    while child is None and time.monotonic() < end:
        child = find_child(pid, comm)
        if child is None:
            time.sleep(0.002)
    if child is None:
        raise BenchError(f"{' '.join(argv)}: its command never showed up as a child")
    return child


def memory(L, T, cfg):
    """The wrapper's VmHWM and VmRSS while its command (`sleep`) runs.
    Result: tools (looplock, flock), hwm (tool or "sleep" → KiB per run),
    rss (tool → KiB per run), reps, sleep (the command's argument)."""
    tools = ["looplock", "flock"]
    hwm = {t: [] for t in tools + ["sleep"]}
    rss = {t: [] for t in tools}
    for rep in range(cfg["mem_reps"]):
        order = tools if rep % 2 == 0 else tools[::-1]
        for t in order:
            argv = T.wrap(t, [SLEEP, cfg["mem_sleep"]])
            pid = L.spawn(argv)
            try:
                child = wait_for_child(pid, "sleep", argv)
                st = proc_status(pid)
                cst = proc_status(child)
                if st is None:
                    raise BenchError(f"{' '.join(argv)}: could not read /proc/{pid}/status")
                hwm[t].append(st["VmHWM"])
                rss[t].append(st["VmRSS"])
                if cst:
                    hwm["sleep"].append(cst["VmHWM"])
            finally:
                _, status = os.waitpid(pid, 0)
            check_ok(" ".join(argv), status)
    return dict(tools=tools, hwm=hwm, rss=rss, reps=cfg["mem_reps"], sleep=cfg["mem_sleep"])


def failover(L, cfg, argv_for, srv):
    """Each tool with a blackholed first endpoint and the member second,
    against the member alone, interleaved run by run. Result: tool →
    "direct" or "blackholed" → ns per run."""
    hole = Blackhole()
    try:
        cells = [(t, how) for t in argv_for for how in ("direct", "blackholed")]
        endpoints = {"direct": srv.url, "blackholed": f"{hole.url},{srv.url}"}
        runs = {t: {"direct": [], "blackholed": []} for t in argv_for}
        for i in range(cfg["etcd_failover_runs"]):
            for t, how in (cells if i % 2 == 0 else cells[::-1]):
                argv = argv_for[t](endpoints[how])
                w, st, _ = L.timed(argv)
                check_ok(" ".join(argv), st)
                runs[t][how].append(w)
        return runs
    finally:
        hole.close()


def cluster_uncontended(L, cfg, argv):
    """tool → wall ns per uncontended run, alternating after a warm-up, in
    etcd_reps repetitions of etcd_runs runs."""
    tools = list(argv)
    wall = {t: [] for t in tools}
    for i in range(cfg["etcd_warmup"] + cfg["etcd_reps"] * cfg["etcd_runs"]):
        order = tools if i % 2 == 0 else tools[::-1]
        for t in order:
            w, st, _ = L.timed(argv[t])
            check_ok(" ".join(argv[t]), st)
            if i >= cfg["etcd_warmup"]:
                wall[t].append(w)
    return wall


def holder_keepalives(L, T, cfg, srv):
    """ttl → keepalives a looplock holding the cluster lock sent while its
    command slept etcd_hold_s seconds."""
    out = {}
    for ttl in (3, 10):
        before = srv.counters()["keepalives"]
        argv = [T.looplock, "--etcd", srv.url, "--lock-name", f"bench-hold-{ttl}", "--ttl", str(ttl), T.dir, "--",
                SLEEP, str(cfg["etcd_hold_s"])]
        check_ok(" ".join(argv), L.timed(argv)[1])
        out[ttl] = srv.counters()["keepalives"] - before
    return out


def cluster_scale(L, T, cfg, stamp, work, srv):
    """W waiters on one name: W + 1 contenders (loop dirs for looplock) each
    run `stamp` under the lock, holding it etcd_hand_hold_us, about
    etcd_handoffs times in all. Result: list of rows, one per W: waiters,
    runs, and per tool: gaps (hand-off ns), requests (etcd requests per run),
    events (watch events per release: waiters woken), writes per run."""
    rows = []
    for w in cfg["etcd_waiters"]:
        n = w + 1
        k = max(2, math.ceil(cfg["etcd_handoffs"] / n))
        row = dict(waiters=w, runs=n * k, tools={})
        for t in ("looplock", "etcdctl"):
            logf = str(Path(work) / f"etcd-scale-{w}-{t}.log")
            cmd = [stamp, logf, str(cfg["etcd_hand_hold_us"])]
            per = []
            for h in range(n):
                if t == "looplock":
                    d = Path(work) / f"scale-host{h}"
                    d.mkdir(exist_ok=True)
                    per.append([T.looplock, "--etcd", srv.url, "--lock-name", f"bench-scale-{w}", "-p", "blocking",
                                str(d), "--", *cmd])
                else:
                    per.append([ETCDCTL, "--endpoints", srv.url, "lock", f"bench-scale-ctl-{w}", "--", *cmd])
            before = srv.counters()
            run_drivers(L, n, k, per)
            after = srv.counters()
            gaps, overlaps, count = handoff_gaps(logf)
            if count != n * k:
                raise BenchError(f"{t}: {count} stamps for {n * k} runs")
            if overlaps:
                raise BenchError(f"cluster scale W={w}: commands overlapped under {t}: the lock did not exclude")
            runs = n * k
            row["tools"][t] = dict(gaps=gaps, requests=(after["requests"] - before["requests"]) / runs,
                                   events=(after["events"] - before["events"]) / max(1, runs - 1),
                                   writes=(after["writes"] - before["writes"]) / runs)
        rows.append(row)
        log(f"  cluster W={w}: hand-off p50 looplock {ms(pct(row['tools']['looplock']['gaps'], 50))} ms, "
            f"etcdctl {ms(pct(row['tools']['etcdctl']['gaps'], 50))} ms; requests per run "
            f"{row['tools']['looplock']['requests']:.1f} / {row['tools']['etcdctl']['requests']:.1f}")
    return rows


def cluster_writes(L, cfg, argv, srv):
    """tool → etcd's committed raft proposals per run."""
    writes = {}
    for t in argv:
        before = srv.proposals()
        for _ in range(cfg["etcd_writes_runs"]):
            check_ok(" ".join(argv[t]), L.timed(argv[t])[1])
        writes[t] = (srv.proposals() - before) / cfg["etcd_writes_runs"]
    return writes


def cluster_handoff(L, T, cfg, stamp, work, srv):
    """tool → hand-off gaps (ns) between two "hosts" (loop dirs for
    looplock) running `stamp` under one lock name."""
    dirs = []
    for h in range(2):
        d = Path(work) / f"host{h}"
        d.mkdir(exist_ok=True)
        dirs.append(str(d))
    hand = {}
    for t in ("looplock", "etcdctl"):
        logf = str(Path(work) / f"etcd-stamps-{t}.log")
        cmd = [stamp, logf, str(cfg["etcd_hand_hold_us"])]
        if t == "looplock":
            per = [[T.looplock, "--etcd", srv.url, "--lock-name", "bench-hand", "-p", "blocking", d, "--", *cmd]
                   for d in dirs]
        else:
            per = [[ETCDCTL, "--endpoints", srv.url, "lock", "bench-hand-ctl", "--", *cmd]] * 2
        run_drivers(L, 2, cfg["etcd_hand_per_host"], per)
        g, o, count = handoff_gaps(logf)
        if count != 2 * cfg["etcd_hand_per_host"]:
            raise BenchError(f"{t}: {count} stamps for {2 * cfg['etcd_hand_per_host']} runs")
        if o:
            raise BenchError(f"cluster hand-off: commands overlapped under {t} ({o}): the lock did not exclude")
        hand[t] = g
    return hand


def cluster(L, T, cfg, stamp, work):
    """looplock --etcd against etcdctl lock on one etcd member the bench
    starts. Result: skipped (why) and tools when it cannot run; otherwise
    tools (looplock, etcdctl), wall (tool → ns; "looplock" includes the
    hand-over to looplock-etcd), parts (the breakdown's runs: "helper",
    looplock-etcd run directly; "looplock --version", "looplock-etcd
    --version", "etcdctl version": each tool's start-up alone → ns), reps,
    writes (tool → etcd writes per run), once_wall and once_writes (the
    same for looplock --etcd --once-per, a slot per run), hand (tool →
    hand-off ns; empty without `stamp`), failover (see failover()),
    keepalives (TTL → keepalives in a hold of hold_s seconds), scale (see
    cluster_scale()), runs, failover_runs, hold_us, per_host, hold_s, tmpfs
    (the member's data is on tmpfs), stamp_missing."""
    tools = ["looplock", "etcdctl"]
    why = cluster_skip_reason(T.looplock)
    if why:
        return dict(skipped=why, tools=tools)
    helper = str(Path(T.looplock).parent / "looplock-etcd")
    srv = EtcdServer(work)
    try:
        argv = {"looplock": [T.looplock, "--etcd", srv.url, "--lock-name", "bench-unc", T.dir, "--", TRUE],
                "etcdctl": [ETCDCTL, "--endpoints", srv.url, "lock", "bench-unc-ctl", "--", TRUE],
                "helper": [helper, "--etcd", srv.url, "--lock-name", "bench-unc", T.dir, "--", TRUE],
                "looplock --version": [T.looplock, "--version"],
                "looplock-etcd --version": [helper, "--version"],
                "etcdctl version": [ETCDCTL, "version"],
                "looplock once-per": [T.looplock, "--etcd", srv.url, "--lock-name", "bench-once", "--once-per", "1ms",
                                      "--operation", "bench", T.dir, "--", TRUE]}
        wall = cluster_uncontended(L, cfg, argv)
        parts = {t: wall.pop(t) for t in ("helper", "looplock --version", "looplock-etcd --version", "etcdctl version")}
        once_wall = wall.pop("looplock once-per")
        writes = cluster_writes(L, cfg, {t: argv[t] for t in ("looplock", "etcdctl", "looplock once-per")}, srv)
        once_writes = writes.pop("looplock once-per")
        fo = failover(L, cfg, {
            "looplock": lambda e: [T.looplock, "--etcd", e, "--lock-name", "bench-fo", T.dir, "--", TRUE],
            "etcdctl": lambda e: [ETCDCTL, "--endpoints", e, "lock", "bench-fo-ctl", "--", TRUE]}, srv)
        hand = cluster_handoff(L, T, cfg, stamp, work, srv) if stamp else {}
        keepalives = holder_keepalives(L, T, cfg, srv)
        scale = cluster_scale(L, T, cfg, stamp, work, srv) if stamp else []
        log(f"  cluster uncontended: looplock {ms(median(wall['looplock']))} ms, "
            f"etcdctl {ms(median(wall['etcdctl']))} ms")
        return dict(tools=tools, wall=wall, parts=parts, reps=cfg["etcd_reps"], writes=writes,
                    once_wall=once_wall, once_writes=once_writes, hand=hand,
                    runs=cfg["etcd_runs"], tmpfs=srv.tmpfs, failover=fo, failover_runs=cfg["etcd_failover_runs"],
                    keepalives=keepalives, hold_s=cfg["etcd_hold_s"], scale=scale,
                    hold_us=cfg["etcd_hand_hold_us"], per_host=cfg["etcd_hand_per_host"], stamp_missing=not stamp)
    finally:
        srv.stop()
