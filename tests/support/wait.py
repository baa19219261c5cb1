"""Waiting on a condition (never for a fixed time): poll until it holds,
fail saying what was awaited once the deadline passes."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def kill_once(args: Sequence[str], condition: Callable[[], object], what: str) -> None:
    """Start `args`, wait until `condition` holds, then SIGKILL the process:
    a crash at that point. However the wait ends, the process is killed and
    reaped (left running, it outlived its test and failed a later one as an
    unraisable ResourceWarning). The deadline is generous: a condition that
    comes costs nothing, and one process start beside a loaded suite took
    more than 60 s."""
    child = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        wait_until(condition, what, timeout=180.0)
    finally:
        child.kill()
        returncode = child.wait()
    assert returncode == -signal.SIGKILL, f"it ended by itself ({returncode}) before the kill"
