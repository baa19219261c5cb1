"""veil.aggregator.leader.meter: the one seam between the leader and its
metrics. Without metrics nothing is counted; with them each event reaches
its Prometheus series."""

from __future__ import annotations

from veil.aggregator.errors import Overloaded, ReportRejection
from veil.aggregator.leader.meter import LeaderMeter, PrometheusMeter
from veil.metrics import Metrics
from veil.task import DpSpec, LeaderTask, VdafSpec, new_task


def _task() -> LeaderTask:
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none")
    )
    return files.leader


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return None if value is None else float(value)


def test_without_metrics_the_meter_counts_nothing() -> None:
    meter = LeaderMeter.of(None)
    assert type(meter) is LeaderMeter
    task = _task()
    # Every event is accepted and goes nowhere.
    meter.uploaded(task, 3, 1)
    meter.upload_refused(task, Overloaded("full"))
    meter.job_finished(task, 0.5, 4, 3, 0, {b"r": ReportRejection.VDAF_VERIFY_ERROR})
    meter.job_given_up(task.task_id, 2)
    meter.collection(task.task_id, "finished")
    meter.prefix_job(task, 7, 0.5, {b"r": None})
    meter.prefix_job_failed()
    meter.prefix_level(task, 7, 3, 1.5, "finished")


def test_each_event_reaches_its_series() -> None:
    metrics = Metrics("leader")
    meter = LeaderMeter.of(metrics)
    assert isinstance(meter, PrometheusMeter)
    task = _task()
    tid = task.id_text
    meter.uploaded(task, 3, 1)
    assert _value(metrics, "veil_reports_received_total", task=tid) == 3
    assert _value(metrics, "veil_reports_duplicate_total", task=tid) == 1
    meter.upload_refused(task, Overloaded("full"))
    assert _value(metrics, "veil_uploads_refused_total", task=tid, reason="overloaded") == 1
    meter.backlog({task.task_id: 7})
    assert _value(metrics, "veil_reports_unaggregated", task=tid) == 7
    rejected = {b"a": None, b"b": ReportRejection.VDAF_VERIFY_ERROR}
    meter.job_finished(task, 0.5, 4, 3, 1, rejected)
    assert _value(metrics, "veil_aggregation_jobs_total", outcome="finished") == 1
    assert _value(metrics, "veil_reports_accepted_total", task=tid) == 3
    assert _value(metrics, "veil_reports_deferred_total", task=tid) == 1
    verify_error = ReportRejection.VDAF_VERIFY_ERROR.value
    assert _value(metrics, "veil_reports_rejected_total", task=tid, reason=verify_error) == 1
    meter.job_given_up(task.task_id, 2)
    failed = ReportRejection.JOB_FAILED.value
    assert _value(metrics, "veil_reports_rejected_total", task=tid, reason=failed) == 2
    meter.collection(task.task_id, "failed")
    assert _value(metrics, "veil_collections_total", task=tid, outcome="failed") == 1


def test_each_poplar1_event_reaches_its_series() -> None:
    metrics = Metrics("leader")
    meter = LeaderMeter.of(metrics)
    task = _task()
    tid = task.id_text
    verify_error = ReportRejection.VDAF_VERIFY_ERROR
    meter.prefix_job(task, 15, 0.5, {b"a": None, b"b": None, b"c": verify_error})
    meter.prefix_job_failed()
    assert _value(metrics, "veil_prefix_jobs_total", outcome="finished") == 1
    assert _value(metrics, "veil_prefix_jobs_total", outcome="failed") == 1
    assert _value(metrics, "veil_prefix_job_seconds_sum") == 0.5
    accepted = {"task": tid, "level": "15", "outcome": "accepted"}
    assert _value(metrics, "veil_prefix_reports_total", **accepted) == 2
    rejected = {**accepted, "outcome": verify_error.value}
    assert _value(metrics, "veil_prefix_reports_total", **rejected) == 1
    meter.prefix_level(task, 15, 40, 2.0, "retrying")
    meter.prefix_level(task, 15, 40, 3.0, "finished")
    assert (
        _value(metrics, "veil_prefix_levels_total", task=tid, level="15", outcome="retrying") == 1
    )
    assert (
        _value(metrics, "veil_prefix_levels_total", task=tid, level="15", outcome="finished") == 1
    )
    assert _value(metrics, "veil_prefix_level_seconds_count") == 2
    assert _value(metrics, "veil_prefix_candidates", task=tid, level="15") == 40
