"""The privacy statement of a task or a survey: what is protected, from whom, how much.

`privacy_statement(task_or_survey)` gives a `veil.dp.accounting.PrivacyStatement`
(JSON with `to_json()`, plain words with `lines()`), which `veil task new`,
`veil survey deploy`, `veil status` and survey reports show.

How the numbers follow from what the ledgers enforce:

- A task's ledgers charge each collection the weaker of its two guarantees
  (`NoisePlan.charge`: ε against the collector with one aggregator, which is more
  than ε in split mode; ρ for the gaussian mechanism), and never let the charges on
  any one report exceed the task's budget B. So against the collector with one
  aggregator the task is B-DP (or B-zCDP); against the collector alone, where a
  collection costs only ε, it is B · ε / charge.
- A survey's ledgers bound the sum of its tasks' losses by its total S (ρ when it is
  composed under zCDP, with ε²/2 for a pure task), so S holds against both; against
  the collector alone the sum of the tasks' collector guarantees may be smaller.
- Against everyone, both aggregators included, only a local layer protects (a task's
  `local_epsilon`, veil.dp.local): each report's value is randomized on the
  respondent's device, ε_L-LDP, once, and everything anyone sees afterwards is a
  function of the randomized reports. So a task states ε_L against everyone however
  many collections it has, and a survey the sum of its questions' ε_L (basic
  composition over the reports of one respondent), only when every question has one.
  The results are then also ε_L-DP against the collector (post-processing): with
  mechanism none that is the only guarantee, and it is the one stated.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from veil.dp.accounting import (
    DEFAULT_DELTA,
    Guarantee,
    Neighbouring,
    PrivacyStatement,
    decimal_text,
)
from veil.survey.model import Question, Survey
from veil.survey.tasks import question_task
from veil.task import DpSpec, Task, VdafSpec

__all__ = [
    "guess_rate",
    "privacy_statement",
    "public_sentences",
    "survey_statement",
    "task_statement",
]

TASK_UNIT = "one report"
SURVEY_UNIT = "one report per question (no invitations: one person may send many)"
INVITED_UNIT = "one respondent: one invitation, at most one report per question"

_UNINVITED_NOTE = (
    "Without invitations nothing limits a person to one answer: the guarantee is per "
    "report, and a person who sends k reports to a question is protected as k "
    "respondents would be (k times the loss). Require invitations "
    "(invitations = true) to make the unit one respondent."
)

_INVITED_NOTE = (
    "Invitations: each invitation is redeemed once for one anonymous token per "
    "question (blind RSA signatures), and both aggregators refuse a report without a "
    "valid unspent token, so the survey's guarantee holds per respondent. The issuer "
    "cannot link a token to its invitation, nor the aggregators a respondent's reports "
    "across questions through tokens; what stays linkable is timing and network "
    "address (when an invitation was redeemed and reports arrived, and from where)."
)

_SPLIT_NOTE = (
    "Split mode: each aggregator adds only part of the noise, so the collector with one "
    "aggregator learns more than the collector alone; the ledgers charge that weaker "
    "guarantee."
)


_ADD_REMOVE_NOTE = (
    "Add/remove neighbouring: the collector is never told the exact number of reports, "
    "only noisy sums, so whether someone took part is protected against the collector. "
    "Each aggregator still sees how many reports arrive (and what the network shows of "
    "who sent them): against the collector with one aggregator, values are protected "
    "but taking part is not."
)


_FLOOR_NOTE = (
    "The batch floor is public: whether a batch held at least min_batch_size valid "
    "reports (and no more than the task can sum) is told exactly, not with noise. Under "
    "add/remove neighbouring it is told once per batch: a batch that falls short is "
    "refused after it is closed, and stays closed."
)


def _guarantee(amount: Fraction, zcdp: bool, delta: Fraction) -> Guarantee:
    return Guarantee.zcdp(amount, delta) if zcdp else Guarantee.pure(amount)


def _neighbouring(dp: DpSpec) -> Neighbouring:
    return Neighbouring(dp.neighbouring)


def _task_totals(dp: DpSpec, vdaf: VdafSpec) -> tuple[Fraction, Fraction] | None:
    """(against the collector, against the collector with one aggregator) in task units."""
    plan = dp.plan(vdaf)
    charge = plan.charge
    total = dp.total(vdaf)
    if charge is None or total is None:
        return None
    per_collection = plan.config.rho if plan.config.rho is not None else plan.epsilon
    assert per_collection is not None
    return total * per_collection / charge, total


def _local_note(epsilon: Fraction) -> str:
    return (
        f"Each report's value is randomized on the respondent's device before it is "
        f"shared (local randomized response, ε_L = {decimal_text(epsilon)}): what anyone "
        "sees, both aggregators together included, is ε_L-DP in that value (not in the "
        "report's existence or time, which the aggregators see)."
    )


def task_statement(
    dp: DpSpec, vdaf: VdafSpec, noise_added_by: tuple[str, ...] = ("leader", "helper")
) -> PrivacyStatement:
    """The statement of one task over its whole budget; `noise_added_by` the
    aggregator roles that add noise (`Task.noise_added_by`)."""
    statement = _task_statement(dp, vdaf)
    if len(noise_added_by) != 1 or statement.against_collector.is_none:
        return statement
    (noising,) = noise_added_by
    (silent,) = {"leader", "helper"} - {noising}
    # Only veil's aggregator adds noise, the whole of it (independent mode): the
    # collector and the other implementation's aggregator know none of it, so
    # they hold the task's guarantee; the collector with veil's aggregator knows
    # all of it and learns the exact aggregates.
    note = (
        f"Only the {noising} (veil) adds noise; the {silent} runs another DAP implementation,"
        f" which adds none. The {noising} adds the whole noise, so the guarantee against the"
        f" collector is unchanged, and holds against the collector together with the"
        f" {silent}; the collector together with the {noising} learns the exact aggregates."
    )
    return replace(
        statement,
        against_collector_and_one_aggregator=Guarantee.no_privacy(),
        charged="against_collector",
        noise_added_by=noise_added_by,
        notes=(note, *statement.notes),
    )


def _task_statement(dp: DpSpec, vdaf: VdafSpec) -> PrivacyStatement:
    totals = _task_totals(dp, vdaf)
    local = None if dp.local(vdaf) is None else Fraction(dp.local_epsilon or 0)
    if totals is None:
        if local is not None:
            # No servers' noise: the local layer is all there is, against anyone.
            only = Guarantee.pure(local)
            return PrivacyStatement(
                TASK_UNIT, _neighbouring(dp), only, only, only, notes=(_local_note(local),)
            )
        nothing = Guarantee.no_privacy()
        return PrivacyStatement(TASK_UNIT, _neighbouring(dp), nothing, nothing)
    zcdp = dp.unit == "rho"
    collector, one_aggregator = totals
    plan = dp.plan(vdaf)
    notes = (_SPLIT_NOTE,) if plan.config.mode.value == "split" else ()
    if dp.neighbouring == "add_remove":
        notes = (*notes, _ADD_REMOVE_NOTE)
    notes = (*notes, _FLOOR_NOTE)
    if local is not None:
        notes = (*notes, _local_note(local))
    return PrivacyStatement(
        TASK_UNIT,
        _neighbouring(dp),
        _guarantee(collector, zcdp, dp.delta_value),
        _guarantee(one_aggregator, zcdp, dp.delta_value),
        None if local is None else Guarantee.pure(local),
        notes=notes,
    )


def _survey_local(survey: Survey) -> tuple[Guarantee | None, list[str]]:
    """(against everyone, notes): the sum of the questions' ε_L when all have one."""
    local = [(q.id, q.local_epsilon) for q in survey.questions if q.local_epsilon is not None]
    if not local:
        return None, []
    listed = ", ".join(f"{qid} (ε_L = {decimal_text(eps)})" for qid, eps in local)
    total = sum((eps for _, eps in local), Fraction(0))
    if len(local) == len(survey.questions):
        return Guarantee.pure(total), [
            f"Every answer is randomized on the respondent's device before it is shared "
            f"(local randomized response: {listed}), so against everyone a respondent's "
            f"answers together are ε_L = {decimal_text(total)}-DP (their sum)."
        ]
    return None, [
        f"Except the answers to {listed}: they are randomized on the respondent's device "
        f"and stay private even against both aggregators colluding (together ε_L = "
        f"{decimal_text(total)}); the other questions' answers are not protected against that."
    ]


def _one_checker_note(role: str) -> str:
    other = "helper" if role == "leader" else "leader"
    return (
        f"Over DAP with another implementation as the {other}, only veil's {role} checks "
        f"tokens (DAP has none, and the token rides in the {role}'s own share, which the "
        f"{other} never sees): the guarantee per respondent rests on the {role} alone, "
        "which, were it to let reports without a valid unspent token through, would let "
        "one person answer a question many times."
    )


def survey_statement(
    survey: Survey, token_checkers: tuple[str, ...] = ("leader", "helper")
) -> PrivacyStatement:
    """The statement of a survey over its total budget (every question composed);
    `token_checkers`, the aggregator roles that check invitation tokens (both,
    unless another DAP implementation runs one: `Task.noise_added_by`, veil's)."""
    statement = _survey_statement(survey)
    unit = INVITED_UNIT if survey.invitations else SURVEY_UNIT
    note = _INVITED_NOTE if survey.invitations else _UNINVITED_NOTE
    notes = (*statement.notes, note)
    if survey.invitations and len(token_checkers) == 1:
        notes = (*notes, _one_checker_note(token_checkers[0]))
    return replace(statement, unit=unit, notes=notes)


def _survey_statement(survey: Survey) -> PrivacyStatement:
    total = survey.total
    neighbouring = Neighbouring(survey.neighbouring)
    everyone, local_notes = _survey_local(survey)
    if total is None:
        if everyone is not None:
            # No servers' noise: the local layer is all there is, against anyone.
            return PrivacyStatement(
                SURVEY_UNIT, neighbouring, everyone, everyone, everyone, notes=tuple(local_notes)
            )
        nothing = Guarantee.no_privacy()
        return PrivacyStatement(SURVEY_UNIT, neighbouring, nothing, nothing)
    delta = survey.delta or DEFAULT_DELTA
    # Surveys use independent noise, so both guarantees are the survey total.
    guarantee = _guarantee(total, survey.zcdp, delta)
    notes = []
    if survey.zcdp and any(q.mechanism != "gaussian" for q in survey.questions):
        notes.append(
            "The survey mixes pure ε-DP and zCDP questions and is composed under zCDP: "
            "a pure question of ε counts as ρ = ε²/2."
        )
    if survey.neighbouring == "add_remove":
        notes.append(_ADD_REMOVE_NOTE)
    notes.append(_FLOOR_NOTE)
    notes.extend(local_notes)
    notes.extend(text_note(survey, q) for q in survey.questions if q.kind == "text")
    notes.extend(points_note(survey, q) for q in survey.questions if q.kind == "points")
    return PrivacyStatement(
        SURVEY_UNIT, neighbouring, guarantee, guarantee, everyone, notes=tuple(notes)
    )


def text_note(survey: Survey, q: Question) -> str:
    """What a text question spends and releases, in words: its budget over its byte
    levels, each level's sensitivity, the threshold and the probability that an
    answer given by one respondent is released (`veil.dp.heavy_hitters`)."""
    plan = q.heavy_hitters()
    threshold = q.release_threshold(survey.expected_respondents)
    sensitivity = plan.level_plan.sensitivity
    how = {
        "target": "the least keeping that chance small",
        "threshold": "the survey's `threshold`",
        "min_share": f"`min_share` {decimal_text(q.min_share or Fraction(0))} of the"
        f" {survey.expected_respondents or 0:,} expected respondents",
    }[threshold.source]
    return (
        f"Text question {q.id!r}: {plan.note()} Under {plan.neighbouring.value} neighbouring a "
        f"level's counts move by L1 = {sensitivity.l1} (L2² = {sensitivity.l2_squared}). An "
        f"answer is released only if its noisy count reaches {threshold.value} ({how}), so an "
        "answer given by one respondent is released with probability at most "
        f"{threshold.release_probability:.2g}."
    )


def points_note(survey: Survey, q: Question) -> str:
    """How far one respondent moves a points question's totals, in words: the proof
    bounds the sum of a split, not each option, so the noise is scaled to the L1 ball
    of the total (`veil.dp.sensitivities`), not to every option at the total."""
    vdaf, dp, _ = question_task(survey, q)
    sensitivity = dp.plan(vdaf).sensitivity
    return (
        f"Points question {q.id!r}: each respondent splits at most {q.total} points, which both"
        f" aggregators check in zero knowledge, so under {survey.neighbouring} neighbouring one"
        f" respondent moves its options' totals by L1 = {sensitivity.l1} in all (L2² ="
        f" {sensitivity.l2_squared}), whatever the number of options."
    )


def privacy_statement(subject: Task | Survey) -> PrivacyStatement:
    """The statement of a task (over its budget) or a survey (over its total)."""
    if isinstance(subject, Survey):
        return survey_statement(subject)
    return task_statement(subject.dp, subject.vdaf, subject.noise_added_by)


# --------------------------------------------------------------------------- for the public


def guess_rate(g: Guarantee) -> float:
    """The most often anyone who sees what `g` covers tells which of two answers a
    person gave, when both are equally likely beforehand: (e^ε + δ) / (1 + e^ε).

    Under (ε, δ)-DP a test that says "the first" on a set A of outcomes is right with
    probability ½(P₁(A) + 1 - P₂(A)), and P₁(A) <= e^ε P₂(A) + δ and
    1 - P₂(A) <= e^ε (1 - P₁(A)) + δ bound it by this; it is 1 without DP.
    """
    if g.epsilon is None:
        return 1.0
    if g.epsilon > 700:  # e^ε overflows a float: the guess is right every time
        return 1.0
    odds = math.exp(float(g.epsilon))
    return min(1.0, (odds + float(g.delta or 0)) / (1 + odds))


def _percent(rate: float) -> str:
    """A share rounded up (an upper bound stays one), to a tenth of a percent or as many
    more digits as keep it below 100%: 73.2%, 99.996%."""
    for digits in range(1, 7):
        value = math.ceil(rate * 100 * 10**digits) / 10**digits
        if value < 100:
            return f"{value:.{digits}f}".rstrip("0").rstrip(".") + "%"
    return "100%"


def public_sentences(survey: Survey) -> tuple[str, ...]:
    """The survey's privacy statement in two or three sentences a respondent
    understands: what one person's answers can change in what is published, who
    could see what, and what the unit is. Computed from `survey_statement`'s
    guarantees (the exact statement, for auditors, is its `lines()`)."""
    statement = survey_statement(survey)
    g = statement.against_collector
    yours = "your answers" if survey.invitations else "the answers you send"
    out: list[str] = []
    if g.is_none:
        out.append(
            "No noise is added to this survey's results: the published totals are exact, so"
            f" a total over few people can show {yours}."
        )
    else:
        out.append(
            "Only totals with noise added are published. Whatever you answer, they come out"
            " so nearly the same that someone who sees every result and knows everyone"
            " else's answers, trying to tell which of two answers you gave, is right at"
            f" most {_percent(guess_rate(g))} of the time (a blind guess: 50%)."
        )
    everyone = statement.against_everyone
    local = [q for q in survey.questions if q.local_epsilon is not None]
    if everyone is not None and not everyone.is_none:
        pooled = (
            "which could not be sure of them even by pooling their shares (each answer is"
            " randomized on your device first: they would be right at most"
            f" {_percent(guess_rate(everyone))} of the time)"
        )
    elif local:
        pooled = (
            "which could read them only by pooling their shares (and even then not your"
            " answers to "
            + ", ".join(repr(q.text) for q in local)
            + ", randomized on your device first)"
        )
    else:
        pooled = "which could read them only by pooling their shares"
    out.append(
        "Your answers leave your device split into two encrypted shares, one for each of two"
        f" separate organisations, {pooled}; each organisation sees when answers arrive, and"
        " from where, and the survey's organiser sees only the totals."
    )
    unit = (
        "Each invitation answers once, so this holds for you as a person."
        if survey.invitations
        else "Nothing limits a person to one set of answers: someone who sends several is"
        " protected less, as that many people together would be."
    )
    texts = [q for q in survey.questions if q.kind == "text"]
    if texts and not g.is_none:
        most = max(
            q.release_threshold(survey.expected_respondents).release_probability for q in texts
        )
        unit += (
            " A typed answer is published only when many people give the same one: one that"
            f" only you give is published with a chance of at most {most:.2g}."
        )
    out.append(unit)
    return tuple(out)
