"""Text answers (Poplar1) through a real leader and helper: uploaded from the
client library, collected level by level with the collector library, and the
hostile collections each refused with its own error."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.support.cli import veil
from tests.support.deployment import Deployment, start_deployment
from tests.support.times import past_bucket
from veil.aggregator.errors import AggParamRefused
from veil.aggregator.leader.helper_client import GrpcHelperClient
from veil.aggregator.maintenance import collect_garbage
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.collector import CollectionError, text_agg_param
from veil.observations import json_paths, load_inventory, unclassified
from veil.protocol.v1 import leader_pb2, leader_pb2_grpc, messages_pb2
from veil.task import CollectorTask, DpSpec, VdafSpec
from veil.vdaf.spec.poplar1 import Poplar1AggParam

pytestmark = pytest.mark.slow

TP = 3600
TEXT = VdafSpec("poplar1", bits=16)
ANSWERS = [b"hi"] * 5 + [b"ho"] * 3 + [b"xy"]


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    settings = {"time_precision": TP, "min_batch_size": 2}
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "exact": (TEXT, DpSpec("none"), settings),
        # ε = 20 over two levels: noise of scale 0.2 per count, for checks
        # that do not depend on luck.
        "noisy": (TEXT, DpSpec("geometric", epsilon="20"), settings),
        "hostile": (TEXT, DpSpec("none"), settings),
        "status": (TEXT, DpSpec("none"), settings),
        # Reports expire after a day: garbage collection then deletes a batch.
        "expiring": (
            TEXT,
            DpSpec("geometric", epsilon="10", budget="20"),
            {**settings, "report_expiry_age": 24 * TP},
        ),
    }
    d = start_deployment(Path(tmp_path_factory.mktemp("text")), tasks)
    try:
        yield d
    finally:
        d.stop()


def test_levels_recover_the_answers(dep: Deployment) -> None:
    t = past_bucket(2)
    assert dep.client("exact").upload_batch(ANSWERS, report_time=t).accepted == len(ANSWERS)
    with dep.collector("exact") as collector:
        first = collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x", b"z"]), wait=120)
        assert (first.level, first.noisy_counts, first.report_count) == (7, [5 + 3, 1, 0], 9)
        survivors = [
            p for p, n in zip(first.prefix_bytes(), first.noisy_counts, strict=True) if n >= 2
        ]
        # The survivors extended by two byte values (a collector would try all 256).
        candidates = [s + bytes([c]) for s in survivors for c in b"io"]
        second = collector.collect_prefixes(t, TP, text_agg_param(candidates), wait=120)
    assert dict(zip(second.prefix_bytes(), second.noisy_counts, strict=True)) == {
        b"hi": 5,
        b"ho": 3,
    }


def test_noisy_counts_and_budget(dep: Deployment) -> None:
    t = past_bucket(3)
    dep.client("noisy").upload_batch(ANSWERS, report_time=t)
    with dep.collector("noisy") as collector:
        first = collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x"]), wait=120)
        second = collector.collect_prefixes(t, TP, text_agg_param([b"hi", b"ho"]), wait=120)
        assert first.spent == 10 and second.spent == 10
        for result, truth in ((first, [8, 1]), (second, [5, 3])):
            assert all(abs(n - c) <= 2 for n, c in zip(result.noisy_counts, truth, strict=True))
            assert all(e.low <= e.value <= e.high for e in result.estimates)
        # Both levels spent the question's whole budget: the ledger refuses more.
        with pytest.raises(CollectionError, match="budget exhausted"):
            collector.collect_prefixes(t, TP, text_agg_param([b"hi"]), wait=30)


def _create(dep: Deployment, task: CollectorTask, t: int, agg_param: bytes) -> Any:
    """CreateCollection with raw parameter bytes, as a hostile collector sends them."""
    request = leader_pb2.CreateCollectionRequest(
        task_id=task.task_id,
        collection_job_id=secrets.token_bytes(16),
        batch_interval=messages_pb2.Interval(start=t, duration=TP),
        agg_param=agg_param,
    )
    auth = (("authorization", f"Bearer {task.collector_token}"),)
    with grpc.insecure_channel(dep.leader.address) as channel:
        stub = leader_pb2_grpc.LeaderStub(channel)
        return stub.CreateCollection(request, metadata=auth, timeout=30)


def test_hostile_collections_are_refused(dep: Deployment) -> None:
    t = past_bucket(4)
    dep.client("hostile").upload_batch(ANSWERS, report_time=t)
    with dep.collector("hostile") as collector:
        poplar1 = collector.poplar1
        assert poplar1 is not None
        cases = [
            (b"", grpc.StatusCode.INVALID_ARGUMENT, "aggregation parameter"),
            (b"\x00\x07\x00", grpc.StatusCode.INVALID_ARGUMENT, "6 bytes"),
            (
                poplar1.encode_agg_param(Poplar1AggParam(3, ((True,) * 4,))),
                grpc.StatusCode.INVALID_ARGUMENT,
                "byte level",
            ),
            (
                (7).to_bytes(2, "big") + (20000).to_bytes(4, "big") + bytes(20000),
                grpc.StatusCode.INVALID_ARGUMENT,
                "at most 16384",
            ),
        ]
        for agg_param, code, words in cases:
            with pytest.raises(grpc.RpcError) as e:
                _create(dep, dep.tasks["hostile"].collector, t, agg_param)
            assert e.value.code() == code and words in (e.value.details() or "")
        collector.collect_prefixes(t, TP, text_agg_param([b"h"]), wait=120)
        with pytest.raises(CollectionError, match="once per level"):
            collector.collect_prefixes(t, TP, text_agg_param([b"x"]), wait=30)
        with pytest.raises(CollectionError, match="extend"):
            collector.collect_prefixes(t, TP, text_agg_param([b"xy"]), wait=30)
        # The refused requests left nothing: level 15 still collects.
        last = collector.collect_prefixes(t, TP, text_agg_param([b"hi", b"ho"]), wait=120)
    assert last.noisy_counts == [5, 3]


def test_a_level_is_not_released_again_after_garbage_collection(dep: Deployment) -> None:
    t = past_bucket(2)
    dep.client("expiring").upload_batch(ANSWERS, report_time=t)
    task = dep.tasks["expiring"].leader
    stores = {role: SqliteDatastore(dep.local.root / f"{role}.db") for role in ("leader", "helper")}
    try:
        with dep.collector("expiring") as collector:
            collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x"]), wait=120)
            (released,) = stores["leader"].collections(task.task_id)
            # `veil gc` a day and a half later, on each server's database
            # (the servers run meanwhile).
            for store in stores.values():
                collect_garbage(store, [task], time.time() + 36 * TP)
            # The leader asking the helper for the released level's share
            # again (as a leader that lost its own record would): refused, no
            # second noised share of the same counts.
            helper = GrpcHelperClient(grpc.insecure_channel, 30.0)
            with pytest.raises(AggParamRefused):
                helper.aggregate_share(
                    task,
                    released.job_id,
                    t,
                    TP,
                    released.report_count,
                    released.checksum,
                    released.agg_param or b"",
                )
            # The batch's reports, collections and query records went together.
            assert stores["leader"].batch_reports(task.task_id, t, t + TP) == []
            assert all(s.prefix_queries(task.task_id, t, t + TP) == [] for s in stores.values())
            # The collector querying the level again: refused (its reports are gone).
            with pytest.raises(CollectionError, match="min_batch_size"):
                collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x"]), wait=60)
    finally:
        for store in stores.values():
            store.close()


def test_status_shows_text_reports_held_for_prefix_queries(dep: Deployment) -> None:
    t = past_bucket(5)
    dep.client("status").upload_batch(ANSWERS, report_time=t)
    name = "status"

    def status(role: str) -> dict[str, Any]:
        done = veil("status", "--json", "--config", dep.local.root / f"{role}.toml")
        assert done.returncode == 0, done.stderr
        out: dict[str, Any] = json.loads(done.stdout)
        assert (
            unclassified(load_inventory(), "leader_operator", json_paths(out, "json:veil-status"))
            == []
        )
        return next(x for x in out["tasks"] if x["name"] == name)

    # Before any query: held for the collections, never "pending" forever.
    task = status("leader")
    assert task["reports"] == {"held_for_prefix_queries": len(ANSWERS)}
    (batch,) = [b for b in task["batches"] if b["start"] == t]
    assert (batch["pending"], batch["held"], batch["levels"], batch["state"]) == (
        0,
        len(ANSWERS),
        [],
        "held",
    )
    text = veil("status", "--config", dep.local.root / "leader.toml").stdout
    assert f"reports stored: held_for_prefix_queries {len(ANSWERS)}" in text
    with dep.collector(name) as collector:
        collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x"]), wait=120)
        task = status("leader")
        (batch,) = [b for b in task["batches"] if b["start"] == t]
        assert (batch["levels"], batch["state"]) == ([7], "queried")
        queries = [(q["level"], q["candidates"], q["state"]) for q in task["prefix_queries"]]
        assert queries == [(7, 2, "released")]
        collector.collect_prefixes(t, TP, text_agg_param([b"hi", b"ho", b"xy"]), wait=120)
    for role in ("leader", "helper"):
        task = status(role)
        assert [(q["level"], q["candidates"], q["state"]) for q in task["prefix_queries"]] == [
            (7, 2, "released"),
            (15, 3, "released"),
        ]
        (batch,) = [b for b in task["batches"] if b["start"] == t]
        assert (batch["levels"], batch["state"]) == ([7, 15], "done")
    # (The batch done, the server's garbage collection may have deleted its reports.)
    text = veil("status", "--config", dep.local.root / "leader.toml").stdout
    assert "done (levels 7, 15)" in text
    assert "level 15: 3 candidates, released, 9 reports" in text
