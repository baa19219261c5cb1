"""How much slower than the suite alone this machine runs a process now: a
start's wall time over its CPU time (the tests' processes are CPU-bound:
imports, keys, sharding), for a bound on latency that other work on the
machine may stretch (the survey page under attack,
tests/reliability/test_page_many_addresses.py)."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time

# The slowdown the page's latency bound was sized at: the suite alone ran two
# worker processes a core (tests/conftest.py), each at about half speed.
SUITE_SLOWDOWN = 2.0
# The median of three starts: one start can fall in a quiet or a busy moment.
SAMPLES = 3


def startup_slowdown() -> float:
    """Wall time over CPU time of starting a respondent's `veil` (the CLI and
    the client imported, as `veil survey respond` does before it reads its
    answers) in a child process, the median of SAMPLES starts (`veil
    --version` imports too little to stand for the tests' processes)."""
    ratios = []
    for _ in range(SAMPLES):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", "import veil.cli, veil.client"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        ratios.append(wall / max(cpu, 1e-3))
    return statistics.median(ratios)
