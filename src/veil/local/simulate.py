"""Simulated respondents for demos and `veil simulate`.

Answers are drawn from fixed, mildly skewed distributions so that results
are recognisable; the truth (the exact aggregate) is computed from the same
answers, so estimates can be compared with it. Simulation randomness is not
secret, so a seeded ``random.Random`` is fine here.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from veil.survey import Question, Survey

Answers = Mapping[str, Any]  # question id -> answer, for one respondent


def simulate_answer(question: Question, rng: random.Random) -> Any:
    if question.kind == "yes_no":
        return rng.random() < 0.35
    if question.kind == "integer":
        # Triangular around 40% of the range: a mean that is not the midpoint.
        return min(question.max, max(0, round(rng.triangular(0, question.max, 0.2 * question.max))))
    if question.kind == "choice":
        weights = [1 / (i + 1) for i in range(len(question.options))]
        return rng.choices(question.options, weights)[0]
    if question.kind == "multi_choice":
        chosen = [o for i, o in enumerate(question.options) if rng.random() < 0.6 / (1 + i / 2)]
        return chosen[: question.max_choices]
    return [
        min(
            question.max, max(0, round(rng.gauss(question.max * (0.3 + 0.2 * i), question.max / 5)))
        )
        for i in range(question.length)
    ]


def simulate_respondents(survey: Survey, n: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{q.id: simulate_answer(q, rng) for q in survey.questions} for _ in range(n)]


def truth(question: Question, answers: Sequence[Answers]) -> int | list[int]:
    """The exact aggregate the collector estimates, in Prio3's output terms:
    a count, a sum, per-option counts or per-coordinate sums."""
    measurements = [question.to_measurement(a[question.id]) for a in answers]
    if question.kind in ("yes_no", "integer"):
        return sum(int(m) for m in measurements)
    if question.kind == "choice":
        counts = [0] * len(question.options)
        for m in measurements:
            counts[m] += 1
        return counts
    return [sum(int(x) for x in column) for column in zip(*measurements, strict=True)]
