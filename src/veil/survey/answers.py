"""A respondent's answer to one question as the measurement its task
takes (`Question.to_measurement`), or an AnswerError saying what is allowed."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from veil.survey.text import TextAnswerError, encode_text_answer


class Question(Protocol):
    """What of a question (`veil.survey.model.Question`) its answers are
    read against."""

    @property
    def id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def max(self) -> int: ...
    @property
    def options(self) -> tuple[str, ...]: ...
    @property
    def max_choices(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def case_sensitive(self) -> bool: ...
    @property
    def total(self) -> int: ...
    @property
    def add_remove(self) -> bool: ...
    def allowed(self) -> str: ...


class AnswerError(ValueError):
    """A respondent's answer does not fit its question; the message names the
    question, the answer given and what is allowed."""


YES_NO = {"yes": 1, "no": 0, "true": 1, "false": 0, "y": 1, "n": 0}


def _refuse(q: Question, answer: Any, why: str = "") -> AnswerError:
    return AnswerError(
        f"question {q.id!r}: {answer!r} is not an allowed answer{why}; give {q.allowed()}"
    )


def measurement(q: Question, answer: Any) -> Any:
    """A respondent's answer in the question's terms (yes/no, a number, an
    option name, a list of option names, a list of numbers) as the Prio3
    measurement. Raises AnswerError naming the question, the answer and
    what is allowed. A points answer (a mapping of option names to points, a
    list in option order, or "a:40, b:60") becomes one entry per option, refused
    when they add up to more than the total. A text answer is normalised and
    becomes its 8·max_bytes bits (`veil.survey.text`). Under add_remove a
    yes/no answer is the index of a two-bucket histogram (no, yes), and a
    number, a list of options or a vector gets a last element 1 that counts
    the report."""
    if q.kind == "points":
        return _points(q, answer)
    if q.kind == "text":
        try:
            return encode_text_answer(answer, q.max_bytes, q.case_sensitive).measurement
        except TextAnswerError as e:
            raise AnswerError(f"question {q.id!r}: {e}; give {q.allowed()}") from e
    measurement = _plain(q, answer)
    if not q.add_remove or q.kind in ("yes_no", "choice"):
        return measurement
    if q.kind == "integer":
        return [measurement, 1]
    if q.kind == "multi_choice":
        return [*measurement, True]
    return [*measurement, 1]


def _plain(q: Question, answer: Any) -> Any:
    if q.kind == "yes_no":
        if isinstance(answer, str) and answer.strip().lower() in YES_NO:
            return YES_NO[answer.strip().lower()]
        if not isinstance(answer, bool):
            raise _refuse(q, answer, " (not a bool)")
        return int(answer)
    if q.kind == "integer":
        return _number(q, answer, answer)
    if q.kind == "choice":
        if not isinstance(answer, str) or answer not in q.options:
            raise AnswerError(
                f"question {q.id!r}: {answer!r} is not one of the options; give {q.allowed()}"
            )
        return q.options.index(answer)
    if not isinstance(answer, (list, tuple)):
        raise _refuse(q, answer, " (not a list)")
    if q.kind == "multi_choice":
        unknown = [a for a in answer if not isinstance(a, str) or a not in q.options]
        if unknown:
            raise _refuse(q, answer, f" ({unknown[0]!r} is not one of the options)")
        if len(set(answer)) != len(answer):
            raise _refuse(q, answer, " (an option is named twice)")
        if len(answer) > q.max_choices:
            raise _refuse(q, answer, f" ({len(answer)} options chosen)")
        chosen = set(answer)
        return [option in chosen for option in q.options]
    if len(answer) != q.length:
        raise _refuse(q, answer, f" ({len(answer)} numbers)")
    return [_number(q, v, answer) for v in answer]


def _number(q: Question, value: Any, answer: Any, top: int | None = None) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*\d{1,30}\s*", value):
        value = int(value)
    top = q.max if top is None else top
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise _refuse(q, answer)
    return value


def _points(q: Question, answer: Any) -> list[int]:
    """A points answer as its measurement, one entry per option: from a mapping of
    option names to points (an option left out gets 0), a list of one number per
    option in order, or the text form `parse_points` reads."""
    if isinstance(answer, str):
        try:
            answer = parse_points(answer, q.options)
        except ValueError as e:
            raise _refuse(q, answer, f" ({e})") from None
    if isinstance(answer, Mapping):
        unknown = [k for k in answer if not isinstance(k, str) or k not in q.options]
        if unknown:
            raise _refuse(q, answer, f" ({unknown[0]!r} is not one of the options)")
        values = [answer.get(option, 0) for option in q.options]
    elif isinstance(answer, (list, tuple)):
        if len(answer) != len(q.options):
            why = f" ({len(answer)} numbers for {len(q.options)} options)"
            raise _refuse(q, answer, why)
        values = list(answer)
    else:
        raise _refuse(q, answer, " (not a mapping of options to points)")
    points = [_number(q, v, answer, q.total) for v in values]
    if sum(points) > q.total:
        raise AnswerError(
            f"question {q.id!r}: the points add up to {sum(points)}, over the total of"
            f" {q.total}; take {sum(points) - q.total} off"
        )
    return points


def parse_points(text: str, options: Sequence[str]) -> dict[str, int] | list[str]:
    """A points answer as typed: comma-separated option:points pairs ("a:40, b:60"; an
    option's name may hold ':', the points follow the last one), or one number per
    option in order ("40, 60, 0"). Raises ValueError on a repeated option; the names
    and numbers are checked by `measurement`."""
    parts = [p.strip() for p in text.split(",")]
    if all(":" not in p for p in parts):
        return parts
    pairs: dict[str, int] = {}
    for part in parts:
        if not part:
            continue
        name, sep, value = part.rpartition(":")
        name, value = name.strip(), value.strip()
        if not sep or not re.fullmatch(r"\d{1,30}", value):
            raise ValueError(f"{part!r} is not option:points")
        if name.isdigit() and name not in options and 1 <= int(name) <= len(options):
            name = options[int(name) - 1]  # an option by its number, as the terminal lists them
        if name in pairs:
            raise ValueError(f"{name!r} is given twice")
        pairs[name] = int(value)
    return pairs
