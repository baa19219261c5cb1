"""Leader and helper logic in one process (no gRPC): each rule on its own,
on each storage backend (SQLite, and a real PostgreSQL)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, TP, InProcessHelper, T, World, verify_init_items
from veil.aggregator.context import TaskLimitError
from veil.aggregator.core import (
    AggregationAnswer,
    VerifyInitItem,
    batch_summary,
)
from veil.aggregator.errors import (
    BatchCollected,
    BatchMismatch,
    BatchTooLarge,
    BatchTooSmall,
    BudgetExhausted,
    InvalidMessage,
    JobConflict,
    NoiseFailed,
    NoiseUnavailable,
    ReportTimeRejected,
    Unauthenticated,
    Unavailable,
    UnknownTask,
    WindowMismatch,
    WindowOpen,
    WrongLength,
)
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import JobReport
from veil.client import prepare_report
from veil.hpke import Ciphertext, HpkeConfig
from veil.task import DpSpec, Task, TaskFiles, VdafSpec, new_task

T_ = TypeVar("T_")


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


def test_upload_is_all_or_nothing(world: World) -> None:
    task_id = world.files.client.task_id
    good = world.report(3)
    cases = [
        (replace(world.report(1), report_id=b"short"), InvalidMessage, "16 bytes"),
        (replace(world.report(1), time=T + 1), InvalidMessage, "time_precision"),
        (world.report(1, t=NOW + 2 * TP), ReportTimeRejected, "future"),
        (
            replace(
                world.report(1),
                leader_ct=replace(good.leader_ct, config_id=(good.leader_ct.config_id + 1) % 256),
            ),
            InvalidMessage,
            "HPKE config",
        ),
    ]
    for bad, error, words in cases:
        with pytest.raises(error, match=words):
            world.leader.upload(task_id, [good, bad])
    assert world.leader_store.unaggregated_count(task_id, 0, 2**62) == 0
    with pytest.raises(UnknownTask):
        world.leader.upload(bytes(32), [good])
    assert world.leader.upload(task_id, [good]) == (1, 0)
    assert world.leader.upload(task_id, [good]) == (0, 1)


def test_an_upload_at_fault_names_its_first_report_at_fault(world: World) -> None:
    # Checked by columns first, then report by report to say which: the
    # error is the first bad report's, whatever the later ones hold.
    task_id = world.files.client.task_id
    good = [world.report(v) for v in range(3)]
    short = replace(world.report(1), report_id=b"short")
    late = world.report(1, t=NOW + 2 * TP)
    other_key = replace(
        world.report(1),
        leader_ct=replace(good[0].leader_ct, config_id=(good[0].leader_ct.config_id + 1) % 256),
    )
    padded = replace(world.report(1), public_share=good[0].public_share + b"\0")
    tokened = replace(world.report(1), token=b"t")
    cases = [
        ([*good, late, short], ReportTimeRejected, "report 3 .*future"),
        ([*good, short, late], InvalidMessage, "report 3: report_id must be 16 bytes"),
        ([*good, other_key, padded], InvalidMessage, "report 3 .*HPKE config id"),
        ([*good, padded, other_key], WrongLength, "report 3 .*public_share"),
        ([*good, tokened], InvalidMessage, "report 3 .*takes no token"),
        ([*good, good[1]], InvalidMessage, "report 3 .*appears twice"),
        (
            [good[0], replace(good[1], time=T + 1), late],
            InvalidMessage,
            "report 1 .*time_precision",
        ),
    ]
    for reports, error, words in cases:
        with pytest.raises(error, match=words):
            world.leader.upload(task_id, reports)
    assert world.leader_store.unaggregated_count(task_id, 0, 2**62) == 0
    assert world.leader.upload(task_id, good) == (3, 0)
    assert world.leader.upload(task_id, [*good, world.report(4)]) == (1, 3)


def test_aggregation_and_collection_in_process(world: World) -> None:
    task_id = world.files.client.task_id
    world.leader.upload(task_id, [world.report(v) for v in range(10)])
    while world.leader.run_once():
        pass
    assert world.link.calls == 3  # 10 reports in jobs of 4
    record = world.collect()
    assert (record.state, record.report_count) == ("finished", 10)
    job = record.job_id
    with pytest.raises(Unauthenticated):
        world.leader.get_collection(task_id, "wrong", job)
    with pytest.raises(Unauthenticated):
        world.leader.get_collection(task_id, None, job)


class SlowFirstCall(InProcessHelper):
    """Holds its first call until the leader has read the reports of a second job."""

    def __init__(self, helper: Helper, second_read: threading.Event) -> None:
        super().__init__(helper)
        self.second_read = second_read

    def aggregate(
        self, task: Task, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> AggregationAnswer:
        if self.calls == 0:
            assert self.second_read.wait(timeout=30), "the driver waited for the helper"
        return super().aggregate(task, job_id, items)


class UnreachableOnce(InProcessHelper):
    """Cannot be reached for its second call."""

    def aggregate(
        self, task: Task, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> AggregationAnswer:
        if self.calls == 1:
            self.calls += 1
            raise Unavailable("helper away")
        return super().aggregate(task, job_id, items)


def test_driver_prepares_the_next_job_while_the_helper_verifies(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = world.files.client.task_id
    world.leader.upload(task_id, [world.report(v % 2) for v in range(12)])  # 3 jobs of 4
    second_read = threading.Event()
    reads = 0
    job_reports = world.leader_store.job_reports

    def counted(task_id: bytes, job_id: bytes) -> list[JobReport]:
        nonlocal reads
        reads += 1
        if reads == 2:
            second_read.set()
        return job_reports(task_id, job_id)

    monkeypatch.setattr(world.leader_store, "job_reports", counted)
    world.leader.peer.api = link = SlowFirstCall(world.helper, second_read)
    while world.leader.run_once():
        pass
    assert link.calls == 3
    assert world.leader_store.unaggregated_count(task_id, 0, 2**62) == 0


def test_a_lease_just_taken_is_not_renewed_before_the_helper(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    task_id = world.files.client.task_id
    store, jobs = world.leader_store, world.leader.jobs
    renewed: list[bytes] = []
    renew = store.renew_aggregation_job

    def counted(task_id: bytes, job_id: bytes, owner: str, lease_seconds: float) -> bool:
        renewed.append(job_id)
        return renew(task_id, job_id, owner, lease_seconds)

    monkeypatch.setattr(store, "renew_aggregation_job", counted)
    world.leader.upload(task_id, [world.report(v % 2) for v in range(12)])  # 3 jobs of 4
    while world.leader.run_once():
        pass
    # Each job went to the helper within moments of its lease: none renewed.
    assert renewed == []
    assert store.unaggregated_count(task_id, 0, 2**62) == 0
    # A lease taken a tenth of it ago or more is renewed before the round
    # trip (and so is one whose taking the caller does not say).
    world.leader.upload(task_id, [world.report(1) for _ in range(8)])
    lease = jobs.settings.lease_seconds
    for job_id in (b"a" * 16, b"b" * 16):
        assert store.create_aggregation_job(task_id, job_id, 4) == 4
    assert len(store.acquire_aggregation_jobs(jobs.worker_id, lease, 2)) == 2
    jobs.prepare_job(task_id, b"a" * 16, time.monotonic() - 0.1 * lease)
    jobs.prepare_job(task_id, b"b" * 16)
    assert renewed == [b"a" * 16, b"b" * 16]


def test_helper_unreachable_mid_pipeline(world: World) -> None:
    task_id = world.files.client.task_id
    world.leader.upload(task_id, [world.report(v % 3) for v in range(12)])  # 3 jobs of 4
    world.leader.peer.api = UnreachableOnce(world.helper)
    assert world.leader.run_once()  # the first job finished
    assert world.leader.control.helper_unreachable
    assert world.leader_store.unaggregated_count(task_id, 0, 2**62) == 8
    # The two unfinished jobs are still this driver's: its next passes finish them.
    while world.leader.run_once():
        pass
    assert not world.leader.control.helper_unreachable
    record = world.collect()
    assert (record.state, record.report_count) == ("finished", 12)


def test_a_collection_waiting_on_unaggregated_reports_says_the_helper_is_away(
    world: World,
) -> None:
    # The helper went away before the batch's reports were aggregated: the
    # pass ends at the aggregation jobs, before the collections, and the job
    # said nothing ("waiting for the aggregators") for as long as it was away.
    task_id = world.files.client.task_id
    token = world.files.collector.collector_token
    world.leader.upload(task_id, [world.report(v % 3) for v in range(6)])
    helper = world.leader.peer.api
    world.leader.peer.api = AwayFor(world.helper, {task_id}, Unavailable("helper away"))
    job = secrets.token_bytes(16)
    world.leader.create_collection(task_id, token, job, T, TP)
    for _ in range(2):  # said once, and not written again while it holds
        world.leader.run_once()  # the first pass makes the aggregation job
        assert world.leader.control.helper_unreachable
        record = world.leader.get_collection(task_id, token, job)
        assert record.state == "pending"
        assert record.error_message == "retrying: helper away", record.error_message
    assert world.leader_store.note_collections([task_id], 14, record.error_message) == 0
    # A pass that finds no helper away while the reports still wait (their
    # jobs held by another driver, say) takes the reason back.
    world.leader.control.begin_pass()
    world.leader.collections.run_pass(world.leader.worker_id, 30.0)
    assert world.leader.get_collection(task_id, token, job).error_message == ""
    # Nothing else of the job changed: back, the helper gets it at once.
    world.leader.peer.api = helper
    while world.leader.run_once():
        pass
    record = world.leader.get_collection(task_id, token, job)
    assert (record.state, record.report_count) == ("finished", 6)


class AwayFor(InProcessHelper):
    """Raises `error` for the tasks of `tasks`; the others' calls reach the helper."""

    def __init__(self, helper: Helper, tasks: set[bytes], error: Unavailable) -> None:
        super().__init__(helper)
        self.tasks = tasks
        self.error = error

    def aggregate(
        self,
        task: Task,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
    ) -> AggregationAnswer:
        if task.task_id in self.tasks:
            raise self.error
        return super().aggregate(task, job_id, items, prefix_round)


@pytest.mark.parametrize(
    ("other_helper", "error", "said"),
    [
        # This helper, away: said as on the other task's collections.
        (
            "127.0.0.1:2",
            Unavailable("helper away"),
            "retrying: helper away",
        ),
        # Another helper of the leader's, away: not this task's.
        ("127.0.0.1:3", Unavailable("the other helper is away"), ""),
    ],
)
def test_a_pass_ended_at_another_tasks_job_is_said_where_that_tasks_helper_is_this_ones(
    world: World, other_helper: str, error: Unavailable, said: str
) -> None:
    # A leader's tasks need not share a helper, nor their collectors: a pass
    # that ends at another helper's call is no reason this task's collection
    # can tell, and that call's text is not its collector's to read.
    task_id = world.files.client.task_id
    token = world.files.collector.collector_token
    assert world.files.leader.helper_address == "127.0.0.1:2"
    world.leader.upload(task_id, [world.report(v % 3) for v in range(6)])
    while world.leader.run_once():  # aggregated
        pass
    other = new_task(
        VdafSpec("count"), "127.0.0.1:1", other_helper, min_batch_size=2, dp=DpSpec("none")
    )
    world.leader.add_tasks({other.leader.task_id: other.leader})
    leader_config, helper_config = world.leader.current_config, world.helper.current_config
    reports = [prepare_report(other.client, 1, leader_config, helper_config, T) for _ in "ab"]
    world.leader.upload(other.leader.task_id, reports)
    world.leader.peer.api = AwayFor(world.helper, {other.leader.task_id}, error)
    job = secrets.token_bytes(16)
    world.leader.create_collection(task_id, token, job, T, TP)
    world.leader.run_once()  # ends at the other task's job, before the collections
    assert world.leader.control.helper_unreachable
    record = world.leader.get_collection(task_id, token, job)
    assert (record.state, record.error_message) == ("pending", said), record.error_message


def test_one_tasks_window_mismatch_holds_up_that_task_alone(world: World) -> None:
    # A helper that answers one task that its task files give it another
    # window (one organisation closed or extended the survey, the other not
    # yet) held up every task of the leader: the pass ended at that task's
    # job as though the helper were away, and began with it again.
    task_id = world.files.client.task_id
    token = world.files.collector.collector_token
    world.leader.upload(task_id, [world.report(v % 3) for v in range(6)])
    other = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2, dp=DpSpec("none")
    )
    world.leader.add_tasks({other.leader.task_id: other.leader})
    leader_config, helper_config = world.leader.current_config, world.helper.current_config
    reports = [prepare_report(other.client, 1, leader_config, helper_config, T) for _ in "ab"]
    world.leader.upload(other.leader.task_id, reports)
    refusal = WindowMismatch("task o: the leader's and the helper's windows differ")
    world.leader.peer.api = AwayFor(world.helper, {other.leader.task_id}, refusal)
    job = secrets.token_bytes(16)
    world.leader.create_collection(task_id, token, job, T, TP)
    while world.leader.run_once():
        assert not world.leader.control.helper_unreachable
    record = world.leader.get_collection(task_id, token, job)
    assert (record.state, record.report_count) == ("finished", 6), record.error_message
    # The other task's job waits for the files to agree, never given up.
    assert world.leader_store.unaggregated_count(other.leader.task_id, 0, 2**62) == 2
    assert world.leader_store.rejections(other.leader.task_id) == {}


def test_helper_refuses_times_outside_64_bits(world: World) -> None:
    # Found by the RPC fuzzer: a uint64 time above 2**63 - 1 reached SQLite.
    task = world.files.leader
    good, bad = verify_init_items(world, 2)
    bad = bad._replace(time=2**64 - 1)
    results = world.helper.aggregate(
        task.task_id, task.aggregator_token, secrets.token_bytes(16), [good, bad]
    )
    assert results[0].reject is None and results[1].reject == "invalid_message"
    # The malformed report's id was not consumed: sent again well formed, it counts.
    again = world.helper.aggregate(
        task.task_id,
        task.aggregator_token,
        secrets.token_bytes(16),
        [verify_init_items(world, 1)[0]],
    )
    assert again[0].reject is None


def test_helper_job_idempotent_and_replay_refused(world: World) -> None:
    task = world.files.leader
    items = verify_init_items(world, 3)
    job = secrets.token_bytes(16)
    first = world.helper.aggregate(task.task_id, task.aggregator_token, job, items)
    assert all(r.verifier_message is not None and r.reject is None for r in first)
    # A retry of the same job gets the same answer and counts nothing twice.
    assert world.helper.aggregate(task.task_id, task.aggregator_token, job, items) == first
    with pytest.raises(JobConflict):
        world.helper.aggregate(task.task_id, task.aggregator_token, job, items[:2])
    # The same reports under a new job id are replays.
    again = world.helper.aggregate(
        task.task_id, task.aggregator_token, secrets.token_bytes(16), items
    )
    assert [r.reject for r in again] == ["report_replayed"] * 3
    aggs = world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    assert sum(a.report_count for a in aggs) == 3
    with pytest.raises(Unauthenticated):
        world.helper.aggregate(task.task_id, "not-it", secrets.token_bytes(16), items)


def test_helper_replays_refused_whatever_else_they_fail(world: World) -> None:
    # A report replayed in a new job is refused as replayed, also when it is
    # too early by the helper's clock (a check that records nothing), and
    # nothing is counted twice; an id answered too early and then recorded
    # in the same job is not a replay of itself.
    task = world.files.leader
    items = verify_init_items(world, 4)

    def run(job: list[VerifyInitItem]) -> list[str | None]:
        answers = world.helper.aggregate(
            task.task_id, task.aggregator_token, secrets.token_bytes(16), job
        )
        return [r.reject for r in answers]

    assert run(items[:2]) == [None, None]
    early = items[1]._replace(time=items[1].time + 10**9)
    assert run([items[0], early, items[2]]) == ["report_replayed", "report_replayed", None]
    late = items[3]._replace(time=items[3].time + 10**9)
    assert run([late, items[3]]) == ["report_too_early", None]
    assert run([late]) == ["report_replayed"]
    aggs = world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    assert sum(a.report_count for a in aggs) == 4


def _race(calls: Sequence[Callable[[], T_]]) -> list[T_ | BaseException]:
    """Run the calls at once, each on its own thread; their results or errors."""
    start = threading.Barrier(len(calls))
    out: list[T_ | BaseException] = [RuntimeError("not run")] * len(calls)

    def run(k: int) -> None:
        start.wait()
        try:
            out[k] = calls[k]()
        except BaseException as e:
            out[k] = e

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_helper_processes_racing_on_one_store(backend: Backend, world: World) -> None:
    # Three helpers, as three processes would be: each its own store handle
    # and no lock in common. Correctness comes from the store alone.
    task = world.files.leader
    helpers = [world.helper] + [
        Helper(
            {task.task_id: world.files.helper},
            backend.store("helper"),
            PrivacyEngine(backend.ledger("helper"), [world.files.helper], allow_exact_release=True),
            clock=lambda: NOW,
        )
        for _ in range(2)
    ]
    items = verify_init_items(world, 12)
    token = task.aggregator_token
    # One job id sent to all three at once: one outcome, the same answer for each.
    job = secrets.token_bytes(16)
    answers = _race([lambda h=h: h.aggregate(task.task_id, token, job, items[:6]) for h in helpers])
    assert all(a == answers[0] for a in answers), answers
    assert isinstance(answers[0], list) and all(r.reject is None for r in answers[0])
    # The same reports in three different jobs at once: each aggregated once.
    answers = _race(
        [
            lambda h=h: h.aggregate(task.task_id, token, secrets.token_bytes(16), items[6:])
            for h in helpers
        ]
    )
    for k in range(6):
        outcomes = [a[k].reject for a in answers if isinstance(a, list)]
        assert len(outcomes) == 3, answers
        assert sorted(outcomes, key=str) == [None, "report_replayed", "report_replayed"]
    aggs = world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    count = sum(a.report_count for a in aggs)
    assert count == 12
    checksum = bytes(32)
    for a in aggs:
        checksum = bytes(x ^ y for x, y in zip(checksum, a.checksum, strict=True))
    # One collection asked of all three at once: one share, stored once.
    collection = secrets.token_bytes(16)
    shares = _race(
        [
            lambda h=h: h.aggregate_share(task.task_id, token, collection, T, TP, count, checksum)
            for h in helpers
        ]
    )
    assert all(s == shares[0] for s in shares) and isinstance(shares[0], Ciphertext), shares
    stored = world.helper_store.get_collection(task.task_id, collection)
    assert stored is not None and stored.helper_ct == shares[0]


def test_helper_checks_count_and_checksum(world: World) -> None:
    task = world.files.leader
    world.helper.aggregate(
        task.task_id, task.aggregator_token, secrets.token_bytes(16), verify_init_items(world, 3)
    )
    with pytest.raises(BatchMismatch):
        world.helper.aggregate_share(
            task.task_id, task.aggregator_token, secrets.token_bytes(16), T, TP, 4, bytes(32)
        )
    with pytest.raises(BatchMismatch):
        world.helper.aggregate_share(
            task.task_id, task.aggregator_token, secrets.token_bytes(16), T, TP, 3, bytes(32)
        )


def test_helper_serves_the_same_noised_share(backend: Backend) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("geometric", epsilon="1"),
    )
    world = World(backend, files)
    task = files.leader
    items = verify_init_items(world, 4)
    world.helper.aggregate(task.task_id, task.aggregator_token, secrets.token_bytes(16), items)
    from veil.aggregator.core import batch_summary

    _, count, checksum = batch_summary(
        world.vdaf, world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    )
    job = secrets.token_bytes(16)
    first = world.helper.aggregate_share(
        task.task_id, task.aggregator_token, job, T, TP, count, checksum
    )
    assert (
        world.helper.aggregate_share(
            task.task_id, task.aggregator_token, job, T, TP, count, checksum
        )
        == first
    )
    # Another collection job for the same batch is refused.
    with pytest.raises(BatchCollected):
        world.helper.aggregate_share(
            task.task_id, task.aggregator_token, secrets.token_bytes(16), T, TP, count, checksum
        )


def test_budget_refused_before_anything_is_written(backend: Backend) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("geometric", epsilon="1", budget="1/2"),
    )
    world = World(backend, files)
    task_id = files.client.task_id
    world.leader.upload(task_id, [world.report(1)])
    with pytest.raises(BudgetExhausted):
        world.leader.create_collection(
            task_id, files.collector.collector_token, secrets.token_bytes(16), T, TP
        )
    assert world.leader_store.collections(task_id) == []


def test_hpke_config_is_stable_across_restarts(backend: Backend, world: World) -> None:
    config: HpkeConfig = world.helper.current_config
    again = Helper(
        {world.files.helper.task_id: world.files.helper},
        backend.store("helper"),
        PrivacyEngine(backend.ledger("helper"), []),
    )
    assert again.current_config == config


def test_failed_collection_reopens_the_batch(world: World) -> None:
    task_id = world.files.client.task_id
    good = world.report(4)
    bad = world.report(5)
    bad = replace(bad, leader_ct=replace(bad.leader_ct, payload=bytes(len(bad.leader_ct.payload))))
    world.leader.upload(task_id, [good, bad])
    failed = world.collect()  # 2 reports stored
    assert failed.state == "failed" and "min_batch_size" in failed.error_message
    # Nothing left the batch: it is open for more reports and a new collection.
    world.leader.upload(task_id, [world.report(6)])
    done = world.collect()
    assert (done.state, done.report_count) == ("finished", 2)
    assert world.leader_store.rejections(task_id) == {"hpke_decrypt_error": 1}


def test_reports_outside_the_task_window(backend: Backend) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
        not_before=T,
        not_after=T + TP,
    )
    world = World(backend, files)
    with pytest.raises(ReportTimeRejected, match="window"):
        world.leader.upload(files.client.task_id, [world.report(1, t=T - TP)])
    with pytest.raises(ReportTimeRejected, match="window"):
        world.leader.upload(files.client.task_id, [world.report(1, t=T + TP)])
    assert world.leader.upload(files.client.task_id, [world.report(1, t=T)]) == (1, 0)


def test_no_batch_closes_before_the_window_does(backend: Backend) -> None:
    # The window [T, T + 2 TP) is still open at NOW: neither aggregator closes
    # a batch of it, so no respondent can be locked out by a collection.
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
        not_before=T,
        not_after=T + 2 * TP,
    )
    world = World(backend, files)
    task_id = files.client.task_id
    world.leader.upload(task_id, [world.report(1), world.report(0)])
    job = secrets.token_bytes(16)
    with pytest.raises(WindowOpen, match=r"accepts reports until .*Z.* in "):
        world.leader.create_collection(task_id, files.collector.collector_token, job, T, TP)
    assert world.leader_store.get_collection(task_id, job) is None
    with pytest.raises(WindowOpen, match="accepts reports until"):
        world.link.aggregate_share(files.leader, job, T, TP, 0, bytes(32))
    assert world.helper_store.get_collection(task_id, job) is None
    # The same window, closed: the batch is collected as usual.
    closed = World(backend, replace_window(files, T + TP))
    closed.leader.upload(task_id, [closed.report(1), closed.report(1)])
    assert closed.collect().state == "finished"


def replace_window(files: TaskFiles, not_after: int) -> TaskFiles:
    return TaskFiles(
        *(
            replace(t, not_after=not_after)
            for t in (files.leader, files.helper, files.collector, files.client)
        )
    )


def test_noise_is_drawn_ahead_of_the_request() -> None:
    """Issue 13: a request never waits for a draw (two vectors ready per task,
    NoiseUnavailable when none is), and a failing draw is surfaced, not fatal."""
    from veil.aggregator.privacy import NoisePool
    from veil.dp import NoisePlan, draw_noise

    gate = threading.Event()
    drawn = 0

    def draw(plan: NoisePlan, length: int) -> list[int]:
        nonlocal drawn
        if plan.config.epsilon == 2:
            raise OverflowError("int too large")
        drawn += 1
        if drawn > 2:
            gate.wait()
        return draw_noise(plan, length)

    spec = VdafSpec("histogram", length=50, chunk_length=7)
    good, bad = b"g" * 32, b"b" * 32
    pool = NoisePool(draw=draw)
    pool.add(good, DpSpec("geometric", epsilon="1").plan(spec), 50)
    pool.add(bad, DpSpec("geometric", epsilon="2").plan(spec), 50)
    assert pool.wait_ready(30)
    draws = [pool.take(good) for _ in range(2)]
    # The third draw is held back: the request is refused at once, not kept waiting.
    with pytest.raises(NoiseUnavailable, match="retry shortly") as e:
        pool.take(good)
    assert e.value.retryable
    with pytest.raises(NoiseFailed, match="OverflowError: int too large"):
        pool.take(bad)
    gate.set()
    assert pool.wait_ready(30)  # the thread survived the failed draw
    draws.append(pool.take(good))
    assert all(len(d) == 50 for d in draws)
    assert draws[0] != draws[1] != draws[2]  # fresh noise for every release


def test_noise_beyond_64_bits() -> None:
    """Issue 13: Sum(max 2**62) at ε = 0.1 draws noise beyond int64; it used to
    raise OverflowError in the sampler's int64 array and kill the noise thread."""
    from veil.dp import draw_noise

    plan = DpSpec("geometric", epsilon="0.1").plan(VdafSpec("sum", max_measurement=2**62))
    noise = draw_noise(plan, 64)
    assert all(isinstance(z, int) for z in noise)
    assert max(abs(z) for z in noise) > 2**63  # scale 4.6e19: most draws exceed int64


def test_helper_rejects_malformed_shares_without_counting(world: World) -> None:
    task = world.files.leader
    items = verify_init_items(world, 5)
    broken = [
        items[0]._replace(public_share=items[0].public_share + b"\x00"),  # trailing byte
        items[1]._replace(leader_verifier_share=items[1].leader_verifier_share[:-1]),  # truncated
        items[2]._replace(leader_verifier_share=items[2].leader_verifier_share + b"\x00"),
        items[3]._replace(
            encrypted_input_share=replace(items[3].encrypted_input_share, payload=b"\x00" * 20),
        ),
        items[4]._replace(time=items[4].time + TP),  # metadata no longer matches the seal
    ]
    results = world.helper.aggregate(
        task.task_id, task.aggregator_token, secrets.token_bytes(16), broken
    )
    assert [r.reject for r in results] == [
        "hpke_decrypt_error",  # the public share is bound into the HPKE context
        "vdaf_decode_error",
        "vdaf_decode_error",
        "hpke_decrypt_error",
        "hpke_decrypt_error",
    ]
    assert world.helper_store.batch_aggregates(task.task_id, 0, 2**62) == []


class RecordingHelper(InProcessHelper):
    """Records the size of each aggregation job request as gRPC would send it."""

    def __init__(self, helper: Helper) -> None:
        super().__init__(helper)
        self.request_bytes: list[tuple[int, int]] = []

    def aggregate(
        self, task: Task, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> AggregationAnswer:
        request = aggregation_job_request(task.task_id, job_id, items)
        self.request_bytes.append((len(items), request.ByteSize()))
        return super().aggregate(task, job_id, items)


def test_aggregation_jobs_capped_by_bytes(backend: Backend, world: World) -> None:
    """Issue 13: a job is at most max_job_bytes as sent, whatever job_size says."""
    task_id = world.files.client.task_id
    item = world.leader.context(task_id).sizes.job_item_bytes()
    link = RecordingHelper(world.helper)
    leader = Leader(
        {task_id: world.files.leader},
        LeaderParts(
            world.leader_store,
            link,
            PrivacyEngine(backend.ledger("leader"), [world.files.leader], allow_exact_release=True),
            clock=lambda: NOW,
        ),
        LeaderSettings(job_size=500, max_job_bytes=3 * item + 1),
    )
    assert leader.job_sizes[task_id] == 3
    leader.upload(task_id, [world.report(v % 2) for v in range(7)])
    while leader.run_once():
        pass
    assert sorted(n for n, _ in link.request_bytes) == [1, 3, 3]
    for n, size in link.request_bytes:
        assert size <= 3 * item + 1, (n, size)
        assert size <= n * item + 64  # job_item_bytes bounds each report's share of the request


def test_upload_refuses_parts_of_the_wrong_length(world: World) -> None:
    """Issue 13: every part has the exact size the VDAF and HPKE suite fix;
    anything else is refused naming the part and the size, and nothing stored."""
    task_id = world.files.client.task_id
    sizes = world.leader.context(task_id).sizes
    good = world.report(1)
    pad = b"\x00" * 8
    cases = {
        "public_share": replace(good, public_share=good.public_share + pad),
        "leader_encrypted_input_share.payload": replace(
            good, leader_ct=replace(good.leader_ct, payload=good.leader_ct.payload[:-1])
        ),
        "helper_encrypted_input_share.payload": replace(
            good, helper_ct=replace(good.helper_ct, payload=good.helper_ct.payload + pad)
        ),
        "helper_encrypted_input_share.enc": replace(
            good, helper_ct=replace(good.helper_ct, enc=good.helper_ct.enc + pad)
        ),
        "leader_encrypted_input_share.enc": replace(
            good, leader_ct=replace(good.leader_ct, enc=b"")
        ),
    }
    want = {
        "public_share": sizes.public_share,
        "leader_encrypted_input_share.payload": sizes.leader_payload,
        "helper_encrypted_input_share.payload": sizes.helper_payload,
        "helper_encrypted_input_share.enc": 32,
        "leader_encrypted_input_share.enc": 32,
    }
    for field, report in cases.items():
        with pytest.raises(WrongLength, match=rf"{field} is \d+ bytes; this task's is exactly"
                           rf" {want[field]} bytes"):  # fmt: skip
            world.leader.upload(task_id, [world.report(2), report])
    assert world.leader_store.unaggregated_count(task_id, 0, 2**62) == 0
    assert world.leader.upload(task_id, [good]) == (1, 0)


def test_batches_that_would_wrap_around_the_field_are_refused(backend: Backend) -> None:
    """Issue 13: Sum(max 2**61) in Field64 sums at most 3 reports without wrapping
    around; a batch of 4 is refused by the leader and by the helper on its own
    (it decoded to a negative number before), and nothing is spent."""
    files = new_task(
        VdafSpec("sum", max_measurement=2**61),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
    )
    world = World(backend, files)
    task_id = files.leader.task_id
    assert world.leader.context(task_id).bounds.max_batch_size == 3
    world.leader.upload(task_id, [world.report(2**61) for _ in range(4)])
    token = files.collector.collector_token
    with pytest.raises(BatchTooLarge, match="at most 3"):
        world.leader.create_collection(task_id, token, secrets.token_bytes(16), T, TP)
    # The helper, asked directly with the leader's own count and checksum.
    while world.leader.run_once():
        pass
    from veil.aggregator.core import batch_summary

    _, count, checksum = batch_summary(
        world.vdaf, world.helper_store.batch_aggregates(task_id, T, T + TP)
    )
    assert count == 4
    with pytest.raises(BatchTooLarge, match="at most 3"):
        world.helper.aggregate_share(
            task_id, files.leader.aggregator_token, secrets.token_bytes(16), T, TP, 4, checksum
        )


def test_a_task_that_cannot_hold_min_batch_size_is_refused_at_start(backend: Backend) -> None:
    """Issue 13: Sum(max 2**62) at ε = 0.1 was accepted; its noise alone exceeds
    the field. Now neither aggregator starts with it, and nothing is spent."""
    files = new_task(
        VdafSpec("sum", max_measurement=2**62),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("geometric", epsilon="1/10"),
    )
    with pytest.raises(TaskLimitError, match="would wrap around the field"):
        Helper(
            {files.helper.task_id: files.helper},
            backend.store("helper"),
            PrivacyEngine(backend.ledger("helper"), [files.helper]),
            clock=lambda: NOW,
        )


def test_batch_too_small_does_not_tell_the_count(world: World) -> None:
    """Issue 13: the refusal said the exact count, free and repeatable (arrival timing)."""
    task_id = world.files.client.task_id
    world.leader.upload(task_id, [world.report(1)])
    token = world.files.collector.collector_token
    with pytest.raises(BatchTooSmall) as e:
        world.leader.create_collection(task_id, token, secrets.token_bytes(16), T, TP)
    assert "fewer than min_batch_size (2)" in str(e.value)
    assert "1 report" not in str(e.value)
    while world.leader.run_once():
        pass
    task = world.files.leader
    _, count, checksum = batch_summary(
        world.vdaf, world.helper_store.batch_aggregates(task_id, T, T + TP)
    )
    with pytest.raises(BatchTooSmall) as e:
        world.helper.aggregate_share(
            task_id, task.aggregator_token, secrets.token_bytes(16), T, TP, count, checksum
        )
    assert str(e.value) == "the batch holds fewer than min_batch_size (2) reports"
    # Nor does a count mismatch, checked before the floor (its message reaches
    # the collector through the leader).
    with pytest.raises(BatchMismatch) as mismatch:
        world.helper.aggregate_share(
            task_id, task.aggregator_token, secrets.token_bytes(16), T, TP, 7, checksum
        )
    assert not any(ch.isdigit() for ch in str(mismatch.value)), str(mismatch.value)


def test_a_report_in_a_second_helper_job_is_replayed_then_batch_collected(world: World) -> None:
    """What held up in issue 13's review: the helper rejects a report the
    leader sends again in a new job as report_replayed, and once its batch is
    collected and GC has dropped the replay records, as batch_collected."""
    from veil.aggregator.maintenance import collect_garbage

    task = world.files.leader
    items = verify_init_items(world, 3)
    first = world.helper.aggregate(task.task_id, task.aggregator_token, b"1" * 16, items)
    assert all(r.verifier_message is not None for r in first)
    again = world.helper.aggregate(task.task_id, task.aggregator_token, b"2" * 16, items)
    assert [r.reject for r in again] == ["report_replayed"] * 3
    _, count, checksum = batch_summary(
        world.vdaf, world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    )
    world.helper.aggregate_share(
        task.task_id, task.aggregator_token, b"c" * 16, T, TP, count, checksum
    )
    collect_garbage(world.helper_store, [world.files.helper], NOW)
    assert world.helper_store.seen_reports(task.task_id, [i.report_id for i in items]) == set()
    late = world.helper.aggregate(task.task_id, task.aggregator_token, b"3" * 16, items)
    assert [r.reject for r in late] == ["batch_collected"] * 3
    _, after, _ = batch_summary(
        world.vdaf, world.helper_store.batch_aggregates(task.task_id, T, T + TP)
    )
    assert after == count == 3


def test_add_remove_tells_no_count_and_tests_the_floor_once(backend: Backend) -> None:
    """Issue 25: under add_remove GetTaskInfo withholds the counts, and a batch
    below min_batch_size is refused once, after it is closed, never while it
    is open (polling the refusal would tell when the floor-th report arrived)."""
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("geometric", epsilon="1", neighbouring="add_remove"),
    )
    world = World(backend, files)
    task_id = files.client.task_id
    token = files.collector.collector_token
    before = world.leader.task_info(task_id, token)
    world.leader.upload(task_id, [world.report(1)])
    while world.leader.run_once():
        pass
    after = world.leader.task_info(task_id, token)
    assert before == after
    assert (after.reports, after.rejected, after.counts_withheld) == (0, 0, True)
    failed = world.collect()  # accepted, then refused after aggregation
    assert failed.state == "failed"
    assert "min_batch_size (2)" in failed.error_message and "told only once" in failed.error_message
    assert "1 report" not in failed.error_message
    # The batch stays closed: no second try once more reports arrive.
    with pytest.raises(BatchCollected):
        world.leader.upload(task_id, [world.report(1)])
    with pytest.raises(BatchCollected):
        world.leader.create_collection(task_id, token, secrets.token_bytes(16), T, TP)
    # Nothing was released or spent.
    assert world.leader.privacy.ledger.task_status(files.leader.id_text).spent == 0


def test_add_remove_a_helper_floor_refusal_also_leaves_the_batch_closed(backend: Backend) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("geometric", epsilon="1", neighbouring="add_remove"),
    )
    world = World(backend, files)
    task_id = files.client.task_id
    # The helper's own floor is higher than the leader's: it refuses on its own.
    table = world.helper.table
    stricter = replace(files.helper, min_batch_size=3)
    table.contexts[task_id] = replace(table.contexts[task_id], task=stricter)
    table.tasks[task_id] = stricter
    world.leader.upload(task_id, [world.report(1), world.report(0)])
    failed = world.collect()
    assert failed.state == "failed" and "min_batch_size (3)" in failed.error_message
    assert "can be collected again" not in failed.error_message
    with pytest.raises(BatchCollected):
        world.leader.upload(task_id, [world.report(1)])
