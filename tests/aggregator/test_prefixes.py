"""Poplar1 tasks through the leader's and the helper's logic in one process
(no gRPC), on each storage backend: levels collected in order, every rule on
the aggregation parameter refused by each aggregator on its own, hostile
reports dropped per report (veil.aggregator.prefixes, leader.prefixes,
helper.queries)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from tests.support.backends import Backend
from tests.support.vdaf import CheatingClient
from veil.aggregator.core import AggregationAnswer, AggregatorBase, VerifyInitItem
from veil.aggregator.errors import (
    AggParamRefused,
    BatchTooSmall,
    BudgetExhausted,
    InvalidAggParam,
    LevelCollected,
    TooManyPrefixes,
    Unavailable,
)
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.meter import LeaderMeter
from veil.aggregator.leader.prefixes import LeaderPrefixes, Released
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.maintenance import collect_garbage
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import CollectionRecord, PrefixQuery
from veil.client import prepare_reports
from veil.client.prepare import seal_report
from veil.collector import text_agg_param
from veil.hpke import ROLE_HELPER, ROLE_LEADER, Ciphertext, agg_share_info, open_
from veil.messages import Report, vdaf_ctx
from veil.metrics import Metrics
from veil.task import DpSpec, LeaderTask, TaskFiles, VdafSpec, new_task
from veil.vdaf.spec.poplar1 import Poplar1, Poplar1AggParam
from veil.vdaf.spec.xof import XofTurboShake128

NOW = 1_800_000_000
TP = 3600
T = NOW - NOW % TP - TP


class InProcessHelper:
    """The helper's Poplar1 calls, made directly with the leader's token."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
    ) -> AggregationAnswer:
        assert prefix_round is not None
        agg_param, start, duration, round_ = prefix_round
        results = self.helper.aggregate(
            task.task_id, task.aggregator_token, job_id, items, agg_param, start, duration, round_
        )
        return AggregationAnswer(results)

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
    ) -> Ciphertext:
        return self.helper.aggregate_share(
            task.task_id,
            task.aggregator_token,
            collection_id,
            start,
            duration,
            report_count,
            checksum,
            agg_param,
        )


class World:
    def __init__(self, backend: Backend, files: TaskFiles, metrics: bool = False) -> None:
        self.files = files
        tid = files.leader.task_id
        self.now = float(NOW)  # both aggregators' clock
        self.metrics = {role: Metrics(role) for role in ("leader", "helper")} if metrics else {}
        self.helper = Helper(
            {tid: files.helper},
            backend.store("helper"),
            PrivacyEngine(backend.ledger("helper"), [files.helper], allow_exact_release=True),
            clock=lambda: self.now,
            metrics=self.metrics.get("helper"),
        )
        self.leader_base: AggregatorBase[LeaderTask] = AggregatorBase(
            {tid: files.leader}, backend.store("leader"), lambda: self.now
        )
        self.privacy = PrivacyEngine(
            backend.ledger("leader"), [files.leader], allow_exact_release=True
        )
        base = self.leader_base
        self.leader = LeaderPrefixes(
            base.table,
            base.keys,
            base.store,
            base.clock,
            self.privacy,
            LeaderMeter.of(self.metrics.get("leader")),
        )
        self.api = InProcessHelper(self.helper)
        for engine in (self.helper.privacy, self.privacy):
            assert engine.pool.wait_ready(60)

    def upload(self, answers: Sequence[bytes]) -> list[Report]:
        reports = prepare_reports(
            self.files.client,
            list(answers),
            self.leader_base.current_config,
            self.helper.current_config,
            T,
        )
        self.leader_base.store.put_reports(self.files.leader.task_id, [(T, r) for r in reports])
        return reports

    def collect(
        self, agg_param: Poplar1AggParam, job: bytes | None = None
    ) -> tuple[Released, list[int]]:
        task = self.files.leader
        encoded = task.vdaf.instantiate_poplar1().encode_agg_param(agg_param)
        job = job or secrets.token_bytes(16)
        record = self.leader.create_collection(task, job, T, TP, encoded)
        return self.opened(self.leader.run(task, record, self.api), agg_param)

    def opened(self, released: Released, agg_param: Poplar1AggParam) -> tuple[Released, list[int]]:
        """The released level as the collector reads it: the summed counts."""
        task = self.files.leader
        poplar1 = task.vdaf.instantiate_poplar1()
        encoded = poplar1.encode_agg_param(agg_param)
        collector = self.files.collector
        shares = []
        for role, ct in ((ROLE_LEADER, released.leader_ct), (ROLE_HELPER, released.helper_ct)):
            info = agg_share_info(
                role,
                task.task_id,
                T,
                TP,
                released.report_count,
                dp_params=collector.dp.binding(collector.vdaf),
                agg_param=encoded,
            )
            shares.append(
                poplar1.decode_agg_share(
                    agg_param, open_(collector.collector_hpke_keypair, ct, info)
                )
            )
        return released, list(poplar1.merge(agg_param, shares))


@pytest.fixture
def world(backend: Backend) -> World:
    files = new_task(
        VdafSpec("poplar1", bits=16),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("none"),
    )
    return World(backend, files)


def test_levels_recover_the_counts(world: World) -> None:
    world.upload([b"ab", b"ab", b"ac", b"zz", b"ab"])
    released, counts = world.collect(text_agg_param([b"a", b"b", b"z"]))
    assert (released.report_count, counts) == (5, [4, 0, 1])
    released, counts = world.collect(text_agg_param([b"ab", b"ac", b"zz"]))
    assert counts == [3, 1, 1]


class FailingHelper(InProcessHelper):
    """The helper, but unreachable for one job's first round."""

    def __init__(self, helper: Helper, fail: int) -> None:
        super().__init__(helper)
        self.fail = fail
        self.jobs: list[bytes] = []

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
    ) -> AggregationAnswer:
        if prefix_round is not None and prefix_round[3] == 1:
            self.jobs.append(job_id)
            if len(self.jobs) == self.fail:
                raise Unavailable("the helper is restarting")
        return super().aggregate(task, job_id, items, prefix_round)


def test_a_level_in_many_jobs_survives_one_failing(world: World) -> None:
    """A level's jobs run two at a time (leader.prefixes.PIPELINE); one that
    fails stops the level, and running it again sends every job again (the
    helper answers those it finished from its records): the counts are exact."""
    world.upload([b"ab"] * 5 + [b"ac"] * 3 + [b"zz"] * 3)
    task = world.files.leader
    agg_param = text_agg_param([b"a", b"z"])
    encoded = task.vdaf.instantiate_poplar1().encode_agg_param(agg_param)
    record = world.leader.create_collection(task, secrets.token_bytes(16), T, TP, encoded)
    failing = FailingHelper(world.helper, fail=3)
    with pytest.raises(Unavailable):
        world.leader.run(task, record, failing, job_size=2)
    assert len(failing.jobs) >= 3  # the jobs before it ran
    released, counts = world.opened(world.leader.run(task, record, world.api, 2), agg_param)
    assert (released.report_count, counts) == (11, [8, 3])
    released, counts = world.collect(text_agg_param([b"ab", b"ac", b"zz"]))
    assert counts == [5, 3, 3]


def test_each_aggregator_refuses_bad_parameters(world: World) -> None:
    world.upload([b"ab", b"ab", b"ac"])
    task = world.files.leader
    poplar1 = task.vdaf.instantiate_poplar1()
    job = secrets.token_bytes(16)
    # Not a byte level; too many prefixes; malformed bytes.
    odd = poplar1.encode_agg_param(Poplar1AggParam(3, ((False,) * 4,)))
    with pytest.raises(InvalidAggParam, match="byte level"):
        world.leader.create_collection(task, job, T, TP, odd)
    many = (5).to_bytes(2, "big") + (10**6).to_bytes(4, "big")
    with pytest.raises(TooManyPrefixes):
        world.leader.create_collection(task, job, T, TP, many)
    with pytest.raises(InvalidAggParam):
        world.leader.create_collection(task, job, T, TP, b"\x00\x07")
    world.collect(text_agg_param([b"a"]))
    # The same level again; a prefix that extends none of level 7's.
    with pytest.raises(LevelCollected):
        world.collect(text_agg_param([b"b"]))
    with pytest.raises(AggParamRefused, match="extend"):
        world.collect(text_agg_param([b"ba"]))
    # The helper on its own, asked by a leader that skips its own checks.
    bad = poplar1.encode_agg_param(text_agg_param([b"ba"]))
    with pytest.raises(AggParamRefused, match="extend"):
        world.api.aggregate(task, secrets.token_bytes(16), [], (bad, T, TP, 1))
    again = poplar1.encode_agg_param(text_agg_param([b"a"]))
    with pytest.raises(LevelCollected):
        world.api.aggregate(task, secrets.token_bytes(16), [], (again, T, TP, 1))
    with pytest.raises(InvalidAggParam, match="byte level"):
        world.api.aggregate(task, secrets.token_bytes(16), [], (odd, T, TP, 1))


def test_the_helper_refuses_a_level_after_one_it_did_not_release(world: World) -> None:
    """A leader that skips its own checks aggregates level 7 at the helper,
    never has it released (as when the floor refuses it), and goes on to
    level 15: the helper refuses, so a level refused ends the batch there too."""
    world.upload([b"ab", b"ab", b"ac"])
    task = world.files.leader
    poplar1 = task.vdaf.instantiate_poplar1()
    first = poplar1.encode_agg_param(text_agg_param([b"a"]))
    world.api.aggregate(task, secrets.token_bytes(16), [], (first, T, TP, 1))
    later = poplar1.encode_agg_param(text_agg_param([b"ab", b"ac"]))
    with pytest.raises(AggParamRefused, match="level 7 of this batch was not released"):
        world.api.aggregate(task, secrets.token_bytes(16), [], (later, T, TP, 1))
    assert [q.level for q in world.helper.store.prefix_queries(task.task_id, T, T + TP)] == [7]


def test_hostile_reports_are_dropped_per_report(world: World) -> None:
    good = world.upload([b"ab", b"ab", b"ab"])
    # A public share cut short, and a report whose helper share is another's.
    reports = world.upload([b"ab", b"ab"])
    store = world.leader_base.store
    tid = world.files.leader.task_id
    bad = [
        replace(
            reports[0], report_id=secrets.token_bytes(16), public_share=reports[0].public_share[:-1]
        ),
        replace(reports[1], report_id=secrets.token_bytes(16), helper_ct=good[0].helper_ct),
    ]
    store.put_reports(tid, [(T, r) for r in bad])
    released, counts = world.collect(text_agg_param([b"a"]))
    assert (released.report_count, counts) == (5, [5])


class CountsTwice(Poplar1):
    """A client that programs a count of 2 on its path: not one-hot's "1"."""

    def programmed_values(self, xof: XofTurboShake128) -> tuple[list[list[int]], list[int]]:
        inner, leaf = super().programmed_values(xof)
        return [[2, k] for _, k in inner], [2, leaf[1]]


def _sharded(world: World, vdaf: Poplar1, answer: bytes, tamper_key: bool = False) -> Report:
    task = world.files.client
    report_id = secrets.token_bytes(16)
    public, shares = vdaf.shard(
        vdaf_ctx(task.task_id),
        vdaf.measurement_from_bytes(answer),
        report_id,
        secrets.token_bytes(vdaf.RAND_SIZE),
    )
    leader = vdaf.encode_input_share(shares[0])
    if tamper_key:
        leader = bytes([leader[0] ^ 1]) + leader[1:]
    return seal_report(
        task.task_id,
        report_id,
        T,
        vdaf.encode_public_share(public),
        leader,
        vdaf.encode_input_share(shares[1]),
        world.leader_base.current_config,
        world.helper.current_config,
    )


def test_a_string_not_one_hot_and_a_bad_idpf_key_are_dropped(world: World) -> None:
    world.upload([b"ab", b"ab", b"cd"])
    honest = world.files.client.vdaf.instantiate_poplar1()
    bad = [
        _sharded(world, CountsTwice(16), b"ab"),
        _sharded(world, honest, b"ab", tamper_key=True),
    ]
    world.leader_base.store.put_reports(world.files.leader.task_id, [(T, r) for r in bad])
    released, counts = world.collect(text_agg_param([b"a", b"c"]))
    assert (released.report_count, counts) == (3, [2, 1])
    # The helper dropped them too, counted as verification failures.
    rejected = world.helper.store.rejections(world.files.leader.task_id)
    assert rejected == {"vdaf_verify_error": 2}


def _three_reports_floor_four(backend: Backend) -> tuple[World, TaskFiles]:
    """A 16-bit text task whose floor is 4, with three honest reports
    uploaded ("ab" twice, "cd")."""
    files = new_task(
        VdafSpec("poplar1", bits=16),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=4,
        dp=DpSpec("none"),
    )
    world = World(backend, files)
    world.upload([b"ab", b"ab", b"cd"])
    return world, files


def test_the_floor_does_not_depend_on_the_level_a_report_fails(backend: Backend) -> None:
    """Floor 4: three honest reports and two that fail only at level 15. The
    floor counts the reports each level verified (5 at both levels), so level
    15 is released like level 7, and the two forged reports tell nothing of
    how far the honest count stands from the floor."""
    world, files = _three_reports_floor_four(backend)
    # One-hot at level 7, a count of 2 at level 15: passes the first, fails the second.
    forged = [_sharded(world, CheatingClient(16, 15, 2), b"ab") for _ in range(2)]
    world.leader_base.store.put_reports(files.leader.task_id, [(T, r) for r in forged])
    released, counts = world.collect(text_agg_param([b"a", b"c"]))
    assert (released.report_count, counts) == (5, [4, 1])
    released, counts = world.collect(text_agg_param([b"ab", b"cd"]))
    assert (released.report_count, counts) == (3, [2, 1])
    # Both aggregators dropped the forged reports at level 15 only.
    rejected = world.helper.store.rejections(files.leader.task_id)
    assert rejected == {"vdaf_verify_error": 2}


def test_a_batch_with_fewer_reports_than_the_floor_is_refused(backend: Backend) -> None:
    world, files = _three_reports_floor_four(backend)
    with pytest.raises(BatchTooSmall, match="verified at this level"):
        world.collect(text_agg_param([b"a", b"c"]))
    # The helper too, on its own count: a leader that skips its own floor
    # and asks for the level's share is refused.
    task = files.leader
    (query,) = world.leader_base.store.prefix_queries(task.task_id, T, T + TP)
    helper_query = world.helper.store.prefix_query(task.task_id, T, 7)
    assert helper_query is not None and helper_query.report_count == 3
    with pytest.raises(BatchTooSmall, match="verified at this level"):
        world.api.aggregate_share(
            task,
            query.collected_by or b"",
            T,
            TP,
            helper_query.report_count,
            helper_query.checksum,
            query.agg_param,
        )


def test_each_ledger_refuses_a_level_past_the_budget(backend: Backend) -> None:
    # Three levels, a budget for two: the leader refuses the third at once,
    # and a leader that skips its own ledger is refused by the helper's.
    files = new_task(
        VdafSpec("poplar1", bits=24),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("geometric", epsilon="15", budget="10"),
    )
    world = World(backend, files)
    world.upload([b"abc", b"abc", b"abd"])
    world.collect(text_agg_param([b"a"]))
    world.collect(text_agg_param([b"ab"]))
    with pytest.raises(BudgetExhausted):
        world.collect(text_agg_param([b"abc", b"abd"]))
    task = files.leader
    encoded = task.vdaf.instantiate_poplar1().encode_agg_param(text_agg_param([b"abc"]))
    job = secrets.token_bytes(16)
    record = CollectionRecord(task.task_id, job, T, TP, "pending", agg_param=encoded)
    query = PrefixQuery(task.task_id, T, TP, 23, encoded, collected_by=job)
    world.leader_base.store.create_prefix_collection(record, query, lambda _: None, TP)
    with pytest.raises(BudgetExhausted):
        world.leader.run(task, record, world.api)


def test_a_level_released_before_gc_is_not_released_again_after(backend: Backend) -> None:
    files = new_task(
        VdafSpec("poplar1", bits=16),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("geometric", epsilon="1", budget="10"),
        report_expiry_age=2 * TP,
    )
    world = World(backend, files)
    task = files.leader
    reports = world.upload([b"ab", b"ab", b"ac"])
    job = secrets.token_bytes(16)
    released, _ = world.collect(text_agg_param([b"a"]), job)
    encoded = task.vdaf.instantiate_poplar1().encode_agg_param(text_agg_param([b"a"]))
    again = (job, T, TP, released.report_count, released.checksum, encoded)
    # Before the horizon a retried request gets the stored share, the same bytes.
    assert world.api.aggregate_share(task, *again) == released.helper_ct

    # Past the horizon each aggregator deletes the batch's records: its
    # collections, its query records and (the leader) its reports, together.
    world.now = float(T + TP + 2 * TP + task.max_clock_skew + TP)
    stores = (world.leader_base.store, world.helper.store)
    for store in stores:
        collect_garbage(store, [task], world.now)
    # A leader asking the helper for the released level's share again: no
    # second, freshly noised share.
    with pytest.raises(AggParamRefused):
        world.api.aggregate_share(task, *again)
    assert all(s.prefix_queries(task.task_id, T, T + TP) == [] for s in stores)
    assert world.leader_base.store.batch_reports(task.task_id, T, T + TP) == []
    # Nor a second release from the reports, if the leader kept them: the
    # helper drops reports older than the horizon, so the level is too small.
    world.leader_base.store.put_reports(task.task_id, [(T, r) for r in reports])
    with pytest.raises(BatchTooSmall):
        world.collect(text_agg_param([b"a"]))
    recorded = world.helper.store.prefix_query(task.task_id, T, 7)
    assert recorded is not None and recorded.report_count == 0


class SlowHelper(InProcessHelper):
    """Each job's second round takes longer than a lease; before each job's
    first round another driver tries to lease the collection."""

    def __init__(self, helper: Helper, other: Datastore, lease: float) -> None:
        super().__init__(helper)
        self.other, self.lease = other, lease
        self.taken: list[CollectionRecord] = []
        self.jobs = 0

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
    ) -> AggregationAnswer:
        assert prefix_round is not None
        if prefix_round[3] == 1:
            self.jobs += 1
            self.taken += self.other.acquire_collections("other", self.lease, 16)
        else:
            time.sleep(self.lease * 1.2)
        return super().aggregate(task, job_id, items, prefix_round)


def test_a_level_longer_than_its_lease_is_not_taken_by_another_driver(
    backend: Backend,
) -> None:
    files = new_task(
        VdafSpec("poplar1", bits=16),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("none"),
    )
    world = World(backend, files)
    world.upload([b"ab", b"ab", b"ac"])
    # A job's preparation must fit in the lease, even on a busy machine.
    lease = 1.0
    api = SlowHelper(world.helper, backend.store("leader"), lease)
    metrics = Metrics("leader")
    leader = Leader(
        {files.leader.task_id: files.leader},
        LeaderParts(
            backend.store("leader"), api, world.privacy, clock=lambda: world.now, metrics=metrics
        ),
        LeaderSettings(job_size=1, lease_seconds=lease, worker_id="driver"),
    )
    job = secrets.token_bytes(16)
    encoded = files.leader.vdaf.instantiate_poplar1().encode_agg_param(text_agg_param([b"a"]))
    leader.create_collection(
        files.leader.task_id, files.collector.collector_token, job, T, TP, encoded
    )
    assert leader.run_once()
    # Three jobs of one report, each longer than the lease: the driver kept
    # renewing it, so the other driver never took the collection.
    assert api.jobs == 3 and api.taken == []
    done = leader.collections.store.get_collection(files.leader.task_id, job)
    assert done is not None and (done.state, done.report_count) == ("finished", 3)
    # The level is counted with its time and its number of candidates.
    labels = {"task": files.leader.id_text, "level": "7"}
    get = metrics.registry.get_sample_value
    assert get("veil_prefix_levels_total", {**labels, "outcome": "finished"}) == 1
    assert get("veil_prefix_candidates", labels) == 1
    assert get("veil_prefix_level_seconds_count", {}) == 1
    assert get("veil_prefix_jobs_total", {"outcome": "finished"}) == 3


def test_each_aggregator_counts_its_prefix_jobs(backend: Backend) -> None:
    files = new_task(
        VdafSpec("poplar1", bits=16),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=2,
        dp=DpSpec("none"),
    )
    world = World(backend, files, metrics=True)
    world.upload([b"ab", b"ab", b"cd"])
    bad = _sharded(world, CountsTwice(16), b"ab")
    world.leader_base.store.put_reports(files.leader.task_id, [(T, bad)])
    world.collect(text_agg_param([b"a", b"c"]))
    tid = files.leader.task_id
    task = files.leader.id_text

    def value(role: str, name: str, **labels: str) -> float | None:
        return world.metrics[role].registry.get_sample_value(name, labels)

    for role in ("leader", "helper"):
        assert value(role, "veil_prefix_jobs_total", outcome="finished") == 1
        assert value(role, "veil_prefix_job_seconds_count") == 1
        assert (
            value(role, "veil_prefix_reports_total", task=task, level="7", outcome="accepted") == 3
        )
        verify_error = "vdaf_verify_error"
        assert (
            value(role, "veil_prefix_reports_total", task=task, level="7", outcome=verify_error)
            == 1
        )
    # The helper's release of the level (the leader's is counted by its
    # collection driver, with the level's time).
    assert (
        value("helper", "veil_prefix_levels_total", task=task, level="7", outcome="finished") == 1
    )
    assert value("helper", "veil_prefix_candidates", task=task, level="7") == 2
    assert world.helper.store.rejections(tid) == {"vdaf_verify_error": 1}
