"""bench.helper_dap (scripts/bench_helper_dap.py): one small round runs both
paths on a real helper, every report of each aggregated (the round checks
it), and the table says what it measured."""

from __future__ import annotations

import pytest

from bench.helper_dap import Round, run, table


def test_a_small_round_measures_both_paths() -> None:
    said: list[str] = []
    (only,) = run(1, 20, 10, say=said.append)
    assert only.grpc > 0 and only.dap > 0 and not only.dap_first
    assert said[0].startswith("  round 1: gRPC ") and "(gRPC first)" in said[0]
    text = table([only], 20, 10)
    assert "Count, jobs of 10, SQLite, 20 reports a path a round, 1 rounds" in text
    assert f"| ratio DAP/gRPC, median of the rounds' | {only.ratio:.2f}" in text


def test_the_ratio_is_dap_over_grpc() -> None:
    assert Round(50.0, 60.0, False).ratio == pytest.approx(1.2)
