"""bench.helper_process (scripts/bench_helper_process.py): one small round
against a real `veil helper` process runs both paths through its listeners,
the helper's aggregate share answering each (so it aggregated every report
sent), and the table says what it measured."""

from __future__ import annotations

import os
import time

import pytest

from bench.helper_process import Round, Run, run, table, thread_cpu_ns, tick_cpu_ns


def test_the_clocks_count_a_busy_thread() -> None:
    before, ticks = thread_cpu_ns(os.getpid()), tick_cpu_ns(os.getpid())
    began = time.process_time()
    while time.process_time() - began < 0.05:
        pass
    assert thread_cpu_ns(os.getpid()) - before >= 40_000_000
    assert tick_cpu_ns(os.getpid()) >= ticks


@pytest.mark.slow
def test_a_small_round_measures_both_paths() -> None:
    said: list[str] = []
    result = run(1, 20, 10, say=said.append)
    (only,) = result.rounds
    assert not only.dap_first
    for path in ("grpc", "dap"):
        assert only.jobs[path] > 0 and only.share[path] > 0
    assert said[0].startswith("  round 1: gRPC ") and "(gRPC first)" in said[0]
    text = table(result, 20, 10)
    assert "Count, jobs of 10, SQLite, 20 reports a path a round, 1 rounds" in text
    assert f"| {only.jobs_ratio:.2f} ({only.jobs_ratio:.2f} to" in text
    assert f"| {only.ratio:.2f} ({only.ratio:.2f} to {only.ratio:.2f}) |" in text


def test_the_ratio_is_dap_over_grpc_with_the_share() -> None:
    r = Round(False, {"grpc": 50.0, "dap": 55.0}, {"grpc": 0.0, "dap": 5.0})
    assert r.ratio == pytest.approx(1.2) and r.jobs_ratio == pytest.approx(1.1)
    text = table(Run([r], {"grpc": 50.0, "dap": 60.0}, (1.0, 2.0)), 4, 2, "PostgreSQL")
    assert "PostgreSQL, 4 reports a path a round, 1 rounds, load average 1.0" in text
