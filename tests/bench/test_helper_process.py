"""bench.helper_process (scripts/bench_helper_process.py): one small round
against a real `veil helper` process runs both paths through its listeners,
the helper's aggregate share answering each (so it aggregated every report
sent), and the table says what it measured."""

from __future__ import annotations

import os
import time

import pytest

from bench.helper_process import Round, Run, run, table, thread_cpu_ns, tick_cpu_ns


def test_the_clocks_count_a_busy_thread_alike() -> None:
    """The two clocks the benchmark reads (the threads' schedstat, ns; the
    process's utime+stime, in clock ticks) count a busy span of this
    process alike: each at least most of the CPU time the span took, and
    within a generous factor of each other (the ticks' cross-check of the
    benchmark holds to 6 per cent over a run)."""
    pid = os.getpid()
    before, ticks, began = thread_cpu_ns(pid), tick_cpu_ns(pid), time.process_time_ns()
    while time.process_time_ns() - began < 250_000_000:
        pass
    spent = time.process_time_ns() - began
    counted, ticked = thread_cpu_ns(pid) - before, tick_cpu_ns(pid) - ticks
    assert counted >= 0.8 * spent, (counted, spent)
    # A tick is 10 ms: the ticks may lag the nanoseconds by about one.
    assert 0.5 * counted - 20_000_000 <= ticked <= 1.5 * counted + 20_000_000, (ticked, counted)


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
