"""Admission control for uploads: the leader's backlog is bounded (issue 26).

Every report the leader acknowledges waits in its store until an aggregation
job has verified it (report states pending and in_job: the backlog). When
uploads outrun aggregation for long, the backlog would grow without end, and
with it the database and the time a collection waits. So the leader admits
an upload only while the backlog is below its limits, per task and over all
the tasks it serves (`[admission]` in the server configuration); above them
it refuses the upload with Overloaded (UNAVAILABLE, retryable, and an advised
wait in the trailing metadata), before anything is stored. A report is
refused or stored, never acknowledged and then dropped for lack of room.

Counting the backlog is a range scan of an index (some milliseconds per
100,000 reports), too much for every upload. So the backlog is counted at
most every `recount_seconds`, and never for more than a twentieth of the
time, by the upload that finds the last count stale; in between, what this
process admits is added to it. (`recount_seconds = 0` counts at every
upload: exact, and costly with a large backlog.) The estimate errs towards refusing: what
aggregation took away since the last count is subtracted only at the next.
What other processes stored since the last count (several upload front ends
on one PostgreSQL) is seen at the next count: with F front ends the backlog
may exceed a limit by what F - 1 of them admit in one recount period.

Only one bit reaches a client, "the backlog is at its limit": an upload is
admitted whenever the backlog is below the limit, whatever its size (so the
backlog may exceed a limit by one request, at most 10,000 reports), so no
client can measure the backlog by varying the size of what it sends; and
the advised wait is the configured constant.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from veil.aggregator.errors import Overloaded

# The defaults of the [admission] settings (veil.aggregator.run.config).
DEFAULT_MAX_PENDING_REPORTS = 1_000_000
DEFAULT_MAX_PENDING_PER_TASK = 500_000
DEFAULT_RETRY_AFTER_SECONDS = 2.0
DEFAULT_RECOUNT_SECONDS = 0.5
# A recount takes at most this share of the time (the period stretches
# when counting is slow: a large backlog, a busy database).
MAX_COUNTING_SHARE = 1 / 20


@dataclass(frozen=True)
class AdmissionLimits:
    """How many reports may wait for aggregation (0: no limit), and what a
    refused client is told."""

    max_pending_reports: int = DEFAULT_MAX_PENDING_REPORTS  # over every task served
    max_pending_per_task: int = DEFAULT_MAX_PENDING_PER_TASK
    retry_after_seconds: float = DEFAULT_RETRY_AFTER_SECONDS
    recount_seconds: float = DEFAULT_RECOUNT_SECONDS

    def __post_init__(self) -> None:
        if self.max_pending_reports < 0 or self.max_pending_per_task < 0:
            raise ValueError("admission limits must not be negative (0: no limit)")
        if self.retry_after_seconds < 0 or self.recount_seconds < 0:
            raise ValueError("admission times must not be negative")

    @property
    def unlimited(self) -> bool:
        return self.max_pending_reports == 0 and self.max_pending_per_task == 0


class Backlog:
    """The leader's estimate of its backlog, and the admission of uploads.

    `count` returns the backlog of each served task as the store holds it
    now. `reserve` admits an upload of `n` reports or raises Overloaded;
    every reservation is followed by one `settle`, saying how many of its
    reports were stored (0 if the upload failed). Thread-safe.
    """

    def __init__(
        self,
        limits: AdmissionLimits,
        count: Callable[[], Mapping[bytes, int]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._count = count
        self._clock = clock
        self._lock = threading.Lock()
        self._counted: dict[bytes, int] = {}  # per task, at the last count
        self._added: dict[bytes, int] = {}  # stored by this process since
        self._reserved: dict[bytes, int] = {}  # admitted, not settled yet
        self._counted_at = float("-inf")
        self._period = limits.recount_seconds
        self._counting = False

    def pending(self, task_id: bytes) -> int:
        """The estimated backlog of one task (what admission decides on)."""
        with self._lock:
            return self._pending(task_id)

    def total(self) -> int:
        with self._lock:
            return self._total()

    def _pending(self, task_id: bytes) -> int:
        return (
            self._counted.get(task_id, 0)
            + self._added.get(task_id, 0)
            + self._reserved.get(task_id, 0)
        )

    def _total(self) -> int:
        parts = (self._counted, self._added, self._reserved)
        return sum(sum(part.values()) for part in parts)

    def reserve(self, task_id: bytes, n: int) -> None:
        """Admit an upload of `n` reports of `task_id`, or raise Overloaded."""
        limits = self.limits
        if limits.unlimited:
            return
        self._recount_if_stale()
        with self._lock:
            per_task, total = limits.max_pending_per_task, limits.max_pending_reports
            if (per_task and self._pending(task_id) >= per_task) or (
                total and self._total() >= total
            ):
                raise Overloaded(
                    "the leader holds as many reports waiting for aggregation as it admits;"
                    " nothing was stored: send the same reports again in"
                    f" {limits.retry_after_seconds:g} s",
                    limits.retry_after_seconds,
                )
            self._reserved[task_id] = self._reserved.get(task_id, 0) + n

    def settle(self, task_id: bytes, n: int, stored: int) -> None:
        """End the reservation of `n` reports, of which `stored` were stored."""
        if self.limits.unlimited:
            return
        with self._lock:
            self._reserved[task_id] -= n
            self._added[task_id] = self._added.get(task_id, 0) + stored

    def _recount_if_stale(self) -> None:
        began = self._clock()
        with self._lock:
            if self._counting or began - self._counted_at < self._period:
                return
            self._counting = True
            # Stored before the count begins: in the count, so no longer added.
            added_before = dict(self._added)
        try:
            counted = dict(self._count())
        finally:
            with self._lock:
                self._counting = False
        ended = self._clock()
        with self._lock:
            self._counted = counted
            # What was stored during the count may be in it too: counted
            # twice until the next count, which errs towards refusing.
            for task_id, n in added_before.items():
                self._added[task_id] -= n
            self._counted_at = ended
            if self.limits.recount_seconds > 0:
                self._period = max(
                    self.limits.recount_seconds, (ended - began) / MAX_COUNTING_SHARE
                )
