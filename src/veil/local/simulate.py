"""Simulated respondents for demos and `veil simulate`.

Answers are drawn from fixed, mildly skewed distributions so that results
are recognisable; the truth (the exact aggregate) is computed from the same
answers, so estimates can be compared with it. Simulation randomness is not
secret, so a seeded ``random.Random`` is fine here.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from veil.survey import Question, Survey
from veil.survey.model import counted

Answers = Mapping[str, Any]  # question id -> answer, for one respondent

# What simulated respondents type to a text question, most common first: drawn
# with Zipf weights 1/k, beside answers each given by one respondent only.
TEXT_ANSWERS = (
    "vs code", "vim", "intellij", "emacs", "pycharm", "neovim", "sublime text", "notepad++",
    "xcode", "eclipse", "android studio", "nano", "helix", "zed", "visual studio", "jupyter",
    "rstudio", "spyder", "atom", "kate", "gedit", "textmate", "bbedit", "clion", "goland",
    "webstorm", "rider", "netbeans", "geany", "micro", "kakoune", "code::blocks", "brackets",
    "cursor", "fleet", "lapce", "thonny", "idle", "vscodium", "acme", "joe", "mcedit",
    "notepad", "wordpad", "ultraedit", "textpad", "komodo", "bluefish", "éditeur", "코드",
)  # fmt: skip
# The share of a text question's simulated respondents whose answer no one else gives.
TEXT_SINGLETON_SHARE = 0.05


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
    if question.kind == "points":
        # Split by weights that favour the first options; one respondent in five keeps
        # some points back. Rounded down, so the split never exceeds the total.
        weights = [rng.expovariate(1) / (1 + i / 2) for i in range(len(question.options))]
        spent = question.total if rng.random() < 0.8 else rng.randint(0, question.total)
        whole = sum(weights) or 1.0
        return {o: int(spent * w / whole) for o, w in zip(question.options, weights, strict=True)}
    return [
        min(
            question.max, max(0, round(rng.gauss(question.max * (0.3 + 0.2 * i), question.max / 5)))
        )
        for i in range(question.length)
    ]


def simulate_respondents(survey: Survey, n: int, rng: random.Random) -> list[dict[str, Any]]:
    out = [
        {q.id: simulate_answer(q, rng) for q in survey.questions if q.kind != "text"}
        for _ in range(n)
    ]
    for q in survey.questions:
        if q.kind == "text":
            for respondent, text in zip(out, simulate_text_answers(q, n, rng), strict=True):
                respondent[q.id] = text
    return out


def simulate_text_answers(
    question: Question, n: int, rng: random.Random, singletons: int | None = None
) -> list[str]:
    """n answers to a text question: `singletons` (default 5% of n) each given once,
    the others drawn from `TEXT_ANSWERS` with Zipf weights 1/k (those that fit in
    max_bytes), shuffled."""
    vocabulary = [a for a in TEXT_ANSWERS if len(a.encode()) <= question.max_bytes]
    once = round(n * TEXT_SINGLETON_SHARE) if singletons is None else singletons
    length = min(8, question.max_bytes)
    letters = "abcdefghijklmnopqrstuvwxyz"
    if not vocabulary or once > n or once > len(letters) ** length // 2:
        raise ValueError(f"cannot simulate {n} answers to text question {question.id!r}")
    given_once: set[str] = set()
    while len(given_once) < once:
        word = "".join(rng.choice(letters) for _ in range(length))
        if word not in vocabulary:
            given_once.add(word)
    weights = [1 / (k + 1) for k in range(len(vocabulary))]
    answers = rng.choices(vocabulary, weights, k=n - once) + sorted(given_once)
    rng.shuffle(answers)
    return answers


def truth(question: Question, answers: Sequence[Answers]) -> int | list[int]:
    """The exact aggregate the collector estimates, in Prio3's output terms:
    a count, a sum, per-option (or a breakdown's per-cell) counts or
    per-coordinate sums."""
    if question.kind == "text":
        raise ValueError("a text question's truth is each answer's count (veil.local.demo)")
    if question.kind == "breakdown" and question.of is not None and counted(question):
        # Its reports carry randomized bits and a count; the collector estimates the
        # cells of true answers (each group's sums), as an uncounted breakdown's.
        question = replace(question, of=replace(question.of, local_epsilon=None))
    measurements = [question.measurement_from(a) for a in answers]
    if question.kind in ("yes_no", "integer"):
        return sum(int(m) for m in measurements)
    if question.kind == "choice" or question.vdaf_type == "histogram":
        # One answer (a choice's option, a breakdown's cell) a report.
        counts = [0] * len(question.element_labels())
        for m in measurements:
            counts[m] += 1
        return counts
    return [sum(int(x) for x in column) for column in zip(*measurements, strict=True)]
