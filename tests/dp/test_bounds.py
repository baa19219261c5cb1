"""Extreme but accepted parameters (issue 13, item 4): interval arithmetic that
stays finite at huge scales, bounded Gaussian tables, the largest batch a task
can sum without wrapping around the field, and out-of-range decoded values."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest

from veil.dp import DiscreteGaussian, DiscreteLaplace, InvalidParameter, NoisePlan
from veil.dp.bounds import AggregateBounds, noise_bound
from veil.dp.mechanisms import DPConfig, TotalNoise
from veil.task import DpSpec, VdafSpec
from veil.vdaf import Field64


@pytest.mark.parametrize("scale", [10**6, 10**16, 10**30])
def test_central_mass_at_huge_scales(scale: int) -> None:
    """At scale 1e16, exp(-1/scale) is 1.0 in floats and the closed form divided
    by zero (after both aggregators had spent their budget). Against the
    continuous limit: for two Laplace(1), P(|X + Y| <= t) = 1 - (2 + t)e**-t / 2."""
    two = TotalNoise((DiscreteLaplace(scale),) * 2)
    one = TotalNoise((DiscreteLaplace(scale),))
    for t in (0.5, 1, 3, 10):
        c = int(t * scale)
        assert two.central_mass(c) == pytest.approx(1 - (2 + t) * math.exp(-t) / 2, rel=1e-6)
        assert one.central_mass(c) == pytest.approx(1 - math.exp(-t), rel=1e-6)
    assert 0 <= two.central_mass(0) < 1e-6
    assert two.pmf(0) > 0 and math.isfinite(DiscreteLaplace(scale).variance())


def test_a_scale_beyond_double_precision_is_refused() -> None:
    with pytest.raises(InvalidParameter, match="beyond double precision"):
        TotalNoise((DiscreteLaplace(10**400),) * 2).central_mass(1)


def test_gaussian_tables_are_bounded() -> None:
    """σ = 1e8 needed tens of GB of table for an interval; now a closed form."""
    wide = DiscreteGaussian(10**8)
    assert not wide.tabulable
    with pytest.raises(InvalidParameter, match="at most"):
        wide.pmf_table()
    total = TotalNoise((wide,) * 2)
    c = int(1.959964 * math.sqrt(2) * 10**8)
    assert total.central_mass(c) == pytest.approx(0.95, abs=1e-6)
    # The closed form agrees with the exact table where both exist.
    narrow = TotalNoise((DiscreteGaussian(2000),) * 2)
    for c in (0, 1000, 3000, 8000):
        normal = math.erf((c + 0.5) / math.sqrt(2 * 2 * 2000**2))
        assert narrow.central_mass(c) == pytest.approx(normal, abs=1e-8)


def test_split_mode_scale_is_bounded() -> None:
    """The Pólya sampler's cost grows with the scale: a scale of 1e16 hung the pool."""
    with pytest.raises(InvalidParameter, match="split mode draws Pólya noise of scale at most"):
        NoisePlan.for_task(
            DPConfig.parse("geometric", "1/10", None, "split", 0),
            "Prio3Sum",
            {"max_measurement": 10**6},
        )


def test_max_batch_size_prevents_wrap_around() -> None:
    """Sum(max 2**40) with 2**23 + 1 reports decoded to -9.2e18 for +9.2e18."""
    spec = DpSpec("geometric", epsilon="1")
    bounds = spec.bounds(VdafSpec("sum", max_measurement=2**40))
    assert bounds.modulus == Field64.MODULUS
    n = bounds.max_batch_size
    assert n < 2**23 + 1
    assert n * 2**40 + bounds.noise <= (Field64.MODULUS - 1) // 2
    assert (n + 1) * 2**40 + bounds.noise > (Field64.MODULUS - 1) // 2
    # Noise alone beyond the field: no batch at all fits.
    huge = DpSpec("geometric", epsilon="1/10").bounds(VdafSpec("sum", max_measurement=2**62))
    assert huge.max_batch_size == 0
    with pytest.raises(InvalidParameter, match="would wrap around the field"):
        huge.check_batch_floor(1)


def test_noise_bound_and_out_of_range() -> None:
    plan = DpSpec("geometric", epsilon="1").plan(VdafSpec("count"))
    b = noise_bound(plan)
    assert plan.total_noise().central_mass(b) >= 1 - 1e-12 > plan.total_noise().central_mass(b - 1)
    bounds = AggregateBounds(report_max=1, noise=b, modulus=Field64.MODULUS)
    assert bounds.plausible(10) == (-b, 10 + b)
    assert bounds.out_of_range([0, -b, 10 + b, -b - 1, 11 + b, -(2**62)], 10) == [3, 4, 5]
    assert noise_bound(DpSpec("none").plan(VdafSpec("count"))) == 0
    assert Fraction(b) > 0


def test_task_new_refuses_a_task_whose_batch_would_wrap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`veil task new` refuses what both aggregators would refuse at start."""
    from veil.cli import main

    argv = [
        "task", "new", "--vdaf", "sum", "--max-measurement", str(2**62), "--min-batch-size", "1",
        "--mechanism", "geometric", "--epsilon", "0.1", "--leader", "127.0.0.1:1",
        "--helper", "127.0.0.1:2", "--name", "big", "--out", str(tmp_path / "tasks"),
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil task new: a batch of 1 reports") and err.count("\n") == 1
    assert "would wrap around the field" in err
    assert not (tmp_path / "tasks").exists()
