"""The aggregators' clocks apart, in one process (no gRPC), on each backend:
a report the helper finds too early waits at the leader and goes again once
the helper's clock has caught up, or is rejected after max_helper_clock_lag;
a collection the helper finds inside the window (its clock behind) is
retried; the offset readings (veil.aggregator.leader.skew)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import pytest

from tests.support.backends import Backend
from tests.support.in_process import InProcessHelper
from veil.aggregator.errors import ReportTimeRejected
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.leader.skew import WARN_EVERY_SECONDS, ClockOffset, ClockWatch
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import prepare_report
from veil.metrics import Metrics
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task

SKEW = 60
BEHIND = 300.0


class Clock:
    """The real time, moved by `offset` seconds; held still between `freeze`
    and `thaw`."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.frozen: float | None = None

    def __call__(self) -> float:
        return time.time() + self.offset if self.frozen is None else self.frozen

    def freeze(self) -> None:
        self.frozen = self()

    def thaw(self) -> None:
        self.frozen = None


class Pair:
    """A leader on the real clock and a helper on `helper_clock`."""

    def __init__(
        self,
        backend: Backend,
        files: TaskFiles,
        helper_clock: Callable[[], float],
        **leader_kw: float,
    ) -> None:
        self.files = files
        self.task_id = files.client.task_id
        self.helper_store = backend.store("helper")
        self.leader_store = backend.store("leader")
        self.helper = Helper(
            {files.helper.task_id: files.helper},
            self.helper_store,
            PrivacyEngine(backend.ledger("helper"), [files.helper], allow_exact_release=True),
            clock=helper_clock,
        )
        self.leader = Leader(
            {files.leader.task_id: files.leader},
            LeaderParts(
                self.leader_store,
                InProcessHelper(self.helper),
                PrivacyEngine(backend.ledger("leader"), [files.leader], allow_exact_release=True),
                metrics=Metrics("leader"),
            ),
            LeaderSettings(**leader_kw),  # type: ignore[arg-type]
        )
        for side in (self.helper, self.leader):
            assert side.privacy.pool.wait_ready(60)

    def upload(self, t: int, n: int = 1) -> list[bytes]:
        reports = [
            prepare_report(
                self.files.client, 1, self.leader.current_config, self.helper.current_config, t
            )
            for _ in range(n)
        ]
        assert self.leader.upload(self.task_id, reports) == (n, 0)
        return [r.report_id for r in reports]

    def drive(self) -> None:
        while self.leader.run_once():
            pass


def _task(**kw: int) -> TaskFiles:
    return new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
        time_precision=1,
        max_clock_skew=SKEW,
        **kw,
    )


def test_a_report_too_early_for_the_helper_waits_and_is_counted(backend: Backend) -> None:
    helper_clock = Clock(-BEHIND)
    pair = Pair(backend, _task(), helper_clock)
    # Stamped so that the helper, BEHIND s back, takes it 3 s after now by its
    # clock, which stands still until the report has been found too early
    # (however slowly this machine uploads and drives).
    helper_clock.freeze()
    t = int(helper_clock()) + SKEW + 3
    start = time.monotonic()
    ids = pair.upload(t)
    pair.drive()
    assert pair.leader_store.deferred_count(pair.task_id) == 1
    assert pair.leader_store.unaggregated_count(pair.task_id, t, t + 1) == 1
    # Nothing final on either side: no rejection counted, no replay record
    # at the helper (so the report can be taken when it comes again).
    assert pair.leader_store.rejections(pair.task_id) == {}
    assert pair.helper_store.rejections(pair.task_id) == {}
    assert pair.helper_store.seen_reports(pair.task_id, ids) == set()
    reading = pair.leader.clocks.latest("127.0.0.1:2")
    # BEHIND, and as much more as the helper's clock stood still before it was read.
    held = time.monotonic() - start
    assert reading is not None and -BEHIND - held - 1 < reading.offset < -BEHIND + 1
    assert pair.leader_store.peer_clocks()[0][0] == "127.0.0.1:2"
    metrics = pair.leader.metrics
    assert metrics is not None
    assert b"veil_reports_deferred_total" in metrics.render()
    # The helper's clock runs again: by the time the leader, going by its
    # reading, sends the report again, the helper takes it.
    helper_clock.thaw()
    deadline = time.monotonic() + 30
    while pair.leader_store.deferred_count(pair.task_id):
        assert time.monotonic() < deadline, "the report never went to the helper again"
        time.sleep(0.2)
        pair.drive()
    token = pair.files.collector.collector_token
    job = secrets.token_bytes(16)
    pair.leader.create_collection(pair.task_id, token, job, t, 1)
    pair.drive()
    record = pair.leader.get_collection(pair.task_id, token, job)
    assert (record.state, record.report_count) == ("finished", 1)
    assert pair.helper_store.seen_reports(pair.task_id, ids) == set(ids)


def test_a_report_still_too_early_after_the_lag_is_rejected(backend: Backend) -> None:
    pair = Pair(backend, _task(), Clock(-BEHIND), max_helper_clock_lag=0)
    t = int(time.time())
    pair.upload(t, 3)
    pair.drive()
    assert pair.leader_store.deferred_count(pair.task_id) == 0
    assert pair.leader_store.unaggregated_count(pair.task_id, t, t + 1) == 0
    assert pair.leader_store.rejections(pair.task_id) == {"report_too_early": 3}
    assert pair.helper_store.rejections(pair.task_id) == {}


def test_a_collection_waits_for_a_helper_whose_clock_is_in_the_window(
    backend: Backend,
) -> None:
    # The window closed 10 s ago by the leader's clock; by the helper's,
    # 290 s behind, it closes in 280 s: the collection is retried, not failed.
    closes = int(time.time()) - 10
    helper_clock = Clock(-BEHIND + 10)
    pair = Pair(
        backend, _task(not_after=closes), helper_clock, retry_seconds=0.01, max_retry_seconds=0.05
    )
    start = closes - 400  # old enough for the helper to take at once
    pair.upload(start, 2)
    pair.drive()
    token = pair.files.collector.collector_token
    job = secrets.token_bytes(16)
    pair.leader.create_collection(pair.task_id, token, job, start, 30)
    pair.drive()
    record = pair.leader.get_collection(pair.task_id, token, job)
    assert record.state == "pending"
    assert "accepts reports until" in record.error_message
    helper_clock.offset = 0.0
    deadline = time.monotonic() + 30
    while (record := pair.leader.get_collection(pair.task_id, token, job)).state == "pending":
        assert time.monotonic() < deadline, record.error_message
        time.sleep(0.05)
        pair.drive()
    assert (record.state, record.report_count) == ("finished", 2)


def test_offset_reading() -> None:
    # The helper read 1000.5 between the leader's 700.0 and 701.0: 300 s ahead.
    r = ClockOffset.measure("h:1", 700.0, 1000.5, 701.0)
    assert (r.offset, r.measured) == (300.0, 701.0)
    assert r.uncertainty == pytest.approx(0.501)
    assert r.describe() == "300.0 s ahead of the leader's (± 0.501 s)"
    assert r.beyond(299) and not r.beyond(299.6)
    behind = ClockOffset.measure("h:1", 700.0, 399.0, 702.0)
    assert behind.offset == -302.0
    assert "302.0 s behind" in behind.describe()


def test_clock_watch_warns_once_in_a_while_and_persists(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteDatastore(":memory:")
    ticks = [0.0]
    watch = ClockWatch(store, Metrics("leader"), monotonic=lambda: ticks[0])
    caplog.set_level(logging.INFO, logger="veil.aggregator.leader.skew")
    watch.record(ClockOffset("h:1", 0.2, 0.01, 1000.0), tolerance=30)
    assert "0.2 s ahead" in caplog.text and "WARNING" not in caplog.text
    for i in range(5):
        ticks[0] = float(i)
        watch.record(ClockOffset("h:1", -100.0 - i, 0.01, 1001.0 + i), tolerance=30)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "100.0 s behind" in warnings[0].getMessage()
    # Stored at once when it moved by more than a second.
    assert store.peer_clocks() == [("h:1", -104.0, 0.01, 1005.0)]
    ticks[0] = WARN_EVERY_SECONDS + 10
    watch.record(ClockOffset("h:1", -100.0, 0.01, 2000.0), tolerance=30)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    latest = watch.latest("h:1")
    assert latest is not None and latest.measured == 2000.0


def test_a_report_the_helper_ahead_would_expire_is_refused_at_upload(
    backend: Backend,
) -> None:
    pair = Pair(backend, _task(report_expiry_age=600), Clock(BEHIND))
    now = int(time.time())
    pair.upload(now)
    pair.drive()  # the first job's answer gives the helper's clock
    # 500 s old: within the leader's 600 s, beyond the helper's (300 s ahead).
    old = prepare_report(
        pair.files.client, 1, pair.leader.current_config, pair.helper.current_config, now - 500
    )
    with pytest.raises(ReportTimeRejected, match="by the helper's clock, which is ahead"):
        pair.leader.upload(pair.task_id, [old])
    assert pair.leader_store.unaggregated_count(pair.task_id, 0, 2**62) == 0
    pair.upload(now - 200)
    pair.drive()
    assert pair.leader_store.rejections(pair.task_id) == {}
    assert pair.helper_store.rejections(pair.task_id) == {}
    token = pair.files.collector.collector_token
    job = secrets.token_bytes(16)
    pair.leader.create_collection(pair.task_id, token, job, now - 200, 201)
    pair.drive()
    record = pair.leader.get_collection(pair.task_id, token, job)
    assert (record.state, record.report_count) == ("finished", 2)
