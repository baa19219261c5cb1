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

Budget. A survey whose questions all use pure ε-DP mechanisms (geometric,
the default, or laplace) has a total ``epsilon``, divided among the
questions by sequential composition: ``epsilon`` on a question takes that
much, the rest is shared in proportion to ``weight`` (default 1). As soon as
one question uses the gaussian mechanism (zCDP), the survey is composed
under zCDP: its total is ``rho``, or ``epsilon`` *and* ``delta`` (solved for
the largest ρ with the tight conversion of Canonne, Kamath, Steinke 2020),
shared as ρ; a pure question there gets the ε whose ε²/2 fits its share.
Every error names the file, the line and what to change.

The survey window: ``opens`` and ``closes`` (RFC 3339 date-times with an
offset, as TOML date-times or strings) bound the report times the
aggregators accept, and no batch of the survey is closed before ``closes``
(so collecting can never lock out a respondent). Both are aligned to
``time_precision`` (seconds, default 3600), the batch granularity of every
question's task; ``max_clock_skew`` (seconds, default 60) is how far in the
future a report time may be. A survey without a window can be simulated,
not deployed. A vector question may name its elements with ``labels``.

Any question may set ``local_epsilon`` (ε_L): each respondent's device then
randomizes the answer before it is shared (veil.dp.local), so the answer stays
ε_L-private even if both aggregators collude. The central budget is unchanged
(randomization is pre-processing); the estimates are de-biased for it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veil.dp.accounting import DEFAULT_DELTA, zcdp_rho
from veil.dp.errors import DPError
from veil.dp.estimates import Estimate, ratio, shares, total
from veil.dp.local import parse_local_epsilon
from veil.dp.mechanisms import MAX_EPSILON, MAX_RHO, MIN_EPSILON, MIN_RHO
from veil.settings import SettingsError, Source, Table, parse_toml
from veil.task import DEFAULT_MAX_CLOCK_SKEW, DEFAULT_TIME_PRECISION, ClientTask
from veil.times import TimeFormatError, format_duration, format_time, parse_time
from veil.vdaf import Field, Field64, Field128, Prio3, registry

if TYPE_CHECKING:
    from veil.client import Client

# The interval a survey aims at by default: ±10% of each question's range
# (`target_error`; `veil survey plan`).
DEFAULT_TARGET_ERROR = Fraction(1, 10)
KINDS = ("yes_no", "integer", "choice", "multi_choice", "vector")
MECHANISMS = ("geometric", "laplace", "gaussian", "none")
SURVEY_KEYS = (
    "name",
    "id",
    "epsilon",
    "rho",
    "delta",
    "mechanism",
    "min_batch_size",
    "max_respondents",
    "time_precision",
    "max_clock_skew",
    "opens",
    "closes",
    "neighbouring",
    "expected_respondents",
    "target_error",
    "invitations",
)
QUESTION_COMMON_KEYS = (
    "id",
    "text",
    "kind",
    "epsilon",
    "rho",
    "weight",
    "mechanism",
    "local_epsilon",
    "target_error",
    "required",
)
QUESTION_KIND_KEYS: dict[str, tuple[str, ...]] = {
    "yes_no": (),
    "integer": ("max",),
    "choice": ("options",),
    "multi_choice": ("options", "max_choices"),
    "vector": ("length", "max", "labels"),
}


class SurveyError(SettingsError):
    """A survey file is malformed; the message says where and what to change."""


_ALL_KIND_KEYS = sorted({k for keys in QUESTION_KIND_KEYS.values() for k in keys})


def optimal_chunk_length(meas_len: int) -> int:
    """ParallelSum chunk length minimising proof size: about sqrt(MEAS_LEN)."""
    return max(1, math.isqrt(meas_len))


@dataclass(frozen=True)
class Question:
    """One question. Its budget per collection is `epsilon` (pure mechanisms) or
    `rho` (gaussian); `share` is what it costs the survey, in the survey's unit
    (ε for a pure survey, ρ for one composed under zCDP: ε²/2 for a pure question)."""

    id: str
    text: str
    kind: str
    epsilon: Fraction | None
    max: int = 0
    options: tuple[str, ...] = ()
    max_choices: int = 0
    length: int = 0
    labels: tuple[str, ...] = ()
    # ε_L of randomized response on the respondent's device (veil.dp.local), or None.
    local_epsilon: Fraction | None = None
    mechanism: str = "geometric"
    rho: Fraction | None = None
    share: Fraction = Fraction(0)
    # "add_remove": the report carries its own count, so that the noisy count can
    # stand in for the exact one, which the collector is not told (see Survey).
    neighbouring: str = "replace_one"
    # Half the interval's width aimed at, as a share of the range (veil.plan);
    # None: the survey's.
    target_error: Fraction | None = None
    # Whether a respondent must answer it; otherwise it may be skipped (no
    # report is sent for it, and its n counts only those who answered).
    required: bool = False

    @property
    def add_remove(self) -> bool:
        """Whether neighbouring datasets add or remove one report (else: replace one)."""
        return self.neighbouring == "add_remove"

    @property
    def vdaf_type(self) -> str:
        """The VDAF kind (veil.vdaf.registry) this question's answers are encoded with."""
        if self.add_remove:
            # Every type carries the count: a histogram's buckets add up to it; the
            # others get a last coordinate that is always 1.
            return {
                "yes_no": "histogram",
                "integer": "sumvec",
                "choice": "histogram",
                "multi_choice": "multihot",
                "vector": "sumvec",
            }[self.kind]
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
        if self.add_remove:
            return self._add_remove_params()
        if self.kind == "yes_no":
            return {}
        if self.kind == "integer":
            return {"max_measurement": self.max}
        if self.kind == "choice":
            n = len(self.options)
            return {"length": n, "chunk_length": optimal_chunk_length(n)}
        if self.kind == "multi_choice":
            n = len(self.options)
            # Randomized response can turn on any options, so with a local layer the
            # proof admits every weight; max_choices still binds the true answer.
            weight = n if self.local_epsilon is not None else self.max_choices
            return {
                "length": n,
                "max_weight": weight,
                "chunk_length": optimal_chunk_length(n + weight.bit_length()),
            }
        bits = self.max.bit_length()
        return {
            "length": self.length,
            "max_measurement": self.max,
            "chunk_length": optimal_chunk_length(self.length * bits),
        }

    def _add_remove_params(self) -> dict[str, int]:
        if self.kind in ("yes_no", "choice"):
            n = 2 if self.kind == "yes_no" else len(self.options)
            return {"length": n, "chunk_length": optimal_chunk_length(n)}
        if self.kind == "multi_choice":
            n = len(self.options) + 1
            weight = self.max_choices + 1
            return {
                "length": n,
                "max_weight": weight,
                "chunk_length": optimal_chunk_length(n + weight.bit_length()),
            }
        length = (1 if self.kind == "integer" else self.length) + 1
        return {
            "length": length,
            "max_measurement": self.max,
            "chunk_length": optimal_chunk_length(length * self.max.bit_length()),
        }

    def vdaf(self) -> Prio3[Any, Any]:
        """The Prio3 instance of this question's task."""
        return registry.kind(self.vdaf_type).make(self.vdaf_params)

    def ratio_estimates(self, est: Sequence[Estimate]) -> tuple[list[Estimate], Estimate]:
        """(results, report count) of an add_remove question from its coordinates'
        estimates, which must hold simultaneously (`simultaneous=True`).

        The collector is not told the report count, so the results are ratios of
        noisy sums: a yes/no question gives the share of yes, a choice each option's
        share, a multiple choice each option's share of respondents, an integer or
        a vector the mean per element; the count is the noisy count. The intervals
        cover whenever the coordinates' intervals all do (see `veil.dp.ratio`).
        """
        if not self.add_remove:
            raise ValueError(f"question {self.id!r} is not add_remove")
        if self.kind in ("yes_no", "choice"):
            parts = shares(est)
            return (parts[1:] if self.kind == "yes_no" else parts), total(est)
        count = est[-1]
        top = Fraction(1) if self.kind == "multi_choice" else Fraction(self.max)
        return [ratio(e, count, Fraction(0), top) for e in est[:-1]], count

    def allowed(self) -> str:
        """What an answer to this question may be, in words."""
        if self.kind == "yes_no":
            return "yes or no (also true or false)"
        if self.kind == "integer":
            return f"a whole number from 0 to {self.max}"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(o) for o in self.options)
        if self.kind == "multi_choice":
            return f"a list of at most {self.max_choices} of " + ", ".join(
                repr(o) for o in self.options
            )
        return f"a list of {self.length} whole numbers from 0 to {self.max}"

    def element_labels(self) -> tuple[str, ...]:
        """Names of the elements of the result: options, vector labels or [i]."""
        if self.options:
            return self.options
        if self.kind == "vector":
            return self.labels or tuple(f"[{i}]" for i in range(self.length))
        return ()

    def _refuse(self, answer: Any, why: str = "") -> AnswerError:
        return AnswerError(
            f"question {self.id!r}: {answer!r} is not an allowed answer{why}; give {self.allowed()}"
        )

    def to_measurement(self, answer: Any) -> Any:
        """A respondent's answer in the question's terms (yes/no, a number, an
        option name, a list of option names, a list of numbers) as the Prio3
        measurement. Raises AnswerError naming the question, the answer and
        what is allowed. Under add_remove a yes/no answer is the index of a
        two-bucket histogram (no, yes), and a number, a list of options or a
        vector gets a last element 1 that counts the report."""
        measurement = self._measurement(answer)
        if not self.add_remove or self.kind in ("yes_no", "choice"):
            return measurement
        if self.kind == "integer":
            return [measurement, 1]
        if self.kind == "multi_choice":
            return [*measurement, True]
        return [*measurement, 1]

    def _measurement(self, answer: Any) -> Any:
        if self.kind == "yes_no":
            if isinstance(answer, str) and answer.strip().lower() in YES_NO:
                return YES_NO[answer.strip().lower()]
            if not isinstance(answer, bool):
                raise self._refuse(answer, " (not a bool)")
            return int(answer)
        if self.kind == "integer":
            return self._number(answer, answer)
        if self.kind == "choice":
            if not isinstance(answer, str) or answer not in self.options:
                raise AnswerError(
                    f"question {self.id!r}: {answer!r} is not one of the options; give"
                    f" {self.allowed()}"
                )
            return self.options.index(answer)
        if not isinstance(answer, (list, tuple)):
            raise self._refuse(answer, " (not a list)")
        if self.kind == "multi_choice":
            unknown = [a for a in answer if not isinstance(a, str) or a not in self.options]
            if unknown:
                raise self._refuse(answer, f" ({unknown[0]!r} is not one of the options)")
            if len(set(answer)) != len(answer):
                raise self._refuse(answer, " (an option is named twice)")
            if len(answer) > self.max_choices:
                raise self._refuse(answer, f" ({len(answer)} options chosen)")
            chosen = set(answer)
            return [option in chosen for option in self.options]
        if len(answer) != self.length:
            raise self._refuse(answer, f" ({len(answer)} numbers)")
        return [self._number(v, answer) for v in answer]

    def _number(self, value: Any, answer: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*\d{1,30}\s*", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= self.max:
            raise self._refuse(answer)
        return value


YES_NO = {"yes": 1, "no": 0, "true": 1, "false": 0, "y": 1, "n": 0}


def article(word: str) -> str:
    """ "a" or "an" before `word` (by its first letter: enough for the kinds)."""
    return "an" if word[:1].lower() in "aeiou" else "a"


class AnswerError(ValueError):
    """A respondent's answer does not fit its question; the message names the
    question, the answer given and what is allowed."""


@dataclass(frozen=True)
class Survey:
    """A parsed survey. `epsilon` is the total of a pure survey; a survey composed
    under zCDP has `rho` (its total) and `delta` (at which its (ε, δ) is stated), and
    `epsilon` is then None. Mechanism none: both None."""

    name: str
    epsilon: Fraction | None
    mechanism: str
    min_batch_size: int
    max_respondents: int
    questions: tuple[Question, ...]
    path: str = "<string>"
    opens: int | None = None
    closes: int | None = None
    time_precision: int = DEFAULT_TIME_PRECISION
    max_clock_skew: int = DEFAULT_MAX_CLOCK_SKEW
    id: str = ""
    rho: Fraction | None = None
    delta: Fraction | None = None
    # What one respondent's data is: "replace_one" (the report count is published)
    # or "add_remove" (the count is noised and never sent to the collector; means
    # and proportions are ratios of noisy sums).
    neighbouring: str = "replace_one"
    # How many respondents the operator expects (`veil survey plan`, deploy).
    expected_respondents: int | None = None
    # Half the interval's width aimed at, a share of each range (veil.plan).
    target_error: Fraction | None = None
    # Answers only from invited respondents (veil.invite): one token per
    # question per invitation, so the privacy unit is one respondent.
    invitations: bool = False

    @property
    def zcdp(self) -> bool:
        """Whether the survey composes under zCDP (some question is gaussian)."""
        return self.rho is not None

    @property
    def total(self) -> Fraction | None:
        """The survey's total budget in its unit (ε, or ρ under zCDP)."""
        return self.rho if self.rho is not None else self.epsilon

    def question(self, question_id: str) -> Question:
        """The question with this id; raises KeyError if there is none."""
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(question_id)


class _Locator:
    """Error messages at the line of a setting of [survey] or of a
    [[question]] (found by veil.settings.Source: tomllib reports no positions
    for valid TOML)."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.source = Source(path, text)

    def line_of(self, question: int | None, key: str | None) -> int:
        table: tuple[str | int, ...] = ("survey",) if question is None else ("question", question)
        return self.source.line_of(table, key) or 1

    def error(self, question: int | None, key: str | None, message: str) -> SurveyError:
        return SurveyError(f"{self.path}:{self.line_of(question, key)}: {message}")


def _fraction(value: Any) -> Fraction:
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
        doc = parse_toml(text, path, ("survey", "question"))
        if not isinstance(doc.data.get("survey"), dict):
            raise SurveyError(f"{path}:1: missing [survey] table (name, epsilon)")
        # Every setting of [survey] is known here; a misspelt one is refused.
        head = doc.table("survey", SURVEY_KEYS).data
        doc.tables("question", (*QUESTION_COMMON_KEYS, *_ALL_KIND_KEYS))
    except SettingsError as e:
        if isinstance(e, SurveyError):
            raise
        raise SurveyError(str(e)) from None
    doc_data = doc.data

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

    tp = head.get("time_precision", DEFAULT_TIME_PRECISION)
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 366 * 86400:
        raise loc.error(
            None, "time_precision", "`time_precision` must be a number of seconds (1 to a year)"
        )
    invitations = head.get("invitations", False)
    if not isinstance(invitations, bool):
        raise loc.error(None, "invitations", "`invitations` must be true or false")
    skew = head.get("max_clock_skew", DEFAULT_MAX_CLOCK_SKEW)
    if isinstance(skew, bool) or not isinstance(skew, int) or not 0 <= skew <= 86400:
        raise loc.error(
            None, "max_clock_skew", "`max_clock_skew` must be a number of seconds (0 to a day)"
        )
    opens, closes = _window(loc, head, tp)
    expected = head.get("expected_respondents")
    if expected is not None and (
        isinstance(expected, bool)
        or not isinstance(expected, int)
        or not 1 <= expected <= max_respondents
    ):
        raise loc.error(
            None,
            "expected_respondents",
            f"`expected_respondents` must be a whole number from 1 to max_respondents"
            f" ({max_respondents}), got {expected!r}",
        )
    target_error = _target_error(loc, None, head)
    survey_id = head.get("id", survey_id_of(str(head.get("name", Path(path).stem))))
    if not isinstance(survey_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", survey_id):
        raise loc.error(None, "id", "the survey `id` must be letters, digits, _ or - (1 to 64)")

    raw_questions = doc_data.get("question")
    if not isinstance(raw_questions, list) or not raw_questions:
        raise SurveyError(f"{path}: a survey needs at least one [[question]] table")

    neighbouring = head.get("neighbouring", "replace_one")
    if neighbouring not in ("replace_one", "add_remove"):
        raise loc.error(
            None, "neighbouring", '`neighbouring` must be "replace_one" or "add_remove"'
        )
    if neighbouring == "add_remove" and mechanism == "none":
        raise loc.error(
            None,
            "neighbouring",
            "add_remove protects the count with noise: it needs a mechanism other than none",
        )
    mechanisms = []
    for i, raw in enumerate(raw_questions):
        if neighbouring == "add_remove" and isinstance(raw, dict) and "local_epsilon" in raw:
            raise loc.error(
                i,
                "local_epsilon",
                'a survey with neighbouring = "add_remove" keeps the report count from the'
                " collector, which the local layer's estimates need; use one or the other",
            )
        if not isinstance(raw, dict):
            raise SurveyError(f"{path}: each [[question]] must be a table")
        m = raw.get("mechanism", mechanism)
        if m not in MECHANISMS:
            raise loc.error(i, "mechanism", f"unknown mechanism {m!r}; use one of {MECHANISMS}")
        if (m == "none") != (mechanism == "none"):
            raise loc.error(
                i,
                "mechanism",
                "mechanism none (no privacy) is chosen for a whole survey, not one question",
            )
        mechanisms.append(m)
    zcdp = "gaussian" in mechanisms
    unit = "rho" if zcdp else "epsilon"
    total, delta = _survey_total(loc, head, mechanism, zcdp)

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
        given = [k for k in ("epsilon", "rho", "weight") if k in raw]
        if len(given) > 1:
            raise loc.error(
                i, given[1], f"give a question one of `epsilon`, `rho` or `weight`, not {given}"
            )
        key = given[0] if given else "weight"
        if mechanism == "none" and key != "weight":
            raise loc.error(i, key, "a survey with mechanism none spends no budget")
        if key == "rho" and not zcdp:
            raise loc.error(
                i, "rho", "`rho` is a zCDP budget: only a survey with a gaussian question takes it"
            )
        if key == "epsilon" and mechanisms[i] == "gaussian":
            raise loc.error(
                i,
                "epsilon",
                "a gaussian question's budget is `rho` (zCDP), or a `weight` of the survey's",
            )
        try:
            value = _fraction(raw.get(key, 1))
        except (ValueError, ZeroDivisionError) as e:
            raise loc.error(i, key, f"`{key}` must be a number: {e}") from None
        if value <= 0:
            raise loc.error(i, key, f"a question's `{key}` must be positive")
        if key == "weight":
            weights[i] = value
        elif key == "epsilon" and zcdp:
            explicit[i] = value * value / 2  # ε-DP is ε²/2-zCDP
        else:
            explicit[i] = value

    questions = []
    if total is None:
        shares = {i: Fraction(0) for i in range(len(raw_questions))}
    else:
        shares = _divide(loc, total, unit, explicit, weights)
    for i, raw in enumerate(raw_questions):
        epsilon, rho = _question_budget(loc, i, raw, mechanisms[i], shares[i], zcdp)
        if (epsilon is not None and epsilon < MIN_EPSILON) or (rho is not None and rho < MIN_RHO):
            key = next((k for k in ("epsilon", "rho") if k in raw), "weight")
            raise loc.error(
                i,
                key,
                f"this question's {'ρ' if rho is not None else 'ε'} {rho or epsilon} is below the"
                f" minimum {MIN_RHO if rho is not None else MIN_EPSILON}: the noise would bury"
                " its result; give it a larger share",
            )
        questions.append(
            _question(
                loc, i, raw, epsilon, rho, mechanisms[i], shares[i], max_respondents, neighbouring
            )
        )
    return Survey(
        name=str(head.get("name", Path(path).stem)),
        epsilon=None if zcdp else total,
        mechanism=mechanism,
        min_batch_size=min_batch,
        max_respondents=max_respondents,
        questions=tuple(questions),
        path=path,
        opens=opens,
        closes=closes,
        time_precision=tp,
        max_clock_skew=skew,
        id=survey_id,
        rho=total if zcdp else None,
        delta=delta,
        neighbouring=neighbouring,
        expected_respondents=expected,
        target_error=target_error,
        invitations=invitations,
    )


def _target_error(loc: _Locator, i: int | None, table: Mapping[str, Any]) -> Fraction | None:
    """`target_error` of [survey] or of a question: a share of the range in (0, 1]."""
    if "target_error" not in table:
        return None
    try:
        value = _fraction(table["target_error"])
    except (ValueError, ZeroDivisionError):
        value = Fraction(-1)
    if not 0 < value <= 1:
        raise loc.error(
            i,
            "target_error",
            "`target_error` must be a share of the range from 0 to 1 (0.1: the interval"
            f" within ±10% of it), got {table['target_error']!r}",
        )
    return value


def _required(loc: _Locator, i: int, raw: Mapping[str, Any]) -> bool:
    value = raw.get("required", False)
    if not isinstance(value, bool):
        raise loc.error(i, "required", f"`required` must be true or false, got {value!r}")
    return value


def survey_id_of(name: str) -> str:
    """A survey id from its name: lower case, runs of other characters as '-'."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:64].strip("-")
    return slug or "survey"


def _window(loc: _Locator, head: Mapping[str, Any], tp: int) -> tuple[int | None, int | None]:
    """`opens` and `closes` as epoch seconds (both or neither), aligned to `tp`."""
    if ("opens" in head) != ("closes" in head):
        present = "opens" if "opens" in head else "closes"
        raise loc.error(None, present, "the survey window needs both `opens` and `closes`")
    if "opens" not in head:
        return None, None
    bounds = []
    for key in ("opens", "closes"):
        try:
            t = parse_time(head[key])
        except TimeFormatError as e:
            raise loc.error(None, key, f"`{key}`: {e}") from None
        if t % tp:
            down, up = t - t % tp, t - t % tp + tp
            raise loc.error(
                None,
                key,
                f"`{key}` = {format_time(t)} is not aligned to the time_precision of {tp} s"
                f" (batches are whole intervals): use {format_time(down)} or {format_time(up)}",
            )
        bounds.append(t)
    if bounds[1] <= bounds[0]:
        raise loc.error(None, "closes", "`closes` must be after `opens`")
    return bounds[0], bounds[1]


def _survey_total(
    loc: _Locator, head: Mapping[str, Any], mechanism: str, zcdp: bool
) -> tuple[Fraction | None, Fraction | None]:
    """(total, delta) of the [survey] table: ε for a pure survey, ρ under zCDP."""

    def number(key: str, low: Fraction, high: Fraction) -> Fraction:
        try:
            value = _fraction(head.get(key))
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


def _divide(
    loc: _Locator,
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


def _question_budget(
    loc: _Locator,
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
        epsilon = _fraction(raw["epsilon"])
        if epsilon > MAX_EPSILON:
            raise loc.error(i, "epsilon", f"`epsilon` must be at most {MAX_EPSILON}")
        return epsilon, None
    # A pure question in a zCDP survey: the ε whose ε²/2 fits its ρ share.
    epsilon = sqrt_down(2 * share)
    if epsilon <= 0 or epsilon > MAX_EPSILON:
        raise loc.error(i, None, f"this question's ε ({epsilon}) must be in (0, {MAX_EPSILON}]")
    return epsilon, None


def _max_fitting(field: type[Field], respondents: int) -> int:
    """Largest per-report maximum whose total over ``respondents`` reports
    stays below a quarter of the field (the rest is headroom for noise and
    the centred lift, which reads values above p/2 as negative)."""
    return (field.MODULUS // 4) // respondents


def _question(
    loc: _Locator,
    i: int,
    raw: Mapping[str, Any],
    epsilon: Fraction | None,
    rho: Fraction | None,
    mechanism: str,
    share: Fraction,
    respondents: int,
    neighbouring: str,
) -> Question:
    kind = raw["kind"]
    try:
        Table(raw, loc.source, (*QUESTION_COMMON_KEYS, *QUESTION_KIND_KEYS[kind]), ("question", i))
    except SettingsError as e:
        raise SurveyError(f"{e} (for {article(kind)} {kind} question)") from None
    text = str(raw.get("text", raw["id"]))
    common: dict[str, Any] = {
        "id": raw["id"],
        "text": text,
        "kind": kind,
        "epsilon": epsilon,
        "rho": rho,
        "mechanism": mechanism,
        "share": share,
        "neighbouring": neighbouring,
        "target_error": _target_error(loc, i, raw),
        "required": _required(loc, i, raw),
    }
    if "local_epsilon" in raw:
        try:
            common["local_epsilon"] = parse_local_epsilon(_fraction(raw["local_epsilon"]))
        except (ValueError, ZeroDivisionError) as e:
            raise loc.error(
                i, "local_epsilon", f"`local_epsilon` must be a number in (0, 20]: {e}"
            ) from None
    if kind == "yes_no":
        return Question(**common)
    if kind == "integer":
        return Question(
            **common, max=_positive_int(loc, i, raw, "max", _max_fitting(Field64, respondents))
        )
    if kind == "vector":
        length = _positive_int(loc, i, raw, "length", 100_000)
        top = _max_fitting(Field128, respondents)
        labels = raw.get("labels", [])
        if (
            not isinstance(labels, list)
            or not all(isinstance(x, str) and x for x in labels)
            or (labels and len(labels) != length)
            or len(set(labels)) != len(labels)
        ):
            raise loc.error(
                i, "labels", f"`labels` must be {length} distinct names, one per element"
            )
        return Question(
            **common,
            length=length,
            max=_positive_int(loc, i, raw, "max", top),
            labels=tuple(labels),
        )
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
    """Read and check a survey file; raises SurveyError naming file, line and setting.

    Example::

        survey = load_survey("survey.toml")
        print(survey.name, [q.id for q in survey.questions])
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SurveyError(f"{p}: cannot read survey file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise SurveyError(f"{p}: not a survey file: not UTF-8 text (byte {e.start})") from None
    return parse_survey(text, str(p))


# --- the public survey description ------------------------------------------

DESCRIPTION_FILE = "survey.json"
DESCRIPTION_FORMAT = "veil-survey/1"


def public_description(survey: Survey, task_ids: Mapping[str, str]) -> dict[str, Any]:
    """The survey as respondents see it: what `veil survey deploy` writes to
    client/survey.json, beside each question's public task file.

    Format ``veil-survey/1``, a JSON object::

        {"format": "veil-survey/1",
         "id": "workplace", "name": "Workplace survey",
         "opens": "2026-05-01T00:00:00Z", "closes": "2026-05-08T00:00:00Z",
         "time_precision": 3600, "max_clock_skew": 60,
         "mechanism": "geometric", "epsilon": "2",
         "questions": [
           {"id": "team", "text": "Which team are you in?", "kind": "choice",
            "epsilon": "1/3", "task_file": "team.toml", "task_id": "<base64url>",
            "options": ["engineering", "design"]},
           ...]}

    Times are RFC 3339 in UTC; ε values are exact fractions as strings (ρ for
    the gaussian mechanism). Per kind a question carries: choice `options`;
    multi_choice `options` and `max_choices`; integer `max`; vector `length`,
    `max` and, when named, `labels`. `task_file` is the question's client task
    file in the same directory (VDAF, aggregators, HPKE config); `task_id` is
    its task id, so a reader can check that the two belong together. A report
    for a question is uploaded under that task with a time in [opens, closes).
    Nothing in it is secret.
    """
    if survey.opens is None or survey.closes is None:
        raise SurveyError(f"{survey.path}: a deployed survey needs a window (`opens`, `closes`)")
    questions = []
    for q in survey.questions:
        d: dict[str, Any] = {
            "id": q.id,
            "text": q.text,
            "kind": q.kind,
            "mechanism": q.mechanism,
            "task_file": f"{q.id}.toml",
            "task_id": task_ids[q.id],
        }
        if q.rho is not None:
            d["rho"] = str(q.rho)
        elif q.epsilon is not None:
            d["epsilon"] = str(q.epsilon)
        if q.local_epsilon is not None:
            d["local_epsilon"] = str(q.local_epsilon)
        if q.required:
            d["required"] = True
        if q.options:
            d["options"] = list(q.options)
        if q.kind == "multi_choice":
            d["max_choices"] = q.max_choices
        if q.kind in ("integer", "vector"):
            d["max"] = q.max
        if q.kind == "vector":
            d["length"] = q.length
            if q.labels:
                d["labels"] = list(q.labels)
        questions.append(d)
    out: dict[str, Any] = {
        "format": DESCRIPTION_FORMAT,
        "id": survey.id,
        "name": survey.name,
        "opens": format_time(survey.opens),
        "closes": format_time(survey.closes),
        "time_precision": survey.time_precision,
        "max_clock_skew": survey.max_clock_skew,
        "mechanism": survey.mechanism,
    }
    if survey.neighbouring != "replace_one":
        out["neighbouring"] = survey.neighbouring
    if survey.invitations:
        out["invitations"] = True
    if survey.rho is not None:
        out["rho"] = str(survey.rho)
        out["delta"] = str(survey.delta or DEFAULT_DELTA)
    elif survey.epsilon is not None:
        out["epsilon"] = str(survey.epsilon)
    out["questions"] = questions
    return out


@dataclass(frozen=True)
class Description:
    """A parsed public survey description; `task_files` maps question id to
    its client task file."""

    survey: Survey
    task_files: Mapping[str, Path]
    task_ids: Mapping[str, str]


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = d.get(key)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise SurveyError(f"{where}: `{key}` is missing or not a {getattr(kind, '__name__', kind)}")
    return value


def load_description(directory: str | Path) -> Description:
    """Read DIR/survey.json (a deployment's client/ directory); raises SurveyError."""
    path = Path(directory) / DESCRIPTION_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SurveyError(
            f"{path}: cannot read the survey description ({e.strerror}); give the client/"
            " directory that `veil survey deploy` wrote"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SurveyError(f"{path}: not a survey description: {e}") from None
    where = str(path)
    if not isinstance(doc, dict) or doc.get("format") != DESCRIPTION_FORMAT:
        raise SurveyError(f"{where}: not a {DESCRIPTION_FORMAT} survey description")
    try:
        opens = parse_time(_get(doc, "opens", str, where))
        closes = parse_time(_get(doc, "closes", str, where))
        epsilon, rho, delta = (
            Fraction(_get(doc, key, str, where)) if key in doc else None
            for key in ("epsilon", "rho", "delta")
        )
        neighbouring = doc.get("neighbouring", "replace_one")
        if neighbouring not in ("replace_one", "add_remove"):
            raise ValueError(f"unknown neighbouring {neighbouring!r}")
    except (TimeFormatError, ValueError, ZeroDivisionError) as e:
        raise SurveyError(f"{where}: {e}") from None
    questions = []
    files: dict[str, Path] = {}
    ids: dict[str, str] = {}
    for n, raw in enumerate(_get(doc, "questions", list, where)):
        at = f"{where}: question {n + 1}"
        if not isinstance(raw, dict):
            raise SurveyError(f"{at}: not an object")
        qid = _get(raw, "id", str, at)
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", qid) or qid in files:
            raise SurveyError(f"{at}: bad or repeated id {qid!r}")
        kind = _get(raw, "kind", str, at)
        if kind not in KINDS:
            raise SurveyError(f"{at}: unknown kind {kind!r}")
        task_file = _get(raw, "task_file", str, at)
        if Path(task_file).name != task_file:
            raise SurveyError(f"{at}: `task_file` must name a file in the same directory")
        files[qid] = path.parent / task_file
        ids[qid] = _get(raw, "task_id", str, at)
        fields: dict[str, Any] = {}
        if kind in ("choice", "multi_choice"):
            options = _get(raw, "options", list, at)
            if len(options) < 2 or not all(isinstance(o, str) and o for o in options):
                raise SurveyError(f"{at}: `options` must be a list of at least two names")
            fields["options"] = tuple(options)
        if kind == "multi_choice":
            fields["max_choices"] = _get(raw, "max_choices", int, at)
        if kind in ("integer", "vector"):
            fields["max"] = _get(raw, "max", int, at)
        if kind == "vector":
            fields["length"] = _get(raw, "length", int, at)
            labels = raw.get("labels", [])
            if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                raise SurveyError(f"{at}: `labels` must be a list of names")
            fields["labels"] = tuple(labels)
        try:
            q_eps, q_rho = (
                Fraction(_get(raw, key, str, at)) if key in raw else None
                for key in ("epsilon", "rho")
            )
        except (ValueError, ZeroDivisionError) as e:
            raise SurveyError(f"{at}: {e}") from None
        q_mech = raw.get("mechanism", doc.get("mechanism"))
        if q_mech not in MECHANISMS:
            raise SurveyError(f"{at}: unknown mechanism {q_mech!r}")
        fields["mechanism"] = q_mech
        fields["rho"] = q_rho
        fields["neighbouring"] = neighbouring
        if "local_epsilon" in raw:
            try:
                fields["local_epsilon"] = parse_local_epsilon(_get(raw, "local_epsilon", str, at))
            except ValueError as e:
                raise SurveyError(f"{at}: `local_epsilon`: {e}") from None
        if "required" in raw:
            fields["required"] = _get(raw, "required", bool, at)
        text = _get(raw, "text", str, at)
        questions.append(Question(id=qid, text=text, kind=kind, epsilon=q_eps, **fields))
    if not questions:
        raise SurveyError(f"{where}: the survey has no questions")
    mechanism = _get(doc, "mechanism", str, where)
    survey = Survey(
        name=_get(doc, "name", str, where),
        epsilon=epsilon,
        rho=rho,
        delta=delta,
        neighbouring=neighbouring,
        mechanism=mechanism,
        min_batch_size=1,
        max_respondents=1,
        questions=tuple(questions),
        path=where,
        opens=opens,
        closes=closes,
        time_precision=_get(doc, "time_precision", int, where),
        max_clock_skew=_get(doc, "max_clock_skew", int, where),
        id=_get(doc, "id", str, where),
        invitations=_get(doc, "invitations", bool, where) if "invitations" in doc else False,
    )
    return Description(survey, files, ids)


# --- answering a deployed survey ----------------------------------------------


class WindowClosed(SurveyError):
    """The survey is not open at this time (not yet, or no longer)."""


@dataclass(frozen=True)
class Responses:
    """What `SurveyClient.respond`/`respond_many` uploaded: reports per question
    (a question nobody answered is absent) and how many respondents."""

    respondents: int
    reports: Mapping[str, int]


class SurveyClient:
    """Answers a deployed survey by label, for one respondent or many.

    `directory` is the deployment's client/ directory (survey.json and one
    task file per question). Answers are a mapping from question id to the
    answer in the question's terms (`Question.to_measurement`); a question
    left out is not uploaded. Every answer is checked before anything is
    sent. The TLS options are those of `veil.client.Client`.

    A report's time is now, rounded down to the time precision; outside the
    window the call raises WindowClosed before sending anything.

    A survey with invitations (`invitations = true`) takes answers from one
    invited respondent: give `invitation` (the code) and `issuer` (the URL
    of the issuer's POST /invitation endpoint). `respond` then redeems the
    invitation for one token per question (veil.invite.client) before it
    sends anything; a used invitation raises InvitationError ("This
    invitation has already been used.").
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        invitation: str | None = None,
        issuer: str | None = None,
        leader_root_certificates: bytes | None = None,
        helper_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from veil.client import Client
        from veil.task import TaskError, load_task

        self.description = load_description(directory)
        self.survey = self.description.survey
        self.clock = clock
        if self.survey.invitations and (invitation is None or issuer is None):
            raise SurveyError(
                "this survey takes answers from invited respondents only: give the invitation"
                " code and the issuer's address"
            )
        if not self.survey.invitations and invitation is not None:
            raise SurveyError("this survey does not use invitations")
        self.invitation = invitation
        self.issuer = issuer
        self.tasks: dict[str, ClientTask] = {}
        for q in self.survey.questions:
            path = self.description.task_files[q.id]
            try:
                task = load_task(path, ClientTask)
            except (OSError, TaskError) as e:
                raise SurveyError(f"question {q.id!r}: cannot read its task file: {e}") from None
            if task.id_text != self.description.task_ids[q.id]:
                raise SurveyError(
                    f"{path}: its task id is not the one survey.json names for question"
                    f" {q.id!r}: the directory mixes two deployments"
                )
            self.tasks[q.id] = task
        # Channels connect on first use; creating them here checks the
        # certificates (veil.trust.TrustError) before any answer is taken.
        self._clients: dict[str, Client] = {}
        try:
            for qid, task in self.tasks.items():
                self._clients[qid] = Client(
                    task,
                    leader_root_certificates=leader_root_certificates,
                    helper_root_certificates=helper_root_certificates,
                    private_key=private_key,
                    certificate_chain=certificate_chain,
                )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close every task's client."""
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> SurveyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_open(self) -> int:
        """The report time for now; WindowClosed outside [opens, closes)."""
        assert self.survey.opens is not None and self.survey.closes is not None
        now = int(self.clock())
        if now < self.survey.opens:
            raise WindowClosed(
                f"the survey opens at {format_time(self.survey.opens)}, in"
                f" {format_duration(self.survey.opens - now)}: nothing was sent"
            )
        if now >= self.survey.closes:
            raise WindowClosed(
                f"the survey closed at {format_time(self.survey.closes)}: nothing was sent"
            )
        return now - now % self.survey.time_precision

    def measurements(self, answers: Any) -> dict[str, Any]:
        """Each answered question's measurement; AnswerError on any bad answer."""
        if not isinstance(answers, Mapping):
            raise AnswerError(
                f"answers must be an object keyed by question id, got {type(answers).__name__}"
            )
        ids = [q.id for q in self.survey.questions]
        unknown = [k for k in answers if k not in ids]
        if unknown:
            raise AnswerError(
                f"{unknown[0]!r} is not a question of this survey; its questions are"
                f" {', '.join(ids)}"
            )
        missing = [q for q in self.survey.questions if q.required and answers.get(q.id) is None]
        if missing:
            raise AnswerError(
                f"question {missing[0].id!r} needs an answer (the survey marks it required);"
                f" give {missing[0].allowed()}"
            )
        return {
            q.id: q.to_measurement(answers[q.id])
            for q in self.survey.questions
            if q.id in answers and answers[q.id] is not None
        }

    def respond(self, answers: Mapping[str, Any]) -> Responses:
        """Upload one respondent's answers (one report per answered question)."""
        return self.respond_many([answers])

    def respond_many(
        self,
        respondents: Iterable[Mapping[str, Any]],
        *,
        on_progress: Callable[[int], None] | None = None,
    ) -> Responses:
        """Upload many respondents' answers: all are checked first (AnswerError
        names the respondent, counting from 1), then each question's reports go
        up in batches. `on_progress` is called with the number of reports sent
        by each batch."""
        per_question: dict[str, list[Any]] = {q.id: [] for q in self.survey.questions}
        count = 0
        for n, answers in enumerate(respondents, 1):
            try:
                for qid, m in self.measurements(answers).items():
                    per_question[qid].append(m)
            except AnswerError as e:
                raise AnswerError(f"respondent {n}: {e}") from None
            count += 1
        report_time = self.check_open()
        if self.survey.invitations:
            return self._respond_invited(per_question, count, report_time, on_progress)
        sent: dict[str, int] = {}
        for qid, ms in per_question.items():
            if not ms:
                continue
            client = self._clients[qid]
            for i in range(0, len(ms), UPLOAD_CHUNK):
                chunk = ms[i : i + UPLOAD_CHUNK]
                client.upload_batch(chunk, report_time)
                sent[qid] = sent.get(qid, 0) + len(chunk)
                if on_progress is not None:
                    on_progress(len(chunk))
        return Responses(count, sent)

    def _respond_invited(
        self,
        per_question: Mapping[str, list[Any]],
        count: int,
        report_time: int,
        on_progress: Callable[[int], None] | None,
    ) -> Responses:
        """One invited respondent: redeem, then one report per answered question."""
        from veil.client import prepare_reports
        from veil.hpke import ROLE_HELPER, ROLE_LEADER
        from veil.invite.client import redeem

        if count != 1:
            raise AnswerError("an invitation is for one respondent: give one set of answers")
        assert self.invitation is not None and self.issuer is not None
        qids = [q.id for q in self.survey.questions]
        tickets = dict(
            zip(
                qids,
                redeem(self.issuer, self.invitation, [self.tasks[q] for q in qids]),
                strict=True,
            )
        )
        sent: dict[str, int] = {}
        for qid, ms in per_question.items():
            if not ms:
                continue
            client = self._clients[qid]
            report = prepare_reports(
                self.tasks[qid],
                ms,
                client.hpke_config(ROLE_LEADER),
                client.hpke_config(ROLE_HELPER),
                report_time,
                report_ids=[tickets[qid].report_id],
                tokens=[tickets[qid].token],
            )
            client.upload_reports(report)
            sent[qid] = 1
            if on_progress is not None:
                on_progress(1)
        return Responses(count, sent)


UPLOAD_CHUNK = 500
