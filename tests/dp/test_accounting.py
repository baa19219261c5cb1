"""ε, ρ and (ε, δ): the tight zCDP conversion and the privacy statement types (issue 14)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from veil.dp import InvalidParameter
from veil.dp.accounting import (
    Guarantee,
    Neighbouring,
    PrivacyStatement,
    pure_to_rho,
    zcdp_delta,
    zcdp_epsilon,
    zcdp_rho,
)

MICRO = Fraction(1, 10**6)


def _loose_epsilon(rho: float, delta: float) -> float:
    """Bun and Steinke 2016: ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP (valid, not tight)."""
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_the_issue_figure_rho_two_is_epsilon_eleven_point_seven() -> None:
    # The example survey's "epsilon = 2" read as ρ = 2 is (ε ≈ 11.69, δ = 1e-6)-DP.
    epsilon = zcdp_epsilon(Fraction(2), MICRO)
    assert 11.68 < epsilon < 11.70
    assert epsilon < _loose_epsilon(2, 1e-6)  # tighter than the simple bound (12.51)


@pytest.mark.parametrize("rho", ["0.001", "0.05", "0.5", "2", "20"])
@pytest.mark.parametrize("delta", [Fraction(1, 10**3), MICRO, Fraction(1, 10**12)])
def test_conversions_round_the_safe_way(rho: str, delta: Fraction) -> None:
    r = Fraction(rho)
    epsilon = zcdp_epsilon(r, delta)
    # The stated ε really gives δ or less; a visibly smaller ε would not.
    assert zcdp_delta(r, epsilon) <= float(delta)
    assert zcdp_delta(r, epsilon * Fraction(999, 1000)) > float(delta)
    assert epsilon <= _loose_epsilon(float(r), float(delta)) + 1e-9
    # Solving back gives a ρ at most the original (rounded down) and close to it.
    back = zcdp_rho(epsilon, delta)
    assert back <= r * (1 + Fraction(1, 10**5))
    assert zcdp_delta(back, epsilon) <= float(delta)
    assert back > r * Fraction(999, 1000)


def test_solved_rho_is_the_largest_that_fits() -> None:
    rho = zcdp_rho(Fraction(1), MICRO)
    assert zcdp_delta(rho, Fraction(1)) <= 1e-6
    assert zcdp_delta(rho * Fraction(1001, 1000), Fraction(1)) > 1e-6


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(0, MICRO), (-1, MICRO), (1, 0), (1, 1), (1, 2), (1, -MICRO)],
)
def test_bad_conversion_inputs_are_refused(epsilon: int, delta: Fraction) -> None:
    with pytest.raises(InvalidParameter):
        zcdp_rho(Fraction(epsilon), delta)


def test_pure_dp_is_half_epsilon_squared_zcdp() -> None:
    assert pure_to_rho(Fraction(1, 2)) == Fraction(1, 8)


def test_guarantee_json_and_words() -> None:
    pure = Guarantee.pure(Fraction(1, 2))
    assert pure.to_json() == {"epsilon": "0.5", "delta": "0"}
    assert pure.text() == "ε = 0.5 (pure ε-DP)"
    z = Guarantee.zcdp(Fraction(1, 2), MICRO)
    data = z.to_json()
    assert data is not None and data["rho"] == "0.5" and data["delta"] == "0.000001"
    assert 5.22 < float(data["epsilon"]) < 5.23
    assert z.text().startswith("ρ = 0.5 zCDP, which implies (ε = 5.22")
    assert Guarantee.no_privacy().to_json() is None


def test_statement_json_leaves_room_for_against_everyone() -> None:
    g = Guarantee.pure(Fraction(1))
    weaker = Guarantee.pure(Fraction(1675, 1000))
    statement = PrivacyStatement("one report", Neighbouring.REPLACE_ONE, g, weaker)
    data = statement.to_json()
    assert data["unit"] == "one report"
    assert data["neighbouring"] == "replace_one"
    assert data["against_collector"] == {"epsilon": "1", "delta": "0"}
    assert data["against_collector_and_one_aggregator"] == {"epsilon": "1.675", "delta": "0"}
    assert "against_everyone" not in data
    assert any("both aggregators colluding: none" in line for line in statement.lines())
    local = PrivacyStatement("one report", Neighbouring.REPLACE_ONE, g, g, against_everyone=g)
    assert local.to_json()["against_everyone"] == {"epsilon": "1", "delta": "0"}
