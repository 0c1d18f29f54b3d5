"""looplock's benchmark suite, which scripts/bench drives.

  stats.py      percentiles, medians and ratios, and how numbers are written
  launcher.py   starting the tools alike (posix_spawn, timed runs, driver
                loops) and reading /proc about them
  peers.py      the processes a scenario needs beside the tools: a holder of
                the lock, an etcd member, a blackholed endpoint, the `stamp`
                command
  scenarios.py  one function per scenario, returning its measurements as
                plain data (dicts of lists of nanoseconds, KiB, counts)
  machine.py    what the report says about the machine and its load
  figures.py    the numbers the report derives from the measurements, and
                the targets judged on them (pure)
  report.py     the Markdown report, a pure function of the results (pure)
  plot.py       the plot written beside the report

BenchError and log are shared by all of them.
"""
import sys


class BenchError(Exception):
    """A tool misbehaved (a wrapped run failed, a deadline ended with the
    wrong status, the lock did not exclude): the bench fails with status 1."""


def log(msg):
    """A progress line on stderr."""
    print(f"bench: {msg}", file=sys.stderr, flush=True)
