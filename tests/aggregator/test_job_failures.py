"""Aggregation jobs that fail settle on their own (issues 13 and 17): a job
that fails for a reason other than the helper being unreachable is retried
with backoff and given up after max_job_attempts, its reports rejected as
job_failed with the reason recorded; a job refused for a misconfiguration
(wrong token) waits for the operator and is never given up; neither holds
up the other jobs or the collection. Each backend."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import psycopg
import pytest

from tests.support.backends import Backend
from tests.support.in_process import TP, InProcessHelper, T, World
from veil.aggregator.core import AggregationAnswer, VerifyInitItem
from veil.aggregator.errors import Internal, Unauthenticated
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.store.records import is_transient_storage_error
from veil.task import DpSpec, Task, VdafSpec, new_task


class FailsFor(InProcessHelper):
    """Answers every job but the first one it sees, which fails with `error`."""

    def __init__(self, world: World, error: Exception) -> None:
        super().__init__(world.helper)
        self.error = error
        self.poisoned: bytes | None = None

    def aggregate(
        self, task: Task, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> AggregationAnswer:
        if self.poisoned is None:
            self.poisoned = job_id
        if job_id == self.poisoned:
            raise self.error
        return super().aggregate(task, job_id, items)


@pytest.fixture
def world(backend: Backend) -> World:
    files = new_task(
        VdafSpec("sum", max_measurement=10),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("none"),
    )
    return World(backend, files)


def _leader(world: World, link: InProcessHelper) -> Leader:
    old = world.leader
    return Leader(
        old.tasks,
        LeaderParts(old.store, link, old.privacy, clock=old.clock),
        LeaderSettings(job_size=4, max_job_attempts=3, retry_seconds=0.0),  # the next pass retries
    )


def test_a_failing_job_is_retried_then_given_up_and_says_why(world: World) -> None:
    link = FailsFor(world, Internal("internal error; see the server's log"))
    leader = _leader(world, link)
    task_id = world.files.client.task_id
    leader.upload(task_id, [world.report(1) for _ in range(12)])  # 3 jobs of 4
    for _ in range(5):
        leader.run_once()  # the pass goes on past the failing job every time
    assert link.poisoned is not None
    errors = leader.store.aggregation_job_errors(task_id)
    assert errors == {
        link.poisoned: ("failed", 3, "Internal: internal error; see the server's log")
    }
    assert leader.store.rejections(task_id) == {"job_failed": 4}
    aggs = leader.store.batch_aggregates(task_id, T, T + TP)
    assert sum(a.report_count for a in aggs) == 8
    # Nothing is left unaggregated: the batch can be collected.
    assert leader.store.unaggregated_count(task_id, T, T + TP) == 0
    token = world.files.collector.collector_token
    job = secrets.token_bytes(16)
    leader.create_collection(task_id, token, job, T, TP)
    while leader.run_once():
        pass
    assert leader.get_collection(task_id, token, job).report_count == 8


def test_a_misconfigured_deployment_never_gives_jobs_up(world: World) -> None:
    link = FailsFor(world, Unauthenticated("wrong aggregator token for task x"))
    leader = _leader(world, link)
    task_id = world.files.client.task_id
    leader.upload(task_id, [world.report(1) for _ in range(4)])
    for _ in range(6):
        leader.run_once()
    ((state, failures, why),) = leader.store.aggregation_job_errors(task_id).values()
    assert state == "open" and failures >= 3 and why.startswith("Unauthenticated: ")
    assert leader.store.rejections(task_id) == {}
    # The operator fixes the token: the job goes through.
    link.poisoned = b"none"
    while leader.run_once():
        pass
    aggs = leader.store.batch_aggregates(task_id, T, T + TP)
    assert sum(a.report_count for a in aggs) == 4


def test_database_failures_count_as_transient() -> None:
    # A PostgreSQL server that is not there (stopped, restarting).
    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect("host=127.0.0.1 port=1 connect_timeout=2")
    assert is_transient_storage_error(e.value)
    assert not is_transient_storage_error(ValueError("a bug"))
