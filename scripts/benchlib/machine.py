"""What the report says about the machine it ran on: the CPU, the kernel,
both tools' versions, the lock directory's file system, the date, and the
load average (read at the start and at the end of the run)."""
import datetime
import os
import platform
import subprocess
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
