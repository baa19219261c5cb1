"""The survey model: a survey, its questions, and how an answer becomes a
Prio3 measurement.

Each question kind maps to a Prio3 type:

=============  =========================  ======================================
kind           measurement                Prio3 type
=============  =========================  ======================================
yes_no         bool                       Prio3Count
integer        int in [0, max]            Prio3Sum(max); the mean uses the count
choice         one of ``options``         Prio3Histogram(len(options))
multi_choice   up to ``max_choices``      Prio3MultihotCountVec
vector         ``length`` ints in [0,max] Prio3SumVec
points         ints per option, sum ≤     Prio3L1BoundSum(len(options), total)
               ``total``
text           a string of ``max_bytes``  Poplar1(8 · max_bytes): heavy hitters
=============  =========================  ======================================

A points answer splits at most ``total`` points across the options ("allocate 100
points"); the proof bounds the sum, not each entry, so one respondent moves the
options' totals by at most twice the total in all (`veil.dp.sensitivities`).
A breakdown (``[[breakdown]]``, kind "breakdown", `Survey.breakdowns`) counts
question `of` in each group of question `by` (yes_no or choice) over the cells
group x category, from the respondent's two answers: Prio3Histogram for a
yes_no or choice, Prio3MultihotCountVec for a multi_choice (the group's row),
Prio3L1BoundSum for an integer (its value in the group's cell; the bound makes
one respondent's total at most ``max`` however many groups there are) or a
points question (its split in the group's row, at most ``total`` in all).

A text answer is normalised on the respondent's device (`veil.survey.text`) and
its most frequent strings are found byte by byte (`veil.dp.heavy_hitters`).

The values here are what `veil.survey.parse` makes of a survey file and
`veil.survey.description` of a `survey.json`; nothing here reads a file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from veil.dp.counted import BitChannel
from veil.dp.estimates import Estimate, ratio, shares, total
from veil.dp.heavy_hitters import DEFAULT_MAX_BYTES, HeavyHittersPlan, Threshold
from veil.dp.local import BoundedResponse, KaryResponse, MultiOptionResponse
from veil.settings import SettingsError
from veil.survey.answers import measurement
from veil.survey.text import text_plan, text_threshold
from veil.task import DEFAULT_MAX_CLOCK_SKEW, DEFAULT_TIME_PRECISION
from veil.vdaf import Poplar1, Prio3, registry

# The interval a survey aims at by default: ±10% of each question's range
# (`target_error`; `veil survey plan`).
DEFAULT_TARGET_ERROR = Fraction(1, 10)
KINDS = ("yes_no", "integer", "choice", "multi_choice", "vector", "points", "text")
MECHANISMS = ("geometric", "laplace", "gaussian", "none")


class SurveyError(SettingsError):
    """A survey file is malformed; the message says where and what to change."""


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
    # Half the interval's width aimed at, as a share of the range (veil.survey.plan);
    # None: the survey's.
    target_error: Fraction | None = None
    # Whether a respondent must answer it; otherwise it may be skipped (no
    # report is sent for it, and its n counts only those who answered).
    required: bool = False
    # A text question: answers of at most max_bytes bytes of UTF-8 (after
    # normalisation, lower-cased unless case_sensitive), released when their noisy
    # count reaches `threshold`, or `min_share` of the expected respondents.
    max_bytes: int = DEFAULT_MAX_BYTES
    case_sensitive: bool = False
    threshold: int | None = None
    min_share: Fraction | None = None
    # A points question: the points a respondent splits across the options (at most).
    total: int = 0
    # A breakdown (kind "breakdown", `Survey.breakdowns`): question `of` counted in
    # each group of question `by`, its own task over the cells group x category.
    of: Question | None = None
    by: Question | None = None

    @property
    def add_remove(self) -> bool:
        """Whether neighbouring datasets add or remove one report (else: replace one)."""
        return self.neighbouring == "add_remove"

    @property
    def mean_top(self) -> int | None:
        """The top of a result row that is a mean per respondent, 0 to it (an integer's
        or a vector's max, a points question's total); None where rows are counts."""
        if self.kind in ("integer", "vector"):
            return self.max
        if self.kind == "points":
            return self.total
        return None

    @property
    def vdaf_type(self) -> str:
        """The VDAF kind (veil.vdaf.registry) this question's answers are encoded with."""
        if self.kind == "text":
            return "poplar1"
        if self.kind == "points":
            return "l1boundsum"
        if self.kind == "breakdown":
            return "multihot" if counted(self) else _BREAKDOWN_VDAF[self._of.kind]
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
        """Parameters of the VDAF, named as in the draft."""
        if self.kind == "text":
            return {"bits": 8 * self.max_bytes}
        if self.kind == "points":
            # Each entry and the claimed sum are range-checked bits of the total's width.
            n = len(self.options)
            return {
                "length": n,
                "max_value": self.total,
                "chunk_length": optimal_chunk_length((n + 1) * self.total.bit_length()),
            }
        if self.kind == "breakdown":
            return _breakdown_params(self)
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

    @property
    def _of(self) -> Question:
        if self.of is None or self.by is None:
            raise ValueError(f"{self.id!r} is not a breakdown")
        return self.of

    def groups(self) -> tuple[str, ...]:
        """A breakdown's groups: the options of its `by` question (no, yes for yes_no)."""
        assert self.by is not None
        return self.by.options or ("no", "yes")

    def categories(self) -> tuple[str, ...]:
        """A breakdown's categories within a group: the options of its `of` question (no,
        yes for yes_no); () for a number, whose cells are the groups' sums."""
        of = self._of
        if of.kind == "yes_no":
            return ("no", "yes")
        return of.options

    def breakdown_channels(self) -> tuple[KaryResponse | None, KaryResponse | None]:
        """A breakdown's (group question's, question's) k-ary randomized response
        (`breakdown_channels`)."""
        return breakdown_channels(self)

    def breakdown_measurement(self, of_measurement: Any, by_measurement: Any) -> Any:
        """A breakdown's measurement from its two questions' (`breakdown_measurement`)."""
        return breakdown_measurement(self, of_measurement, by_measurement)

    def cells(self) -> tuple[str, ...]:
        """A breakdown's cell labels, row by row: "group / category", or the group for
        a number (its sum)."""
        categories = self.categories()
        if not categories:
            return self.groups()
        return tuple(f"{g} / {c}" for g in self.groups() for c in categories)

    def measurement_from(self, answers: Mapping[str, Any]) -> Any:
        """This question's measurement from one respondent's answers (by question id);
        a breakdown's from the answers to its two questions, which must be there."""
        if self.kind != "breakdown":
            return self.to_measurement(answers[self.id])
        assert self.of is not None and self.by is not None
        return self.breakdown_measurement(
            self.of.to_measurement(answers[self.of.id]),
            self.by.to_measurement(answers[self.by.id]),
        )

    def vdaf(self) -> Prio3[Any, Any] | Poplar1:
        """The VDAF instance of this question's task."""
        if self.kind == "text":
            return registry.PREFIX_KINDS["poplar1"].make(self.vdaf_params)
        return registry.kind(self.vdaf_type).make(self.vdaf_params)

    def heavy_hitters(self) -> HeavyHittersPlan:
        """A text question's budget over its byte levels (`veil.dp.heavy_hitters`)."""
        if self.kind != "text":
            raise ValueError(f"question {self.id!r} is not a text question")
        return text_plan(self.max_bytes, self.mechanism, self.epsilon, self.rho, self.neighbouring)

    def release_threshold(self, expected_respondents: int | None) -> Threshold:
        """A text question's threshold and the chance it releases an answer given once
        (`min_share` is a share of `expected_respondents`)."""
        return text_threshold(
            self.heavy_hitters(), self.threshold, self.min_share, expected_respondents
        )

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
        if self.kind == "text":
            case = "" if self.case_sensitive else ", lower-cased"
            return (
                f"a text of at most {self.max_bytes} bytes in UTF-8 (trimmed{case};"
                " a letter outside ASCII takes 2 to 4 bytes)"
            )
        if self.kind == "multi_choice":
            return f"a list of at most {self.max_choices} of " + ", ".join(
                repr(o) for o in self.options
            )
        if self.kind == "points":
            return (
                f"whole numbers of points for the options, {self.total} at most in all, as"
                f" option:points pairs (e.g. {self.options[0]}:{self.total // 2}) or one number"
                " per option in order; an option left out gets 0. Options: "
                + ", ".join(repr(o) for o in self.options)
            )
        return f"a list of {self.length} whole numbers from 0 to {self.max}"

    def element_labels(self) -> tuple[str, ...]:
        """Names of the elements of the result: options, vector labels or [i]; a
        breakdown's cells."""
        if self.kind == "breakdown":
            return self.cells()
        if self.options:
            return self.options
        if self.kind == "vector":
            return self.labels or tuple(f"[{i}]" for i in range(self.length))
        return ()

    def to_measurement(self, answer: Any) -> Any:
        """This question's measurement of a respondent's answer
        (`veil.survey.answers.measurement`); AnswerError if it does not fit."""
        return measurement(self, answer)


def counted(b: Question) -> bool:
    """Whether breakdown `b` counts bits of a randomized multiple choice or number
    with each group's count (`breakdown_measurement`): their de-biasing needs the
    group's respondents (veil.dp.counted.counted_breakdown_estimate)."""
    return b._of.local_epsilon is not None and b._of.kind in ("multi_choice", "integer")


def _breakdown_params(b: Question) -> dict[str, int]:
    """A breakdown's VDAF parameters, named as in the draft."""
    of = b._of
    groups = len(b.groups())
    if counted(b):
        # A group's row: the answer's bits (a number's one), then 1 for the count.
        width = (len(of.options) or 1) + 1
        return {
            "length": groups * width,
            "max_weight": width,
            "chunk_length": optimal_chunk_length(groups * width + width.bit_length()),
        }
    if of.kind == "points":
        # The group's row holds the split: its entries still add up to at most
        # the total, however many groups.
        n = groups * len(of.options)
        return {
            "length": n,
            "max_value": of.total,
            "chunk_length": optimal_chunk_length((n + 1) * of.total.bit_length()),
        }
    if of.kind == "integer":
        # One respondent's value in the cell of their group, the others 0: the
        # L1 bound makes a report's total at most max, whatever cells it fills.
        return {
            "length": groups,
            "max_value": of.max,
            "chunk_length": optimal_chunk_length((groups + 1) * of.max.bit_length()),
        }
    n = groups * len(b.categories())
    if of.kind == "multi_choice":
        weight = len(of.options) if of.local_epsilon is not None else of.max_choices
        return {
            "length": n,
            "max_weight": weight,
            "chunk_length": optimal_chunk_length(n + weight.bit_length()),
        }
    return {"length": n, "chunk_length": optimal_chunk_length(n)}


def breakdown_measurement(b: Question, of_measurement: Any, by_measurement: Any) -> Any:
    """A breakdown's measurement from the measurements of its two questions (as
    `to_measurement` gives them): the cell of the respondent's group and answer
    (a histogram's index), the group's row of chosen options (a multihot vector),
    or the number in the group's cell (an L1-bound sum)."""
    of = b._of
    g = int(by_measurement)
    groups = len(b.groups())
    if counted(b):
        # The randomized answer's bits (a number is drawn as its max or 0: its
        # bit), then 1: the group's count, which the de-biasing needs. What a
        # device sends is made from its draw (veil.client.survey.device_measurements).
        values = list(of_measurement) if of.kind == "multi_choice" else [of_measurement]
        row = [bool(x) for x in values] + [True]
        empty = [False] * len(row)
        return [x for i in range(groups) for x in (row if i == g else empty)]
    if of.kind in ("yes_no", "choice"):
        return g * len(b.categories()) + int(of_measurement)
    if of.kind == "multi_choice":
        row = [bool(x) for x in of_measurement]
        empty = [False] * len(row)
        return [x for i in range(groups) for x in (row if i == g else empty)]
    if of.kind == "points":
        split = [int(x) for x in of_measurement]
        zeros = [0] * len(split)
        return [x for i in range(groups) for x in (split if i == g else zeros)]
    return [int(of_measurement) if i == g else 0 for i in range(groups)]


def breakdown_channels(b: Question) -> tuple[KaryResponse | None, KaryResponse | None]:
    """A breakdown's (group question's, question's) k-ary randomized response as
    their devices apply it (veil.dp.local; None where a question has no local
    layer): the breakdown sends those randomized answers and is de-biased for them."""
    assert b.by is not None

    def channel(q: Question) -> KaryResponse | None:
        if q.local_epsilon is None or q.kind not in ("yes_no", "choice"):
            return None  # a counted breakdown's question: `counted_channels`
        return KaryResponse(len(q.options) or 2, q.local_epsilon)

    return channel(b.by), channel(b._of)


def counted_channels(b: Question) -> tuple[KaryResponse | None, BitChannel]:
    """A counted breakdown's (group question's k-ary response or None, its question's
    channel), as the devices apply them (the question's task's: veil.survey.tasks)."""
    assert b.by is not None and counted(b)
    of = b._of
    assert of.local_epsilon is not None
    question: BitChannel = (
        MultiOptionResponse(len(of.options), of.max_choices, of.local_epsilon)
        if of.kind == "multi_choice"
        else BoundedResponse(of.max, of.local_epsilon)
    )
    return breakdown_channels(b)[0], question


# The kinds a breakdown may count, and what its cells are encoded with: one cell of a
# histogram for a single answer, a group's row of a multihot vector for several, a
# group's cell of an L1-bound sum for a number (one respondent moves the total by at
# most their value, however many cells there are: docs/PRIVACY.md).
_BREAKDOWN_VDAF = {
    "yes_no": "histogram",
    "choice": "histogram",
    "multi_choice": "multihot",
    "integer": "l1boundsum",
    "points": "l1boundsum",
}
BREAKDOWN_OF = tuple(_BREAKDOWN_VDAF)
# The kinds a breakdown may group by: one answer among a few named ones.
BREAKDOWN_BY = ("yes_no", "choice")


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
    # Half the interval's width aimed at, a share of each range (veil.survey.plan).
    target_error: Fraction | None = None
    # Answers only from invited respondents (veil.invite): one token per
    # question per invitation, so the privacy unit is one respondent.
    invitations: bool = False
    # [[breakdown]] tables: questions of kind "breakdown", each its own task.
    breakdowns: tuple[Question, ...] = ()

    @property
    def tasked(self) -> tuple[Question, ...]:
        """Everything that has a task of its own: the questions, then the breakdowns."""
        return (*self.questions, *self.breakdowns)

    @property
    def zcdp(self) -> bool:
        """Whether the survey composes under zCDP (some question is gaussian)."""
        return self.rho is not None

    @property
    def total(self) -> Fraction | None:
        """The survey's total budget in its unit (ε, or ρ under zCDP)."""
        return self.rho if self.rho is not None else self.epsilon

    def question(self, question_id: str) -> Question:
        """The question (or breakdown) with this id; raises KeyError if there is none."""
        for q in self.tasked:
            if q.id == question_id:
                return q
        raise KeyError(question_id)
