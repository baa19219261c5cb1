"""Reading a survey file: the strict TOML reader with file:line errors.

A survey is a TOML file with a ``[survey]`` table (name, total budget, DP
mechanism, batch settings) and one ``[[question]]`` table per question
(`veil.survey.model` says what each kind measures). Every setting is
checked here; a misspelt or misplaced one is refused, and every error names
the file, the line and what to change. The budget is divided among the
questions by `veil.survey.budget`.

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

A points question (``kind = "points"``) takes ``options`` (at least two) and
``total`` (1 to 1,000,000: the points a respondent splits across them, at most in
all); it takes no ``local_epsilon`` and is not asked under add_remove yet.

A text question (``kind = "text"``) takes ``max_bytes`` (1 to 64, default 16: the
longest answer in UTF-8 bytes, after normalisation), ``case_sensitive`` (default
false: answers are lower-cased), and at most one of ``threshold`` (the noisy count
an answer needs to be released) and ``min_share`` (that count as a share of
``expected_respondents``, which it then needs); without either, the threshold is
the least that keeps an answer given once from being released but one time in a
thousand (`veil.dp.heavy_hitters`). Its budget is spent over its byte levels, so
a level's share must still be a usable ε (or ρ); it takes no ``local_epsilon``.

A ``[[breakdown]]`` table (``id``, ``question``, ``by``) counts one question's
answers in each group of another (`veil.survey.model`): ``question`` names a
yes_no, choice, multi_choice or integer question, ``by`` a yes_no or choice
question. It is its own task, answered from the answers already given (a
question's randomized answer where it has ``local_epsilon``; a randomized
multi_choice's or integer's breakdown counts each group's respondents too, which
its de-biasing needs), and takes its share of the budget as a question does
(``epsilon``, ``rho`` or ``weight``, ``mechanism``, ``target_error``; ``text`` is
its title).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from veil.dp.errors import InvalidParameter
from veil.dp.heavy_hitters import DEFAULT_MAX_BYTES, MAX_TEXT_BYTES
from veil.dp.local import parse_local_epsilon
from veil.dp.mechanisms import MIN_EPSILON, MIN_RHO
from veil.settings import SettingsError, Source, Table, parse_toml
from veil.survey.budget import divide, exact_number, question_budget, survey_total
from veil.survey.model import (
    BREAKDOWN_BY,
    BREAKDOWN_OF,
    KINDS,
    MECHANISMS,
    Question,
    Survey,
    SurveyError,
)
from veil.task import DEFAULT_MAX_CLOCK_SKEW, DEFAULT_TIME_PRECISION
from veil.times import TimeFormatError, format_time, parse_time
from veil.vdaf import Field, Field64, Field128

# The most points a points question may split: its page keeps the running total in
# a browser's numbers, and its proof's size grows with the total's bits.
MAX_POINTS = 1_000_000

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
    "points": ("options", "total"),
    "text": ("max_bytes", "case_sensitive", "threshold", "min_share"),
}


BREAKDOWN_KEYS = (
    "id",
    "question",
    "by",
    "text",
    "epsilon",
    "rho",
    "weight",
    "mechanism",
    "target_error",
)
# The most cells (groups x categories) a breakdown may have, as a question's options.
MAX_CELLS = 100_000

_ALL_KIND_KEYS = sorted({k for keys in QUESTION_KIND_KEYS.values() for k in keys})


def article(word: str) -> str:
    """ "a" or "an" before `word` (by its first letter: enough for the kinds)."""
    return "an" if word[:1].lower() in "aeiou" else "a"


class _Locator:
    """Error messages at the line of a setting of [survey] or of a
    [[question]] (found by veil.settings.Source: tomllib reports no positions
    for valid TOML). The [[breakdown]] tables are numbered after the questions:
    index `questions` + j is breakdown j."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.source = Source(path, text)
        self.questions = 1 << 62

    def line_of(self, question: int | None, key: str | None) -> int:
        table: tuple[str | int, ...] = ("survey",) if question is None else ("question", question)
        if question is not None and question >= self.questions:
            table = ("breakdown", question - self.questions)
        return self.source.line_of(table, key) or 1

    def error(self, question: int | None, key: str | None, message: str) -> SurveyError:
        return SurveyError(f"{self.path}:{self.line_of(question, key)}: {message}")


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
        doc = parse_toml(text, path, ("survey", "question", "breakdown"))
        if not isinstance(doc.data.get("survey"), dict):
            raise SurveyError(f"{path}:1: missing [survey] table (name, epsilon)")
        # Every setting of [survey] is known here; a misspelt one is refused.
        head = doc.table("survey", SURVEY_KEYS).data
        doc.tables("question", (*QUESTION_COMMON_KEYS, *_ALL_KIND_KEYS))
        raw_breakdowns = [t.data for t in doc.tables("breakdown", BREAKDOWN_KEYS)]
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
    loc.questions = len(raw_questions)
    if raw_breakdowns and neighbouring_of(head) == "add_remove":
        raise loc.error(
            len(raw_questions),
            None,
            'a breakdown cannot be asked under neighbouring = "add_remove" yet: its cells'
            " would need a noisy count of each group, which its encoding does not carry",
        )
    # Breakdowns take their share of the budget as questions do, numbered after them.
    raw_questions = [*raw_questions, *raw_breakdowns]
    asked = len(raw_questions) - len(raw_breakdowns)

    neighbouring = neighbouring_of(head)
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
    total, delta = survey_total(loc, head, mechanism, zcdp)

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
        kind = raw.get("kind") if i < asked else "breakdown"
        if kind != "breakdown" and kind not in KINDS:
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
            value = exact_number(raw.get(key, 1))
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

    questions: list[Question] = []
    if total is None:
        shares = {i: Fraction(0) for i in range(len(raw_questions))}
    else:
        shares = divide(loc, total, unit, explicit, weights)
    for i, raw in enumerate(raw_questions):
        epsilon, rho = question_budget(loc, i, raw, mechanisms[i], shares[i], zcdp)
        if (epsilon is not None and epsilon < MIN_EPSILON) or (rho is not None and rho < MIN_RHO):
            key = next((k for k in ("epsilon", "rho") if k in raw), "weight")
            raise loc.error(
                i,
                key,
                f"this question's {'ρ' if rho is not None else 'ε'} {rho or epsilon} is below the"
                f" minimum {MIN_RHO if rho is not None else MIN_EPSILON}: the noise would bury"
                " its result; give it a larger share",
            )
        if i >= asked:
            questions.append(
                _breakdown(loc, i, raw, questions[:asked], epsilon, rho, mechanisms[i], shares[i])
            )
            continue
        questions.append(
            _question(
                loc, i, raw, epsilon, rho, mechanisms[i], shares[i], max_respondents, neighbouring
            )
        )
        if questions[-1].kind == "text":
            _check_text(loc, i, raw, questions[-1], expected)
    return Survey(
        name=str(head.get("name", Path(path).stem)),
        epsilon=None if zcdp else total,
        mechanism=mechanism,
        min_batch_size=min_batch,
        max_respondents=max_respondents,
        questions=tuple(questions[:asked]),
        breakdowns=tuple(questions[asked:]),
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


def neighbouring_of(head: Mapping[str, Any]) -> Any:
    """[survey]'s `neighbouring` as written (checked where the survey is parsed)."""
    return head.get("neighbouring", "replace_one")


def _breakdown(
    loc: _Locator,
    i: int,
    raw: Mapping[str, Any],
    questions: list[Question],
    epsilon: Fraction | None,
    rho: Fraction | None,
    mechanism: str,
    share: Fraction,
) -> Question:
    """A [[breakdown]] table (index `i` among questions and breakdowns): question
    `question` counted in each group of question `by`."""
    by_id = {q.id: q for q in questions}
    ids = ", ".join(by_id)
    named = []
    for key, what in (
        ("question", "the question it counts"),
        ("by", "the question whose answer is the group"),
    ):
        value = raw.get(key)
        if not isinstance(value, str):
            raise loc.error(
                i, key if key in raw else "id", f"each breakdown needs `{key}`: the id of {what}"
            )
        if value not in by_id:
            raise loc.error(
                i,
                key,
                f"`{key}` = {value!r} is not a question of this survey; its questions are {ids}",
            )
        named.append(by_id[value])
    of, by = named
    if of.id == by.id:
        raise loc.error(
            i,
            "by",
            f"breakdown {raw['id']!r} counts {of.id!r} by itself: every group would hold its own"
            " answer only; name another question in `by`",
        )
    if by.kind not in BREAKDOWN_BY:
        raise loc.error(
            i,
            "by",
            f"`by` = {by.id!r} is {article(by.kind)} {by.kind} question: a breakdown groups"
            " respondents by the answer to a yes_no or choice question",
        )
    if of.kind == "text":
        raise loc.error(
            i,
            "question",
            f"`question` = {of.id!r} is a text question, which cannot be broken down: its"
            " answers are found by their frequency among all respondents, not counted per group",
        )
    if of.kind not in BREAKDOWN_OF:
        raise loc.error(
            i,
            "question",
            f"`question` = {of.id!r} is {article(of.kind)} {of.kind} question; a breakdown counts"
            f" a {', '.join(BREAKDOWN_OF[:-1])} or {BREAKDOWN_OF[-1]} question",
        )
    groups = len(by.options) or 2
    cells = groups * (len(of.options) or (2 if of.kind == "yes_no" else 1))
    if cells > MAX_CELLS:
        raise loc.error(
            i,
            "question",
            f"breakdown {raw['id']!r} has {cells} cells (groups x categories): at most"
            f" {MAX_CELLS} are supported",
        )
    text = raw.get("text", f"{of.text} (by {by.text})")
    if not isinstance(text, str) or not text:
        raise loc.error(i, "text", f"`text` must be a title in words, got {text!r}")
    return Question(
        id=raw["id"],
        text=text,
        kind="breakdown",
        epsilon=epsilon,
        rho=rho,
        mechanism=mechanism,
        share=share,
        target_error=_target_error(loc, i, raw),
        of=of,
        by=by,
    )


def _target_error(loc: _Locator, i: int | None, table: Mapping[str, Any]) -> Fraction | None:
    """`target_error` of [survey] or of a question: a share of the range in (0, 1]."""
    if "target_error" not in table:
        return None
    try:
        value = exact_number(table["target_error"])
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
            common["local_epsilon"] = parse_local_epsilon(exact_number(raw["local_epsilon"]))
        except (ValueError, ZeroDivisionError) as e:
            raise loc.error(
                i, "local_epsilon", f"`local_epsilon` must be a number in (0, 20]: {e}"
            ) from None
    if kind == "yes_no":
        return Question(**common)
    if kind == "points":
        _points_allowed(loc, i, raw, neighbouring)
    if kind == "text":
        return _text_question(loc, i, raw, common)
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
    if kind == "points":
        top = min(MAX_POINTS, _max_fitting(Field128, respondents))
        return Question(
            **common, options=tuple(options), total=_positive_int(loc, i, raw, "total", top)
        )
    max_choices = _positive_int(loc, i, raw, "max_choices", len(options))
    return Question(**common, options=tuple(options), max_choices=max_choices)


def _points_allowed(loc: _Locator, i: int, raw: Mapping[str, Any], neighbouring: str) -> None:
    """What a points question cannot be asked with (yet), refused at its line."""
    if "total" not in raw:
        raise loc.error(
            i, "kind", "a points question needs `total`: the points a respondent splits (e.g. 100)"
        )
    if neighbouring == "add_remove":
        raise loc.error(
            i,
            "kind",
            'a points question cannot be asked under neighbouring = "add_remove" yet: its'
            " means need a count of respondents, which its proof does not carry",
        )
    if "local_epsilon" in raw:
        raise loc.error(
            i,
            "local_epsilon",
            "a points question takes no `local_epsilon`: randomized response over a split of"
            " points is not supported; its answers are protected by the servers' noise",
        )


def _text_question(
    loc: _Locator, i: int, raw: Mapping[str, Any], common: dict[str, Any]
) -> Question:
    """A text question's own settings (the checks against the budget: `_check_text`)."""
    if common["neighbouring"] == "add_remove":
        raise loc.error(
            i,
            "kind",
            'a text question cannot be asked under neighbouring = "add_remove" yet: its'
            " answers' shares need a noisy count of respondents, which Poplar1 does not carry",
        )
    if "local_epsilon" in raw:
        raise loc.error(
            i,
            "local_epsilon",
            "a text question takes no `local_epsilon`: randomized response over strings is not"
            " supported; its answers are protected by the servers' noise and the threshold",
        )
    max_bytes = raw.get("max_bytes", DEFAULT_MAX_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
        raise loc.error(
            i, "max_bytes", f"`max_bytes` must be a whole number of bytes, got {max_bytes!r}"
        )
    if not 1 <= max_bytes <= MAX_TEXT_BYTES:
        raise loc.error(
            i,
            "max_bytes",
            f"`max_bytes` must be from 1 to {MAX_TEXT_BYTES}, got {max_bytes} (each byte is one"
            " collection, and takes its share of the question's budget)",
        )
    case_sensitive = raw.get("case_sensitive", False)
    if not isinstance(case_sensitive, bool):
        raise loc.error(
            i, "case_sensitive", f"`case_sensitive` must be true or false, got {case_sensitive!r}"
        )
    if "threshold" in raw and "min_share" in raw:
        raise loc.error(i, "min_share", "give a text question `threshold` or `min_share`, not both")
    threshold = raw.get("threshold")
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1
    ):
        raise loc.error(
            i,
            "threshold",
            f"`threshold` must be a whole number of respondents, at least 1, got {threshold!r}",
        )
    min_share = None
    if "min_share" in raw:
        try:
            min_share = exact_number(raw["min_share"])
        except (ValueError, ZeroDivisionError):
            min_share = Fraction(-1)
        if not 0 < min_share <= 1:
            raise loc.error(
                i,
                "min_share",
                "`min_share` must be a share of the respondents from 0 to 1 (0.02: answers"
                f" given by 2%), got {raw['min_share']!r}",
            )
    return Question(
        **common,
        max_bytes=max_bytes,
        case_sensitive=case_sensitive,
        threshold=threshold,
        min_share=min_share,
    )


def _check_text(
    loc: _Locator, i: int, raw: Mapping[str, Any], q: Question, expected: int | None
) -> None:
    """A text question's budget must stretch over its levels, and `min_share` needs
    the respondents it is a share of."""
    if q.min_share is not None and expected is None:
        raise loc.error(
            i,
            "min_share",
            "`min_share` is a share of the expected respondents: set `expected_respondents`"
            " in [survey], or give `threshold` (a count) instead",
        )
    try:
        q.release_threshold(expected)
    except InvalidParameter as e:
        key = next(
            (k for k in ("threshold", "epsilon", "rho", "weight", "max_bytes") if k in raw), "kind"
        )
        raise loc.error(
            i, key, f"text question {q.id!r}: {e}; give it a larger share or fewer max_bytes"
        ) from None


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
