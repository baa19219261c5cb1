"""Survey windows sized by how slow this machine is now.

A test that deploys a survey must fit its respondents inside the window and
then wait for the window to close before it collects. A window sized for the
suite's own load closes too early on a busier machine (40 to 60 s closed
before a respondent's process had answered at load 6 to 14: "the survey
closed at ...: nothing was sent"); sized for the worst machine, every run
waits minutes. So a test states the window it needs while the suite runs
alone, margin included, and `survey_window` stretches it by how much slower
than that a `veil` process starts just before the test deploys. The tests'
processes are CPU-bound (imports, keys, sharding), so a start's wall time over
its CPU time is how much longer the work inside the window takes while other
processes share the cores.
"""

from __future__ import annotations

import math
import resource
import statistics
import subprocess
import sys
import time

# The slowdown the tests' windows were sized at: the suite alone runs two
# worker processes a core (tests/conftest.py), each at about half speed.
SUITE_SLOWDOWN = 2.0
# The median of three starts: one start can fall in a quiet or a busy moment.
SAMPLES = 3


def startup_slowdown() -> float:
    """Wall time over CPU time of starting `veil` (its CLI and every command
    module imported) in a child process, the median of SAMPLES starts."""
    ratios = []
    for _ in range(SAMPLES):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "veil.cli", "--version"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        ratios.append(wall / max(cpu, 1e-3))
    return statistics.median(ratios)


def survey_window(at_suite_load: float, time_precision: int) -> int:
    """The window, in seconds, for a test that needs `at_suite_load` seconds
    (its margin included) while the suite runs alone: stretched by the
    slowdown measured now beyond SUITE_SLOWDOWN (never shortened), and rounded
    up to whole time_precision buckets (a survey's opens and closes are
    aligned to them)."""
    stretch = max(1.0, startup_slowdown() / SUITE_SLOWDOWN)
    return math.ceil(at_suite_load * stretch / time_precision) * time_precision
