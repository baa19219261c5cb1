"""Dividing a survey's total budget among its questions.

A survey whose questions all use pure ε-DP mechanisms (geometric, the
default, or laplace) has a total ``epsilon``, divided among the questions by
sequential composition: ``epsilon`` on a question takes that much, the rest
is shared in proportion to ``weight`` (default 1). As soon as one question
uses the gaussian mechanism (zCDP), the survey is composed under zCDP: its
total is ``rho``, or ``epsilon`` *and* ``delta`` (solved for the largest ρ
with the tight conversion of Canonne, Kamath, Steinke 2020), shared as ρ; a
pure question there gets the ε whose ε²/2 fits its share.

The functions that read a survey file's settings take where to point an
error (`Locates`: the file's line of a setting, `veil.survey.parse`);
`with_epsilon` and `with_local_epsilon` rescale a parsed survey.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any, Protocol

from veil.dp.accounting import DEFAULT_DELTA, zcdp_epsilon, zcdp_rho
from veil.dp.errors import DPError
from veil.dp.local import parse_local_epsilon
from veil.dp.mechanisms import MAX_EPSILON, MAX_RHO, MIN_EPSILON, MIN_RHO
from veil.survey.model import Survey, SurveyError


class Locates(Protocol):
    """Where a survey file's setting is: an error at its line."""

    def error(self, question: int | None, key: str | None, message: str) -> SurveyError:
        """An error at the line of `key` of [survey] (question None) or of a [[question]]."""
        ...


def exact_number(value: Any) -> Fraction:
    """A number of a survey file, exactly; ValueError says, in our words, what it got."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"got {value}, which is not finite")
        return Fraction(str(value))
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return Fraction(value)
        except (ValueError, ZeroDivisionError):
            pass
    raise ValueError(f"got {value!r}")


def survey_total(
    loc: Locates, head: Mapping[str, Any], mechanism: str, zcdp: bool
) -> tuple[Fraction | None, Fraction | None]:
    """(total, delta) of the [survey] table: ε for a pure survey, ρ under zCDP."""

    def number(key: str, low: Fraction, high: Fraction) -> Fraction:
        try:
            value = exact_number(head.get(key))
        except (ValueError, ZeroDivisionError) as e:
            raise loc.error(None, key, f"survey `{key}` must be a number: {e}") from None
        if not low <= value <= high:
            raise loc.error(None, key, f"survey `{key}` must be in [{low}, {high}], got {value}")
        return value

    if mechanism == "none":
        # `epsilon` was once required of every survey; with no noise it means nothing.
        for key in ("rho", "delta"):
            if key in head:
                raise loc.error(None, key, f"a survey with mechanism none has no `{key}`")
        return None, None
    if not zcdp:
        if "rho" in head or "delta" in head:
            key = "rho" if "rho" in head else "delta"
            raise loc.error(
                None,
                key,
                f"`{key}` belongs to zCDP (the gaussian mechanism); this survey's questions "
                "are pure ε-DP and its budget is `epsilon`",
            )
        return number("epsilon", MIN_EPSILON, MAX_EPSILON), None
    delta = DEFAULT_DELTA
    if "delta" in head:
        delta = number("delta", Fraction(1, 10**15), Fraction(1, 1000))
    if "rho" in head:
        if "epsilon" in head:
            raise loc.error(
                None, "epsilon", "give the zCDP budget as `rho`, or as `epsilon` and `delta`"
            )
        return number("rho", MIN_RHO, MAX_RHO), delta
    if "epsilon" not in head or "delta" not in head:
        raise loc.error(
            None,
            "epsilon",
            "a survey with a gaussian question is composed under zCDP: give its budget as "
            "`rho`, or as `epsilon` and `delta` (veil solves for the largest ρ that gives "
            "(ε, δ)-DP)",
        )
    epsilon = number("epsilon", MIN_EPSILON, MAX_EPSILON)
    try:
        return zcdp_rho(epsilon, delta), delta
    except DPError as e:
        raise loc.error(None, "epsilon", str(e)) from None


def divide(
    loc: Locates,
    total: Fraction,
    unit: str,
    explicit: Mapping[int, Fraction],
    weights: Mapping[int, Fraction],
) -> dict[int, Fraction]:
    """Each question's share of the total: explicit ones first, the rest by weight."""
    fixed = sum(explicit.values(), Fraction(0))
    if fixed > total or (fixed == total and weights):
        first = min(explicit)
        raise loc.error(
            first,
            unit,
            f"question budgets add up to {unit} {fixed}, which overspends the survey's "
            f"{unit} {total}" + (" and leaves nothing for weighted questions" if weights else ""),
        )
    remaining = total - fixed
    weight_sum = sum(weights.values(), Fraction(0))
    return {
        i: explicit[i] if i in explicit else remaining * weights[i] / weight_sum
        for i in sorted({*explicit, *weights})
    }


def sqrt_down(x: Fraction) -> Fraction:
    """The largest multiple of 10**-9 whose square is at most x."""
    scale = 10**9
    root = math.isqrt(x.numerator * scale * scale // x.denominator)
    return Fraction(root, scale)


def question_budget(
    loc: Locates,
    i: int,
    raw: Mapping[str, Any],
    mechanism: str,
    share: Fraction,
    zcdp: bool,
) -> tuple[Fraction | None, Fraction | None]:
    """(ε, ρ) that one collection of the question spends."""
    if mechanism == "none":
        return None, None
    if mechanism == "gaussian":
        rho = share
        if rho > MAX_RHO:
            raise loc.error(i, None, f"this question's ρ {rho} is above the maximum {MAX_RHO}")
        return None, rho
    if not zcdp:
        return share, None
    if "epsilon" in raw:
        epsilon = exact_number(raw["epsilon"])
        if epsilon > MAX_EPSILON:
            raise loc.error(i, "epsilon", f"`epsilon` must be at most {MAX_EPSILON}")
        return epsilon, None
    # A pure question in a zCDP survey: the ε whose ε²/2 fits its ρ share.
    epsilon = sqrt_down(2 * share)
    if epsilon <= 0 or epsilon > MAX_EPSILON:
        raise loc.error(i, None, f"this question's ε ({epsilon}) must be in (0, {MAX_EPSILON}]")
    return epsilon, None


def with_epsilon(survey: Survey, epsilon: Fraction) -> Survey:
    """The same survey with its total rescaled to `epsilon`, every question's share in
    proportion: ε for a pure survey; for one composed under zCDP, the largest ρ that
    gives (ε, δ)-DP at the survey's δ."""
    if survey.total is None:
        raise ValueError("a survey with mechanism none has no budget to rescale")
    if survey.zcdp:
        assert survey.delta is not None
        new_total = zcdp_rho(epsilon, survey.delta)
    else:
        new_total = epsilon
    factor = new_total / survey.total
    questions = []
    for q in survey.tasked:
        share = q.share * factor
        if q.mechanism == "gaussian":
            eps, rho = None, share
        elif survey.zcdp:
            eps, rho = sqrt_down(2 * share), None
        else:
            eps, rho = share, None
        questions.append(replace(q, epsilon=eps, rho=rho, share=share))
    asked = len(survey.questions)
    return replace(
        survey,
        epsilon=None if survey.zcdp else new_total,
        rho=new_total if survey.zcdp else None,
        questions=tuple(questions[:asked]),
        breakdowns=tuple(questions[asked:]),
    )


def with_local_epsilon(survey: Survey, local_epsilon: Fraction) -> Survey:
    """The same survey with randomized response at ε_L on every question."""
    eps = parse_local_epsilon(local_epsilon)
    questions = tuple(replace(q, local_epsilon=eps) for q in survey.questions)
    by_id = {q.id: q for q in questions}
    breakdowns = []
    for b in survey.breakdowns:
        assert b.of is not None and b.by is not None
        if b.of.kind == "points":
            raise ValueError(
                f"breakdown {b.id!r} counts a points question, which takes no local_epsilon"
            )
        breakdowns.append(replace(b, of=by_id[b.of.id], by=by_id[b.by.id]))
    return replace(survey, questions=questions, breakdowns=tuple(breakdowns))


def text_mechanism_variant(survey: Survey) -> Survey | None:
    """The same survey with its text questions on the other mechanism (gaussian if they
    are pure, geometric if they are gaussian), for `veil survey plan` to show what the
    choice costs the other questions. None unless the survey mixes text and other
    questions under DP.

    The variant states the same ε (at the survey's δ, 10⁻⁶ unless it names one; a pure
    survey becomes zCDP at that (ε, δ), a zCDP one pure at the ε its ρ implies) and
    shares its total among the questions in the same proportions."""
    texts = [q for q in survey.questions if q.kind == "text"]
    if not texts or len(texts) == len(survey.questions) or survey.total is None:
        return None
    to = "geometric" if any(q.mechanism == "gaussian" for q in texts) else "gaussian"
    mechanisms = [to if q.kind == "text" else q.mechanism for q in survey.tasked]
    zcdp = "gaussian" in mechanisms
    delta = survey.delta or DEFAULT_DELTA
    if survey.zcdp == zcdp:
        total = survey.total
    elif zcdp:
        total = zcdp_rho(survey.total, delta)
    else:
        assert survey.rho is not None
        total = zcdp_epsilon(survey.rho, delta)
    factor = total / survey.total
    questions = []
    for q, mechanism in zip(survey.tasked, mechanisms, strict=True):
        share = q.share * factor
        if mechanism == "gaussian":
            eps, rho = None, share
        elif zcdp:
            eps, rho = sqrt_down(2 * share), None
        else:
            eps, rho = share, None
        questions.append(replace(q, mechanism=mechanism, epsilon=eps, rho=rho, share=share))
    return replace(
        survey,
        epsilon=None if zcdp else total,
        rho=total if zcdp else None,
        delta=delta if zcdp else None,
        questions=tuple(questions[: len(survey.questions)]),
        breakdowns=tuple(questions[len(survey.questions) :]),
    )
