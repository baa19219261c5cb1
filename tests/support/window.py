"""A survey's window in the tests: long, and closed by the test once its
respondents are done.

A window sized to fit the respondents closed under them on a machine busier
than guessed ("the survey closed at ...: nothing was sent"), and was waited
out to its end on a quiet one. So a test deploys a survey open for
LONG_WINDOW, which no load outlasts, and when its respondents have answered
(a condition) it closes the survey as its organisations would
(`close_survey`): `veil survey close` on the deployment, SIGHUP to both
servers, waiting until each logged the new window, then until the new end,
at most one time_precision away, has passed.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support.cli import veil
from tests.support.wait import wait_until
from veil.local.launcher import ServerProcess
from veil.times import format_time, parse_time

# Seconds a test's survey is open for: far longer than any run of its
# respondents, however busy the machine.
LONG_WINDOW = 3600

_CLOSES = re.compile(r"the survey closes at (\S+) \(was ")


def close_survey(parts: Path | Sequence[Path], servers: Sequence[ServerProcess]) -> int:
    """Close a deployed survey now; returns its new end.

    `parts` is the directory `veil survey deploy` wrote, or the parts of it
    each organisation holds (the first closes at the end of the current
    time-precision interval, the others at that same time). Each of `servers`
    (the leader and the helper, running) is sent SIGHUP, and this waits
    until each has logged that it takes reports up to the new end, then
    until that end has passed: the survey is then closed for every party and
    can be collected."""
    first, *others = [parts] if isinstance(parts, Path) else parts
    closed = veil("survey", "close", first)
    assert closed.returncode == 0, closed.stderr
    said = _CLOSES.search(closed.stdout)
    assert said is not None, closed.stdout
    end = parse_time(said.group(1))
    for part in others:
        done = veil("survey", "close", part, "--at", format_time(end))
        assert done.returncode == 0, done.stderr
    reload(servers, end)
    wait_until(lambda: time.time() >= end, f"the survey's new end, {format_time(end)}")
    return end


def reload(servers: Sequence[ServerProcess], end: int) -> None:
    """SIGHUP to each of `servers`, then wait until each has logged that it
    takes reports up to `end`. A server changes every task's window before
    it logs the first (veil.aggregator.run.config.reload_tasks), so one line
    says all of them changed."""
    line = f" to {format_time(end)} (was "
    logged = {s.log: s.log.read_text().count(line) for s in servers}
    for server in servers:
        assert server.proc is not None and server.proc.poll() is None, server.role
        server.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: all(log.read_text().count(line) > n for log, n in logged.items()),
        f"the servers to take reports up to {format_time(end)} after SIGHUP",
        timeout=120,
    )
