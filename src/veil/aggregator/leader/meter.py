"""What the leader counts, as events: one seam between its logic and the
metrics. `LeaderMeter` counts nothing (a leader built without metrics, as in
most tests); `PrometheusMeter` counts into a `veil.metrics.Metrics`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from veil.aggregator.errors import AggregatorError, ReportRejection
from veil.aggregator.privacy import PrivacyEngine
from veil.metrics import Metrics
from veil.task import LeaderTask, b64e


class LeaderMeter:
    """The leader's events, counted nowhere."""

    def upload_refused(self, task: LeaderTask, error: AggregatorError) -> None:
        pass

    def uploaded(self, task: LeaderTask, stored: int, duplicates: int) -> None:
        pass

    def backlog(self, counts: Mapping[bytes, int]) -> None:
        """Each task's reports waiting for aggregation."""

    def helper_unavailable(self) -> None:
        """An aggregation job waits because the helper could not be reached."""

    def job_finished(
        self,
        task: LeaderTask,
        seconds: float,
        report_count: int,
        accepted: int,
        deferred: int,
        outcomes: Mapping[bytes, ReportRejection | None],
    ) -> None:
        pass

    def job_retrying(self) -> None:
        pass

    def job_given_up(self, task_id: bytes, rejected: int) -> None:
        pass

    def collection(self, task_id: bytes, state: str) -> None:
        """A collection job finished or failed."""

    def prefix_job(
        self,
        task: LeaderTask,
        level: int,
        seconds: float,
        outcomes: Mapping[bytes, ReportRejection | None],
    ) -> None:
        """A Poplar1 aggregation job of one level finished: each report's outcome."""

    def prefix_job_failed(self) -> None:
        """A Poplar1 aggregation job ended in an error (its level retried or failed)."""

    def prefix_level(
        self, task: LeaderTask, level: int, candidates: int, seconds: float, outcome: str
    ) -> None:
        """A Poplar1 level's collection finished, failed or waits for a retry."""

    def budget(self, privacy: PrivacyEngine, task: LeaderTask) -> None:
        """A collection spent some of the task's budget."""

    @staticmethod
    def of(metrics: Metrics | None) -> LeaderMeter:
        return LeaderMeter() if metrics is None else PrometheusMeter(metrics)


class PrometheusMeter(LeaderMeter):
    """The leader's events counted into `metrics` (served on /metrics)."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def upload_refused(self, task: LeaderTask, error: AggregatorError) -> None:
        self.m.uploads_refused.labels(task.id_text, _reason(error)).inc()

    def uploaded(self, task: LeaderTask, stored: int, duplicates: int) -> None:
        self.m.reports_received.labels(task.id_text).inc(stored)
        self.m.reports_duplicate.labels(task.id_text).inc(duplicates)

    def backlog(self, counts: Mapping[bytes, int]) -> None:
        for tid, n in counts.items():
            self.m.reports_unaggregated.labels(b64e(tid)).set(n)

    def helper_unavailable(self) -> None:
        self.m.aggregation_jobs.labels("helper_unavailable").inc()

    def job_finished(
        self,
        task: LeaderTask,
        seconds: float,
        report_count: int,
        accepted: int,
        deferred: int,
        outcomes: Mapping[bytes, ReportRejection | None],
    ) -> None:
        m = self.m
        m.aggregation_jobs.labels("finished").inc()
        m.aggregation_job_seconds.observe(seconds)
        if report_count:
            m.verify_seconds_per_report.observe(seconds / report_count)
        m.reports_accepted.labels(task.id_text).inc(accepted)
        m.reports_deferred.labels(task.id_text).inc(deferred)
        for reason in outcomes.values():
            if reason is not None:
                m.reports_rejected.labels(task.id_text, reason).inc()

    def job_retrying(self) -> None:
        self.m.aggregation_jobs.labels("retrying").inc()

    def job_given_up(self, task_id: bytes, rejected: int) -> None:
        self.m.aggregation_jobs.labels("failed").inc()
        self.m.reports_rejected.labels(b64e(task_id), ReportRejection.JOB_FAILED.value).inc(
            rejected
        )

    def collection(self, task_id: bytes, state: str) -> None:
        self.m.collections.labels(b64e(task_id), state).inc()

    def budget(self, privacy: PrivacyEngine, task: LeaderTask) -> None:
        privacy.report_budget(task, self.m)

    def prefix_job(
        self,
        task: LeaderTask,
        level: int,
        seconds: float,
        outcomes: Mapping[bytes, ReportRejection | None],
    ) -> None:
        m = self.m
        m.prefix_jobs.labels("finished").inc()
        m.prefix_job_seconds.observe(seconds)
        by_outcome: dict[str, int] = {}
        for reason in outcomes.values():
            label = "accepted" if reason is None else reason.value
            by_outcome[label] = by_outcome.get(label, 0) + 1
        for label, n in by_outcome.items():
            m.prefix_reports.labels(task.id_text, str(level), label).inc(n)

    def prefix_job_failed(self) -> None:
        self.m.prefix_jobs.labels("failed").inc()

    def prefix_level(
        self, task: LeaderTask, level: int, candidates: int, seconds: float, outcome: str
    ) -> None:
        m = self.m
        m.prefix_levels.labels(task.id_text, str(level), outcome).inc()
        m.prefix_level_seconds.observe(seconds)
        m.prefix_candidates.labels(task.id_text, str(level)).set(candidates)


def _reason(error: AggregatorError) -> str:
    """A metric label for a refusal: the error class in snake case."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()
