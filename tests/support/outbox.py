"""What the outbox crash tests share, for veil's own tasks and DAP tasks
alike: `veil` as a client process, the reports an outbox still holds, a
client killed while its request waits on a frozen leader, and the flush that
delivers what is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.wait import kill_once
from veil.client import Outbox, TaskStatus
from veil.client.outbox import ReportCodec


def veil_command(*args: str) -> list[str]:
    """`veil ARGS...` through this interpreter, as a process to start or kill."""
    return [sys.executable, "-m", "veil.cli", *args]


def statuses(box: Path, codec: ReportCodec[Any] | None = None) -> list[TaskStatus]:
    """Each task's counts in the outbox file `box` (`codec`: how its reports
    are kept, veil's own unless given)."""
    outbox = Outbox(box) if codec is None else Outbox(box, codec=codec)
    with outbox:
        return outbox.status()


def pending(box: Path, codec: ReportCodec[Any] | None = None) -> int:
    """Reports sealed and not yet acknowledged; 0 before the file exists."""
    if not box.exists():
        return 0
    return sum(t.pending for t in statuses(box, codec))


def kill_while_frozen(
    leader_pid: int,
    command: list[str],
    box: Path,
    stored: int,
    codec: ReportCodec[Any] | None = None,
) -> None:
    """Sealed, stored, sent, never acknowledged: freeze the leader (SIGSTOP),
    run the client `command`, and SIGKILL it once `box` holds `stored`
    reports pending, its request waiting for an answer; the leader then runs
    on (SIGCONT) however that ends."""
    os.kill(leader_pid, signal.SIGSTOP)
    try:
        kill_once(command, lambda: pending(box, codec) == stored, f"{stored} reports stored")
    finally:
        os.kill(leader_pid, signal.SIGCONT)


def flush(box: Path, task: Path, codec: ReportCodec[Any] | None = None) -> TaskStatus:
    """`veil outbox flush`: it succeeds and leaves nothing pending. Returns
    the task's counts afterwards (the outbox holds one task)."""
    done = subprocess.run(
        veil_command("outbox", "flush", "--outbox", str(box), "--task", str(task)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert pending(box, codec) == 0
    (final,) = statuses(box, codec)
    return final
