"""Command-line behaviour: help, version, usage errors (exit 64)."""
from conftest import EX_USAGE, run


def test_version():
    r = run(["--version"])
    assert r.returncode == 0
    assert r.stdout.startswith("looplock ")
