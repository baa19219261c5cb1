"""bench.vdaf's Poplar1 rows (scripts/bench_vdaf.py): the workload is what
the table says, and a run checks its counts against the truth."""

from __future__ import annotations

import random
from collections import Counter

from bench import vdaf as bench


def test_candidates_are_the_heavy_prefixes_and_their_siblings() -> None:
    inputs = bench.poplar1_inputs(40)
    assert len(inputs.measurements) == 40 and len(inputs.heavy) == bench.POPLAR1_HEAVY
    held = Counter(inputs.measurements)
    assert sum(held[w] for w in inputs.heavy) >= 20  # most reports hold a heavy string
    for level in (0, 7, 127):
        agg_param = bench.poplar1_candidates(inputs.heavy, level)
        assert list(agg_param.prefixes) == sorted(set(agg_param.prefixes))
        assert {w[: level + 1] for w in inputs.heavy} <= set(agg_param.prefixes)
        assert len(agg_param.prefixes) <= 2 * bench.POPLAR1_HEAVY


def test_a_small_run_fills_every_field() -> None:
    row = bench.run_poplar1(6, runs=1, levels=(0, 3), sweep=False)
    assert row.batch == 6 and row.runs == 1
    assert row.shard_us > 0 and row.client_shard_ms > 0
    assert set(row.cold_us) == {0, 3} and set(row.warm_us) == {3}
    assert all(v > 0 for v in (*row.cold_us.values(), *row.warm_us.values()))
    assert row.sweep_us == 0.0


def test_a_small_text_run_queries_byte_levels() -> None:
    row = bench.run_poplar1_text(3, survivors=2, runs=1)
    assert row.batch == 3 and row.strings == 2 and 1 <= row.survivors <= 2
    assert row.candidates == (256, 256 * row.survivors, 256 * 2)
    assert min(row.first_us, row.second_cold_us, row.second_warm_us, row.last_us) > 0


def test_a_small_parts_run_accounts_for_the_whole() -> None:
    parts = bench.run_poplar1_parts(6, level=0, runs=1)
    assert set(parts) == {*bench.POPLAR1_PARTS, "total"}
    assert all(parts[name] > 0 for name in ("decode", "fixed AES keys", "IDPF walk", "total"))


def test_l1_bound_sum_measurements_stay_within_the_bound() -> None:
    rng = random.Random(3)
    drawn = [bench.within_l1(rng, 10, 25) for _ in range(200)]
    assert all(len(v) == 10 and min(v) >= 0 and sum(v) <= 25 for v in drawn)
    assert {sum(v) for v in drawn} >= {0, 25}  # the whole range, ends included


def test_a_small_l1_bound_sum_run_against_sumvec() -> None:
    by_name = {c.name: c for c in bench.cases()}
    rows = bench.run_interleaved(
        [by_name["Prio3L1BoundSum(100,255,30)"], by_name["Prio3SumVec(100,255,30)"]], 4, runs=2
    )
    assert [r.name for r in rows] == ["Prio3L1BoundSum(100,255,30)", "Prio3SumVec(100,255,30)"]
    assert all(r.batch == 4 and r.runs == 2 and r.shard_cpu_us > 0 for r in rows)
    assert all(r.verify_cpu_us > 0 for r in rows)
