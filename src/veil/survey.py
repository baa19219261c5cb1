"""Survey files: several questions over the same respondents, one task each.

A survey is a TOML file with a ``[survey]`` table (name, total ε, DP
mechanism, batch settings) and one ``[[question]]`` table per question. Each
question kind maps to a Prio3 type:

=============  =========================  ======================================
kind           measurement                Prio3 type
=============  =========================  ======================================
yes_no         bool                       Prio3Count
integer        int in [0, max]            Prio3Sum(max); the mean uses the count
choice         one of ``options``         Prio3Histogram(len(options))
multi_choice   up to ``max_choices``      Prio3MultihotCountVec
vector         ``length`` ints in [0,max] Prio3SumVec
=============  =========================  ======================================

The survey's total ε is divided among the questions by sequential
composition: ``epsilon`` on a question takes that much, the rest is shared
in proportion to ``weight`` (default 1). Every error names the file, the
line and what to change.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from veil.vdaf import (
    Field,
    Field64,
    Field128,
    Prio3,
    Prio3Count,
    Prio3Histogram,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
)

KINDS = ("yes_no", "integer", "choice", "multi_choice", "vector")
MECHANISMS = ("geometric", "laplace", "gaussian", "none")
MAX_EPSILON = Fraction(20)


class SurveyError(ValueError):
    """A survey file is malformed; the message says where and what to change."""


def optimal_chunk_length(meas_len: int) -> int:
    """ParallelSum chunk length minimising proof size: about sqrt(MEAS_LEN)."""
    return max(1, math.isqrt(meas_len))


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    kind: str
    epsilon: Fraction
    max: int = 0
    options: tuple[str, ...] = ()
    max_choices: int = 0
    length: int = 0

    @property
    def vdaf_type(self) -> str:
        return {
            "yes_no": "count",
            "integer": "sum",
            "choice": "histogram",
            "multi_choice": "multihot",
            "vector": "sumvec",
        }[self.kind]

    @property
    def vdaf_params(self) -> dict[str, int]:
        """Parameters of the Prio3 type, named as in the draft."""
        if self.kind == "yes_no":
            return {}
        if self.kind == "integer":
            return {"max_measurement": self.max}
        if self.kind == "choice":
            n = len(self.options)
            return {"length": n, "chunk_length": optimal_chunk_length(n)}
        if self.kind == "multi_choice":
            n = len(self.options)
            return {
                "length": n,
                "max_weight": self.max_choices,
                "chunk_length": optimal_chunk_length(n + self.max_choices.bit_length()),
            }
        bits = self.max.bit_length()
        return {
            "length": self.length,
            "max_measurement": self.max,
            "chunk_length": optimal_chunk_length(self.length * bits),
        }

    def vdaf(self) -> Prio3[Any, Any]:
        p = self.vdaf_params
        if self.kind == "yes_no":
            return Prio3Count(2)
        if self.kind == "integer":
            return Prio3Sum(2, p["max_measurement"])
        if self.kind == "choice":
            return Prio3Histogram(2, p["length"], p["chunk_length"])
        if self.kind == "multi_choice":
            return Prio3MultihotCountVec(2, p["length"], p["max_weight"], p["chunk_length"])
        return Prio3SumVec(2, p["length"], p["max_measurement"], p["chunk_length"])

    def to_measurement(self, answer: Any) -> Any:
        """A respondent's answer in the question's terms (a bool, an option
        name, a list of option names) as the Prio3 measurement."""
        if self.kind == "yes_no":
            if not isinstance(answer, bool):
                raise ValueError(f"question {self.id!r} takes yes/no (a bool), got {answer!r}")
            return int(answer)
        if self.kind == "choice":
            if answer not in self.options:
                raise ValueError(f"question {self.id!r}: {answer!r} is not one of {self.options}")
            return self.options.index(answer)
        if self.kind == "multi_choice":
            chosen = set(answer)
            unknown = chosen - set(self.options)
            if unknown:
                raise ValueError(f"question {self.id!r}: unknown options {sorted(unknown)}")
            return [option in chosen for option in self.options]
        return answer


@dataclass(frozen=True)
class Survey:
    name: str
    epsilon: Fraction
    mechanism: str
    min_batch_size: int
    max_respondents: int
    questions: tuple[Question, ...]
    path: str = "<string>"

    def question(self, question_id: str) -> Question:
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(question_id)


class _Locator:
    """Finds the line of a key in a question table, for error messages
    (tomllib reports no positions for valid TOML)."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()
        self.question_starts = [
            i for i, line in enumerate(self.lines) if line.strip().startswith("[[question]]")
        ]
        self.survey_start = next(
            (i for i, line in enumerate(self.lines) if line.strip() == "[survey]"), None
        )

    def _section(self, start: int | None) -> range:
        if start is None:
            return range(0)
        end = len(self.lines)
        for i in range(start + 1, len(self.lines)):
            if self.lines[i].lstrip().startswith("["):
                end = i
                break
        return range(start, end)

    def line_of(self, question: int | None, key: str | None) -> int:
        start = self.survey_start if question is None else self.question_starts[question]
        section = self._section(start)
        if key is not None:
            pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
            for i in section:
                if pattern.match(self.lines[i]):
                    return i + 1
        return (section.start + 1) if section else 1

    def error(self, question: int | None, key: str | None, message: str) -> SurveyError:
        return SurveyError(f"{self.path}:{self.line_of(question, key)}: {message}")


def _fraction(value: Any) -> Fraction:
    if isinstance(value, bool):
        raise ValueError("not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not finite")
        return Fraction(str(value))
    if isinstance(value, (int, str)):
        return Fraction(value)
    raise ValueError("not a number")


def _positive_int(loc: _Locator, q: int, table: Mapping[str, Any], key: str, upper: int) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise loc.error(q, key, f"`{key}` must be a positive integer, got {value!r}")
    if value > upper:
        raise loc.error(q, key, f"`{key}` = {value} does not fit: at most {upper} is supported")
    return value


def parse_survey(text: str, path: str = "<string>") -> Survey:
    """Parse and validate a survey; raises ``SurveyError``."""
    loc = _Locator(path, text)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SurveyError(f"{path}: not valid TOML: {e}") from e
    head = doc.get("survey")
    if not isinstance(head, dict):
        raise SurveyError(f"{path}:1: missing [survey] table (name, epsilon)")
    unknown_top = set(doc) - {"survey", "question"}
    if unknown_top:
        raise SurveyError(
            f"{path}: unknown tables {sorted(unknown_top)}; use [survey] and [[question]]"
        )

    try:
        total = _fraction(head.get("epsilon"))
    except (ValueError, ZeroDivisionError) as e:
        raise loc.error(None, "epsilon", f"survey `epsilon` must be a number: {e}") from None
    if not 0 < total <= MAX_EPSILON:
        raise loc.error(None, "epsilon", f"survey `epsilon` must be in (0, 20], got {total}")
    mechanism = head.get("mechanism", "geometric")
    if mechanism not in MECHANISMS:
        raise loc.error(
            None, "mechanism", f"unknown mechanism {mechanism!r}; use one of {MECHANISMS}"
        )
    min_batch = head.get("min_batch_size", 100)
    if isinstance(min_batch, bool) or not isinstance(min_batch, int) or min_batch < 1:
        raise loc.error(None, "min_batch_size", "`min_batch_size` must be a positive integer")

    max_respondents = head.get("max_respondents", 1_000_000)
    if (
        isinstance(max_respondents, bool)
        or not isinstance(max_respondents, int)
        or not (1 <= max_respondents <= 10**12)
    ):
        raise loc.error(None, "max_respondents", "`max_respondents` must be in [1, 10^12]")

    raw_questions = doc.get("question")
    if not isinstance(raw_questions, list) or not raw_questions:
        raise SurveyError(f"{path}: a survey needs at least one [[question]] table")

    seen: set[str] = set()
    explicit: dict[int, Fraction] = {}
    weights: dict[int, Fraction] = {}
    for i, raw in enumerate(raw_questions):
        qid = raw.get("id")
        if not isinstance(qid, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", qid):
            raise loc.error(i, "id", "each question needs an `id` of letters, digits, _ or -")
        if qid in seen:
            raise loc.error(i, "id", f"question id {qid!r} is used twice")
        seen.add(qid)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise loc.error(i, "kind", f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        if "epsilon" in raw and "weight" in raw:
            raise loc.error(i, "epsilon", "give a question `epsilon` or a `weight`, not both")
        try:
            if "epsilon" in raw:
                explicit[i] = _fraction(raw["epsilon"])
            else:
                weights[i] = _fraction(raw.get("weight", 1))
        except (ValueError, ZeroDivisionError) as e:
            key = "epsilon" if "epsilon" in raw else "weight"
            raise loc.error(i, key, f"`{key}` must be a number: {e}") from None
        if i in explicit and explicit[i] <= 0:
            raise loc.error(i, "epsilon", "a question's `epsilon` must be positive")
        if i in weights and weights[i] <= 0:
            raise loc.error(i, "weight", "a question's `weight` must be positive")

    fixed = sum(explicit.values(), Fraction(0))
    if fixed > total or (fixed == total and weights):
        first = min(explicit)
        raise loc.error(
            first,
            "epsilon",
            f"question epsilons add up to {fixed}, which overspends the survey's "
            f"epsilon {total}" + (" and leaves nothing for weighted questions" if weights else ""),
        )
    remaining = total - fixed
    weight_sum = sum(weights.values(), Fraction(0))

    questions = []
    for i, raw in enumerate(raw_questions):
        eps = explicit[i] if i in explicit else remaining * weights[i] / weight_sum
        questions.append(_question(loc, i, raw, eps, max_respondents))
    return Survey(
        name=str(head.get("name", Path(path).stem)),
        epsilon=total,
        mechanism=mechanism,
        min_batch_size=min_batch,
        max_respondents=max_respondents,
        questions=tuple(questions),
        path=path,
    )


def _max_fitting(field: type[Field], respondents: int) -> int:
    """Largest per-report maximum whose total over ``respondents`` reports
    stays below a quarter of the field (the rest is headroom for noise and
    the centred lift, which reads values above p/2 as negative)."""
    return (field.MODULUS // 4) // respondents


def _question(
    loc: _Locator, i: int, raw: Mapping[str, Any], epsilon: Fraction, respondents: int
) -> Question:
    kind = raw["kind"]
    allowed = {"id", "text", "kind", "epsilon", "weight"} | {
        "yes_no": set(),
        "integer": {"max"},
        "choice": {"options"},
        "multi_choice": {"options", "max_choices"},
        "vector": {"length", "max"},
    }[kind]
    for key in raw:
        if key not in allowed:
            raise loc.error(i, key, f"`{key}` is not a setting of a {kind} question")
    text = str(raw.get("text", raw["id"]))
    common = {"id": raw["id"], "text": text, "kind": kind, "epsilon": epsilon}
    if kind == "yes_no":
        return Question(**common)
    if kind == "integer":
        return Question(
            **common, max=_positive_int(loc, i, raw, "max", _max_fitting(Field64, respondents))
        )
    if kind == "vector":
        length = _positive_int(loc, i, raw, "length", 100_000)
        top = _max_fitting(Field128, respondents)
        return Question(**common, length=length, max=_positive_int(loc, i, raw, "max", top))
    options = raw.get("options")
    if (
        not isinstance(options, list)
        or len(options) < 2
        or not all(isinstance(o, str) and o for o in options)
    ):
        raise loc.error(i, "options", "`options` must be a list of at least two names")
    if len(set(options)) != len(options):
        raise loc.error(i, "options", "`options` must not repeat a name")
    if len(options) > 100_000:
        raise loc.error(i, "options", "at most 100000 options are supported")
    if kind == "choice":
        return Question(**common, options=tuple(options))
    max_choices = _positive_int(loc, i, raw, "max_choices", len(options))
    return Question(**common, options=tuple(options), max_choices=max_choices)


def load_survey(path: str | Path) -> Survey:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SurveyError(f"{p}: cannot read survey file: {e.strerror}") from e
    return parse_survey(text, str(p))
