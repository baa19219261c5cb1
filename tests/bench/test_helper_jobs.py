"""bench.helper_jobs (scripts/bench_helper_steps.py, and the tests that play
the leader against a helper): its items are what an honest leader sends, so
a real helper verifies every one, and one with a spoiled verifier share it
rejects."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.helper_jobs import honest_items
from tests.support.backends import Backend
from tests.support.in_process import T, World
from veil.task import DpSpec, VdafSpec, new_task

SPECS = [
    (VdafSpec("count"), [0, 1, 1]),
    (VdafSpec("sum", max_measurement=10), [0, 7, 10]),
    (VdafSpec("histogram", length=5, chunk_length=2), [0, 4, 2]),
]


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    b = Backend(tmp_path, None)
    yield b
    b.close()


@pytest.mark.parametrize(("spec", "values"), SPECS, ids=[s.type for s, _ in SPECS])
def test_a_real_helper_verifies_every_item(
    backend: Backend, spec: VdafSpec, values: list[int]
) -> None:
    files = new_task(spec, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none"))
    world = World(backend, files)
    task = files.leader
    ids = [secrets.token_bytes(16) for _ in values]
    items = honest_items(task, values, world.helper.current_config, T + 5, report_ids=ids)
    assert [(it.report_id, it.time) for it in items] == [(rid, T) for rid in ids]
    share = bytearray(items[1].leader_verifier_share)
    share[0] ^= 1
    results = world.helper.aggregate(
        task.task_id,
        task.aggregator_token,
        secrets.token_bytes(16),
        [items[0], items[1]._replace(leader_verifier_share=bytes(share)), items[2]],
    )
    assert [r.reject for r in results] == [None, "vdaf_verify_error", None]


def test_an_invalid_measurement_is_refused(backend: Backend) -> None:
    files = new_task(
        VdafSpec("sum", max_measurement=10), "127.0.0.1:1", "127.0.0.1:2",
        min_batch_size=1, dp=DpSpec("none"),
    )  # fmt: skip
    world = World(backend, files)
    with pytest.raises(ValueError):
        honest_items(files.leader, [11], world.helper.current_config, T)
