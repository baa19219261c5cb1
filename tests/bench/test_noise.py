"""bench.noise (scripts/bench_noise_timing.py) runs and measures what it says:
a few trials of each arrangement, no timing asserted."""

from __future__ import annotations

from bench import noise as bench_noise


def test_the_timing_benchmark_runs_each_arrangement() -> None:
    rows = bench_noise.measure(trials=40)
    assert [r.trials for r in rows] == [40, 40, 40]
    assert all(-1 <= r.spearman <= 1 and 0 <= r.p_value <= 1 for r in rows)
    assert rows[0].shows_draw is None and all(r.shows_draw is not None for r in rows[1:])
    table = bench_noise.format_table(rows)
    assert "pool drawing in a thread (veil)" in table and "drawing in a child" in table
    assert bench_noise._child is None  # the child was closed


def test_the_child_draws_real_noise() -> None:
    child = bench_noise.NoiseProcess()
    try:
        plan = bench_noise.plan_for("0.5")
        draws = [child.draw(plan, 4) for _ in range(30)]
    finally:
        child.close()
    assert all(len(d) == 4 for d in draws) and any(z != 0 for d in draws for z in d)
    assert not child.alive


def test_spearman_matches_a_known_case() -> None:
    rho, p = bench_noise.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7])
    assert abs(rho - 0.8207826816681233) < 1e-12 and 0 < p < 1
    assert bench_noise.spearman([1, 2, 3], [3, 2, 1])[0] == -1.0
