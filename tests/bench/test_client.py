"""bench.client's lone-caller table (scripts/bench_async_client.py --lone):
every row is measured, on real servers, and the parts beside them."""

from __future__ import annotations

import pytest

from bench import client as bench


@pytest.mark.slow
def test_a_small_lone_run_measures_every_row() -> None:
    costs = bench.lone_costs(batch=2, calls=2, rounds=1)
    assert (costs.batch, costs.calls, costs.rounds) == (2, 2, 1)
    assert set(costs.cpu_us) == set(costs.wall_ms) == set(bench.LONE_ROWS)
    assert all(us > 0 for us in costs.cpu_us.values())
    assert all(ms > 0 for ms in costs.wall_ms.values())
    # A whole call builds its reports: it costs more than their parts.
    assert costs.cpu_us["Client.upload_batch (one thread)"] > 2 * costs.parts_us > 0
    assert costs.parts_1000_us > 0
