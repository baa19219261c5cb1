"""The leader's leader-selected batches (veil.aggregator.store.batches), on
SQLite and a real PostgreSQL: each job joins a batch in the transaction
that makes it, batches are filled to min_batch_size and no further, a
batch short of rejected reports takes the next job, a collected batch none,
and what is stored is what a restarted leader reads back."""

from __future__ import annotations

from tests.aggregator.store.test_storage import MERGE, TASK, report, share
from tests.support.backends import Backend
from veil.aggregator.store.batches import joinable_from
from veil.aggregator.store.records import (
    LEADER_SELECTED_BUCKETS,
    BatchAggregate,
    CollectionRecord,
    leader_selected_bucket,
)

A, B, C, D = (bytes([n]) * 32 for n in range(1, 5))


def _job(n: int) -> bytes:
    return n.to_bytes(16, "big")


def test_batches_are_formed_once_filled_to_the_floor_and_refilled(backend: Backend) -> None:
    store = backend.store("leader")
    store.put_reports(TASK, [(3600, report(i)) for i in range(7)])
    # Three jobs of at most 10 reports: batches of 3, 3 and the 1 left.
    assert [
        store.create_batch_job(TASK, _job(n), 10, 3, new, None) for n, new in enumerate((A, B, C))
    ] == [
        3,
        3,
        1,
    ]
    assert store.create_batch_job(TASK, _job(3), 10, 3, D, None) == 0  # nothing pending: no batch D
    # Stored with the jobs: a restarted leader (the store opened again)
    # sends each job with the same batch id.
    again = backend.store("leader")
    assert [again.job_batch(TASK, _job(n)) for n in range(3)] == [A, B, C]
    assert again.batch_of_bucket(TASK, leader_selected_bucket(B)) == B
    assert again.batch_of_bucket(TASK, LEADER_SELECTED_BUCKETS) is None
    # Ready: the oldest batch holding 3 reports that are not rejected.
    assert again.ready_batch(TASK, 3) == (A, leader_selected_bucket(A))
    assert again.batch_unfinished(TASK, A)
    # A's job rejects one report: A is short, and open again.
    ids = [r.report_id for r in again.job_reports(TASK, _job(0))]
    delta = BatchAggregate(leader_selected_bucket(A), share(1, 2), 2, b"c" * 32)
    again.finish_aggregation_job(
        TASK, _job(0), {ids[0]: None, ids[1]: None, ids[2]: "vdaf_verify_error"}, [delta], MERGE
    )
    assert not again.batch_unfinished(TASK, A)
    assert again.ready_batch(TASK, 3) == (B, leader_selected_bucket(B))
    # The next upload's job fills A (the oldest open batch), one report only.
    again.put_reports(TASK, [(3600, report(i)) for i in range(7, 9)])
    assert again.create_batch_job(TASK, _job(4), 10, 3, D, None) == 1
    assert again.job_batch(TASK, _job(4)) == A
    assert again.ready_batch(TASK, 3) == (A, leader_selected_bucket(A))
    # A collection claims A: the next batch ready is B; once A is collected
    # (its bucket closed) no job joins it, even short of a rejected report.
    bucket = leader_selected_bucket(A)
    again.put_collection(CollectionRecord(TASK, b"x" * 16, bucket, 1, "pending"))
    assert again.ready_batch(TASK, 3) == (B, leader_selected_bucket(B))
    again.close_batch(TASK, bucket, bucket + 1, b"x" * 16, 3600)
    (refill,) = [r.report_id for r in again.job_reports(TASK, _job(4))]
    again.finish_aggregation_job(TASK, _job(4), {refill: "vdaf_verify_error"}, [], MERGE)
    assert again.create_batch_job(TASK, _job(5), 10, 3, D, None) == 1
    assert again.job_batch(TASK, _job(5)) == C  # C, the open one, not A


def test_a_batch_retires_once_its_oldest_report_is_too_old(backend: Backend) -> None:
    """With `oldest` (batches.joinable_from), the oldest open batch takes a
    job only while its oldest report is no older than that: otherwise a new
    batch is made, and the retired one keeps what it holds."""
    assert joinable_from(10_000.5, None, 3600, 60) is None  # reports never expire
    assert joinable_from(10_000.5, 7200, 3600, 60) == 10_000 - 7200 + 3600
    assert joinable_from(10_000.5, 7200, 30, 60) == 10_000 - 7200 + 60
    store = backend.store("leader")
    store.put_reports(TASK, [(3600, report(0, 3600)), (7200, report(1, 7200))])
    assert store.create_batch_job(TASK, _job(0), 2, 3, A, 3600) == 2
    assert store.job_batch(TASK, _job(0)) == A
    store.put_reports(TASK, [(7200, report(n, 7200)) for n in (2, 3)])
    # A's oldest report (3600) is one second too old: A takes nothing.
    assert store.create_batch_job(TASK, _job(1), 1, 3, B, 3601) == 1
    assert store.job_batch(TASK, _job(1)) == B
    # Without the rule A, the oldest open batch, takes the next job.
    assert store.create_batch_job(TASK, _job(2), 1, 3, C, None) == 1
    assert store.job_batch(TASK, _job(2)) == A
    assert store.ready_batch(TASK, 3) == (A, leader_selected_bucket(A))


def test_a_batch_that_lost_a_report_by_age_stays_retired(backend: Backend) -> None:
    """A batch whose aggregated reports went by age (GC, horizon 5000) while
    a young one the leader rejected itself stays in it looks young by its
    reports, but its aggregate counts reports its jobs no longer hold: it
    takes no job, and the next report makes a new batch."""
    store = backend.store("leader")
    store.put_reports(TASK, [(3600, report(0, 3600)), (3600, report(1, 3600))])
    store.put_reports(TASK, [(10**6, report(2, 10**6))])
    assert store.create_batch_job(TASK, _job(0), 10, 4, A, 0) == 3
    ids = [r.report_id for r in store.job_reports(TASK, _job(0))]
    delta = BatchAggregate(leader_selected_bucket(A), share(1, 2), 2, b"c" * 32)
    outcomes = {ids[0]: None, ids[1]: None, ids[2]: "vdaf_verify_error"}
    store.finish_aggregation_job(TASK, _job(0), outcomes, [delta], MERGE)
    store.collect_garbage(TASK, 3600, 5000, None)
    assert store.batch_of_bucket(TASK, leader_selected_bucket(A)) == A  # kept: one is young
    store.put_reports(TASK, [(10**6, report(3, 10**6))])
    assert store.create_batch_job(TASK, _job(1), 10, 4, B, 5000) == 1
    assert store.job_batch(TASK, _job(1)) == B
