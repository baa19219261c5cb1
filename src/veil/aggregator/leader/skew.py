"""How far the helper's clock is from the leader's, read from every aggregation job.

The helper puts its clock in each aggregation job's answer (helper_time_ms).
The leader reads its own clock just before sending the job and just after the
answer arrives; the helper's reading lies somewhere in between, so

    offset = helper_time - (sent + received) / 2,  within ± (received - sent) / 2

(plus a millisecond for the helper's rounding): positive when the helper's
clock is ahead of the leader's.

What the leader does with it: it says when to send a report the helper found
too early again, warns in its log, exports it as a metric and keeps the
latest reading in its database for `veil status` and the upload front ends.
The helper never learns or uses it: it checks each report against its own
clock, so a helper that misstates its time can only delay reports, and a
leader cannot use this to make the helper take a report from further in the
future than the task's max_clock_skew.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from veil.aggregator.store.base import Datastore
from veil.metrics import Metrics

log = logging.getLogger(__name__)

# How often a changed reading is written to the database (at most), and how
# much it must have moved to be written sooner.
PERSIST_SECONDS = 10.0
PERSIST_MOVE = 1.0
# How often the same warning about a large offset is logged again.
WARN_EVERY_SECONDS = 600.0
# How old the in-memory reading may be before the database is asked for a
# newer one (another process, e.g. a `veil worker`, may have measured it).
REREAD_SECONDS = 30.0


@dataclass(frozen=True)
class ClockOffset:
    """One reading of a helper's clock against the leader's."""

    helper: str  # the helper's address
    offset: float  # helper's clock minus the leader's, in seconds
    uncertainty: float  # the true offset is within offset ± uncertainty
    measured: float  # the leader's clock when it was taken

    @staticmethod
    def measure(helper: str, sent: float, helper_time: float, received: float) -> ClockOffset:
        """From the leader's clock around one call and the helper's time in its answer."""
        return ClockOffset(
            helper,
            helper_time - (sent + received) / 2,
            max(0.0, received - sent) / 2 + 0.001,
            received,
        )

    def describe(self) -> str:
        """E.g. "300.2 s behind the leader's (± 0.004 s)"."""
        side = "ahead of" if self.offset >= 0 else "behind"
        return f"{abs(self.offset):.1f} s {side} the leader's (± {self.uncertainty:.3f} s)"

    def beyond(self, seconds: float) -> bool:
        """Whether the offset surely exceeds `seconds` either way."""
        return abs(self.offset) - self.uncertainty > seconds


class ClockWatch:
    """The leader's latest reading of each helper's clock (thread-safe)."""

    def __init__(
        self,
        store: Datastore,
        metrics: Metrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._latest: dict[str, ClockOffset] = {}
        self._persisted: dict[str, tuple[float, float]] = {}  # helper -> (offset, when)
        self._warned: dict[str, float] = {}
        self._read_at = -float("inf")

    def record(self, reading: ClockOffset, tolerance: float) -> None:
        """Take a new reading; warn if the clocks differ by more than
        `tolerance` seconds (the job's task's max_clock_skew / 2: beyond the
        task's max_clock_skew the helper starts finding reports too early,
        or, ahead, expiring them sooner than the leader)."""
        now = self._monotonic()
        with self._lock:
            first = reading.helper not in self._latest
            self._latest[reading.helper] = reading
            last = self._persisted.get(reading.helper)
            persist = (
                last is None
                or now - last[1] >= PERSIST_SECONDS
                or abs(reading.offset - last[0]) >= PERSIST_MOVE
            )
            if persist:
                self._persisted[reading.helper] = (reading.offset, now)
            warn = reading.beyond(tolerance) and (
                now - self._warned.get(reading.helper, -float("inf")) >= WARN_EVERY_SECONDS
            )
            if warn:
                self._warned[reading.helper] = now
        if self.metrics is not None:
            self.metrics.helper_clock_offset.labels(reading.helper).set(reading.offset)
        if persist:
            self.store.record_peer_clock(
                reading.helper, reading.offset, reading.uncertainty, reading.measured
            )
        if warn:
            log.warning(
                "the clock of the helper at %s is %s: reports it finds too early are sent"
                " again later, but collections wait for them; set both clocks right (NTP)",
                reading.helper,
                reading.describe(),
            )
        elif first:
            log.info("the clock of the helper at %s is %s", reading.helper, reading.describe())

    def latest(self, helper: str) -> ClockOffset | None:
        """The newest reading for `helper`: this process's own, or one another
        process stored (the database is read at most every REREAD_SECONDS)."""
        now = self._monotonic()
        with self._lock:
            reread = now - self._read_at >= REREAD_SECONDS
            if reread:
                self._read_at = now
        if reread:
            for peer, offset, uncertainty, measured in self.store.peer_clocks():
                with self._lock:
                    mine = self._latest.get(peer)
                    if mine is None or measured > mine.measured:
                        self._latest[peer] = ClockOffset(peer, offset, uncertainty, measured)
        with self._lock:
            return self._latest.get(helper)
