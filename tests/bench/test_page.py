"""bench.page (scripts/bench_page.py) runs both servers and measures them:
a few requests of each kind, no timing asserted."""

from __future__ import annotations

import pytest

from bench import page as bench_page

pytestmark = pytest.mark.slow


def test_the_page_benchmark_runs_both_servers() -> None:
    rows = bench_page.measure(rounds=1, keepalive=20, fresh=10)
    assert [r.kind for r in rows] == ["plain", "guard"]
    assert all(r.keepalive_per_s > 0 and r.new_connection_per_s > 0 for r in rows)
    table = bench_page.format_table(rows)
    assert "| guard/plain |" in table and table.count("\n") == 4
