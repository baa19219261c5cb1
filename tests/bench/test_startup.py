"""bench.startup (scripts/bench_startup.py): every row is measured on real
processes (servers that serve, a survey deployed, answered and reported on),
alone and against a second source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import startup as bench

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.slow
def test_one_start_of_every_command_is_measured() -> None:
    rows = bench.measure(starts=1)
    assert [r.command for r in rows] == list(bench.ROWS)
    assert all(len(r.cpu_s) == 1 and r.cpu_s[0] > 0 and r.vs_cpu_s is None for r in rows)
    cpu = {r.command: r.median for r in rows}
    # A server's start and an answer sent through it do more than print a version.
    assert cpu["veil leader (start to serving)"] > cpu["veil --version"]
    assert cpu["veil survey respond"] > cpu["veil --version"]
    table = bench.format_table(rows)
    assert all(name in table for name in bench.ROWS) and "ratio" not in table


def test_starts_alternate_with_the_other_tree() -> None:
    rows = bench.measure(starts=2, rows=["veil --version"], vs=SRC)
    (row,) = rows
    assert len(row.cpu_s) == 2 and row.vs_cpu_s is not None and len(row.vs_cpu_s) == 2
    assert "ratio" in bench.format_table(rows)


def test_an_unknown_row_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown rows"):
        bench.measure(starts=1, rows=["veil nonsense"])
