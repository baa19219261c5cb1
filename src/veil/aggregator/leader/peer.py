"""The helper as the leader knows it: the calls it answers, and its clock,
read from every job's answer, which decides when a report it found too early
goes to it again and which uploads it would find expired."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from veil.aggregator.core import AggregationAnswer, VerifyInitItem
from veil.aggregator.leader.skew import ClockOffset, ClockWatch
from veil.hpke import Ciphertext
from veil.task import LeaderTask

# How long a report the helper found too early waits when the helper's clock
# is not known (an older helper that does not send it), and at least.
_TOO_EARLY_WAIT = 30.0
_MIN_TOO_EARLY_WAIT = 1.0


def helper_of(task: LeaderTask) -> str:
    """Which helper a task's calls go to: its DAP helper's endpoint, or its
    gRPC address (a leader's tasks need not share one)."""
    if task.dap is not None:
        return f"dap {task.dap.helper_endpoint}"
    return f"grpc {task.helper_address}"


class HelperApi(Protocol):
    """The helper as the leader calls it (a gRPC client in production).

    Implementations raise Unavailable when the helper cannot be reached (the
    leader retries later) and other AggregatorError subclasses for refusals.
    """

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
        batch_id: bytes | None = None,
    ) -> AggregationAnswer: ...

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        batch_id: bytes | None = None,
    ) -> Ciphertext: ...


class HelperPeer:
    """The helper's API with what the leader learns of its clock (`clocks`,
    each helper's clock against ours). A report the helper finds too early is
    sent again for up to `max_clock_lag` seconds after its time."""

    def __init__(
        self,
        api: HelperApi,
        clocks: ClockWatch,
        clock: Callable[[], float],
        max_clock_lag: float,
    ) -> None:
        self.api = api
        self.clocks = clocks
        self.clock = clock
        self.max_clock_lag = max_clock_lag

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        batch_id: bytes | None = None,
    ) -> AggregationAnswer:
        """The helper's step of a job (of the leader-selected batch
        `batch_id`, if any); reads the helper's clock from its answer."""
        sent = self.clock()
        if batch_id is None:
            answer = self.api.aggregate(task, job_id, items)
        else:
            answer = self.api.aggregate(task, job_id, items, batch_id=batch_id)
        if answer.helper_time is not None:
            reading = ClockOffset.measure(
                task.helper_address, sent, answer.helper_time, self.clock()
            )
            self.clocks.record(reading, task.max_clock_skew / 2)
        return answer

    def horizon(self, task: LeaderTask, now: float) -> int | None:
        """The report horizon by the helper's clock, where it is ahead of ours
        (latest reading, at its largest): a report older than that would be
        acknowledged here and then dropped by the helper as expired, so it
        is refused at upload instead. None if nothing more is refused."""
        horizon = task.report_horizon(now)
        if horizon is None:
            return None
        reading = self.clocks.latest(task.helper_address)
        if reading is None or reading.offset + reading.uncertainty <= 0:
            return None
        return horizon + math.ceil(reading.offset + reading.uncertainty)

    def too_early_wait(self, task: LeaderTask, report_time: int, now: float) -> float | None:
        """Seconds until a report the helper found too early goes to the helper
        again: until the helper's clock, by the latest reading, reaches
        report_time - max_clock_skew (when the helper takes it). None once
        max_clock_lag has passed since report_time: then it is rejected.

        The helper checks the report against its own clock every time: a
        wrong reading only makes the report wait longer or go again sooner."""
        last_chance = report_time + self.max_clock_lag
        if now >= last_chance:
            return None
        reading = self.clocks.latest(task.helper_address)
        if reading is None:
            wait = _TOO_EARLY_WAIT
        else:
            # In the helper's time: report_time - max_clock_skew; in ours,
            # less its offset; a second more against rounding.
            ready = report_time - task.max_clock_skew - reading.offset + reading.uncertainty
            wait = ready + 1.0 - now
        return min(max(wait, _MIN_TOO_EARLY_WAIT), last_chance - now)

    def describe_clock(self, task: LeaderTask) -> str:
        """The helper's clock as last read, for a log line."""
        reading = self.clocks.latest(task.helper_address)
        return "not known" if reading is None else reading.describe()
