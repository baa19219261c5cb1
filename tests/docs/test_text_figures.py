"""Every figure the documents give for text questions is computed here from the
code that decides it (issue 41, item 5: SURVEYS.md and examples/text_survey.toml
gave floors from an older threshold rule: 16% where the code needs 21.4%, ε ≈ 2.4
where a 2% floor takes 3.1)."""

from __future__ import annotations

from fractions import Fraction

from tests.support.docs import ROOT, read
from veil.dp.accounting import zcdp_epsilon
from veil.dp.heavy_hitters import (
    DEFAULT_RELEASE_TARGET,
    DEFAULT_SPURIOUS_TARGET,
    detection_floor,
)
from veil.survey import load_survey, parse_survey
from veil.survey.text import MAX_PREFIXES, text_plan, text_threshold

N = 10_000


def _prose(path: str) -> str:
    return " ".join(read(path).split())


def _floor(mechanism: str, epsilon: Fraction | None = None, rho: Fraction | None = None):  # type: ignore[no-untyped-def]
    plan = text_plan(16, mechanism, epsilon, rho, "replace_one")
    threshold = text_threshold(plan, None, None, N)
    return detection_floor(plan, threshold.value, N), threshold


def _epsilon_for(share: Fraction) -> Fraction:
    """The least pure ε (to 10⁻⁴) whose 16 levels find an answer `share` of N give."""
    lo, hi = Fraction(1, 10), Fraction(20)
    while hi - lo > Fraction(1, 10**4):
        mid = (lo + hi) / 2
        if _floor("geometric", mid)[0].count <= share * N:
            hi = mid
        else:
            lo = mid
    return hi


def test_the_pure_epsilon_figures_are_the_codes() -> None:
    # The ε a weight-1 question gets when a text question joins the example survey.
    example = read("examples/survey.toml")
    text = '\n[[question]]\nid = "editor"\ntext = "Which editor?"\nkind = "text"\n'
    survey = parse_survey(example + text, "survey.toml")
    share = survey.question("editor").epsilon
    assert share == Fraction(1, 4)  # five questions, one of weight 2, a breakdown and it
    floor, _ = _floor("geometric", share)
    needed = _epsilon_for(Fraction(2, 100))
    prose = _prose("docs/SURVEYS.md")
    assert (
        f"({share.numerator}/{share.denominator}), an answer needs {float(floor.share):.1%} of"
        f" {N:,} respondents to be found, and it takes ε ≈ {float(needed):.2g} for a 2% floor"
        in prose
    )
    toml = _prose("examples/text_survey.toml")
    assert f"which would need about {float(needed):.2g} to find answers given by 2%" in toml


def test_the_gaussian_figures_are_the_codes() -> None:
    example = load_survey(ROOT / "examples" / "text_survey.toml")
    assert example.rho is not None and example.expected_respondents == N
    floor, threshold = _floor("gaussian", rho=example.rho)
    epsilon = zcdp_epsilon(example.rho, Fraction(1, 10**6))
    prose = _prose("docs/SURVEYS.md")
    released = f"{threshold.release_probability:.1e}".replace("e-05", "·10⁻⁵")
    assert (
        f"at ρ = {float(example.rho):g} (ε ≈ {float(epsilon):.3g} at δ = 10⁻⁶, stated as such)"
        f" the floor is {float(floor.share):.2%} of {N:,} respondents and an answer given once"
        f" is released with probability at most {released}" in prose
    )


def test_the_threshold_rule_is_stated_in_the_codes_numbers() -> None:
    prose = _prose("docs/SURVEYS.md")
    assert "no empty one survives" not in prose
    once = round(1 / DEFAULT_RELEASE_TARGET)
    assert f"released at most one time in {once:,}" in prose
    assert (
        f"of the up to {MAX_PREFIXES:,} prefixes one query asks about, the expected number"
        f" that nobody gave and that are kept anyway is at most {DEFAULT_SPURIOUS_TARGET} a"
        f" level (one level in {round(1 / DEFAULT_SPURIOUS_TARGET)} keeps one" in prose
    )
