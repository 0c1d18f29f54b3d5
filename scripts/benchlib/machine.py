"""What the report says about the machine it ran on: the CPU, the kernel,
both tools' versions, the lock directory's file system, the date, the load
average (read at the start and at the end of the run) and how much CPU
other processes took while the bench ran."""
import datetime
import os
import platform
import subprocess
import time
from pathlib import Path


def first_line(argv):
    """The first line argv writes (stdout, else stderr); "unknown" if none."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_info(looplock, flock, work, root):
    """The Machine table's rows, in order: name → value. work is the lock
    directory, root the source tree (for its commit)."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = file_system(work)
    commit = first_line(["git", "-C", str(root), "describe", "--always", "--dirty"])
    return {
        "CPU": model,
        "CPUs (nproc)": str(len(os.sched_getaffinity(0))),
        "kernel": platform.release(),
        "looplock": f"{first_line([looplock, '--version'])} ({looplock}; source {commit})",
        "flock(1)": f"{first_line([flock, '--version'])} ({flock})",
        "lock directory file system": fs,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def mount_of(path, mounts_text):
    """(mount point, type, device) of the mount in /proc/mounts' text that
    holds path (the longest mount point that is a prefix of it), or None."""
    best = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        device, point, fstype = fields[0], fields[1].replace("\\040", " "), fields[2]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fstype, device)
    return best


def file_system(path):
    """The file system that holds path, as /proc/mounts names it: "ext4
    (/dev/vda on /)"; "unknown" without /proc/mounts."""
    try:
        found = mount_of(os.path.realpath(path), Path("/proc/mounts").read_text())
    except OSError:
        found = None
    if not found:
        return "unknown"
    point, fstype, device = found
    return f"{fstype} ({device} on {point})"


def loadavg():
    """The 1, 5 and 15-minute load averages, as /proc/loadavg writes them."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def cpu_busy_seconds():
    """The time all CPUs have spent busy since boot, in seconds: /proc/stat's
    first line, user + nice + system + irq + softirq + steal (steal is what
    the hypervisor gave to other machines). None without /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    except (OSError, IndexError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds():
    """The CPU time of this process and of the children it has reaped (the
    tools, their commands, etcd), in seconds."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherLoad:
    """How many CPUs, on average, processes other than the bench and its
    children kept busy from its making to others(). The load average
    cannot say it: the bench's own contended scenarios run 32 processes at
    once and raise it themselves."""

    def __init__(self):
        self.busy = cpu_busy_seconds()
        self.own = own_cpu_seconds()
        self.at = time.monotonic()

    def others(self):
        """The average number of CPUs others used, or None if unknown."""
        return others_cpus(self.busy, cpu_busy_seconds(), self.own, own_cpu_seconds(), time.monotonic() - self.at)


def others_cpus(busy_start, busy_end, own_start, own_end, elapsed):
    """The CPUs others kept busy on average over elapsed seconds: all the
    CPUs' busy time less the bench's own (never below 0: the two clocks tick
    at different grains). None if /proc/stat could not be read."""
    if busy_start is None or busy_end is None or elapsed <= 0:
        return None
    return max(0.0, (busy_end - busy_start) - (own_end - own_start)) / elapsed
