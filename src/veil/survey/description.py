"""The public survey description, ``survey.json``: what respondents see.

`veil survey deploy` writes it to the deployment's client/ directory beside
one client task file per question; `SurveyClient` (veil.client) and
`veil survey serve` read it back with `load_description`, and check each
question's task file against it with `Description.load_tasks`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from veil.dp.accounting import DEFAULT_DELTA
from veil.dp.heavy_hitters import MAX_TEXT_BYTES
from veil.dp.local import parse_local_epsilon
from veil.survey.model import (
    BREAKDOWN_BY,
    BREAKDOWN_OF,
    KINDS,
    MECHANISMS,
    Question,
    Survey,
    SurveyError,
)
from veil.task import ClientTask, TaskError, load_task
from veil.times import TimeFormatError, format_time, parse_time

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
    `max` and, when named, `labels`; points `options` and `total`; text
    `max_bytes` and `case_sensitive` (how the device normalises an answer).
    `task_file` is the question's client task file in the same directory
    (VDAF, aggregators, HPKE config); `task_id` is its task id, so a reader
    can check that the two belong together. A report
    for a question is uploaded under that task with a time in [opens, closes).
    A survey with breakdowns lists them under ``"breakdowns"`` after the
    questions, each with `id`, `text`, ``"kind": "breakdown"``, `question` and
    `by` (the ids of the question counted and of the group question), its
    budget, `task_file` and `task_id`: a respondent's device answers it from
    the two answers (`Question.breakdown_measurement`). Nothing in it is secret.
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
        if q.kind == "points":
            d["total"] = q.total
        if q.kind == "vector":
            d["length"] = q.length
            if q.labels:
                d["labels"] = list(q.labels)
        if q.kind == "text":
            # What the device needs to normalise and encode an answer.
            d["max_bytes"] = q.max_bytes
            d["case_sensitive"] = q.case_sensitive
        questions.append(d)
    breakdowns = []
    for b in survey.breakdowns:
        assert b.of is not None and b.by is not None
        d = {"id": b.id, "text": b.text, "kind": b.kind, "question": b.of.id, "by": b.by.id}
        d["mechanism"] = b.mechanism
        if b.rho is not None:
            d["rho"] = str(b.rho)
        elif b.epsilon is not None:
            d["epsilon"] = str(b.epsilon)
        d["task_file"] = f"{b.id}.toml"
        d["task_id"] = task_ids[b.id]
        breakdowns.append(d)
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
    if breakdowns:
        out["breakdowns"] = breakdowns
    return out


@dataclass(frozen=True)
class Description:
    """A parsed public survey description; `task_files` maps question id to
    its client task file."""

    survey: Survey
    task_files: Mapping[str, Path]
    task_ids: Mapping[str, str]
    # The JSON object as read, served again as it is (`veil survey serve`).
    document: Mapping[str, Any] = field(default_factory=dict)

    def load_tasks(self) -> dict[str, ClientTask]:
        """Each question's (and breakdown's) client task file, by its id, checked
        against the task id the description names for it; SurveyError says which
        question's file is unreadable or belongs to another deployment."""
        tasks = {}
        for q in self.survey.tasked:
            path = self.task_files[q.id]
            try:
                task = load_task(path, ClientTask)
            except (OSError, TaskError) as e:
                raise SurveyError(f"question {q.id!r}: cannot read its task file: {e}") from None
            if task.id_text != self.task_ids[q.id]:
                raise SurveyError(
                    f"question {q.id!r}: {path.name} is the task {task.id_text}, but the survey"
                    f" description names {self.task_ids[q.id]}: the directory mixes two"
                    " deployments"
                )
            tasks[q.id] = task
        return tasks


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
        if kind in ("choice", "multi_choice", "points"):
            options = _get(raw, "options", list, at)
            if len(options) < 2 or not all(isinstance(o, str) and o for o in options):
                raise SurveyError(f"{at}: `options` must be a list of at least two names")
            if kind == "points" and len(set(options)) != len(options):
                # Points are given by option name: a repeated one could not be told apart.
                raise SurveyError(f"{at}: `options` must not repeat a name")
            fields["options"] = tuple(options)
        if kind == "multi_choice":
            fields["max_choices"] = _get(raw, "max_choices", int, at)
        if kind in ("integer", "vector"):
            fields["max"] = _get(raw, "max", int, at)
        if kind == "points":
            fields["total"] = _get(raw, "total", int, at)
            if fields["total"] < 1:
                raise SurveyError(f"{at}: `total` must be at least 1")
        if kind == "vector":
            fields["length"] = _get(raw, "length", int, at)
            labels = raw.get("labels", [])
            if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                raise SurveyError(f"{at}: `labels` must be a list of names")
            fields["labels"] = tuple(labels)
        if kind == "text":
            max_bytes = _get(raw, "max_bytes", int, at)
            if not 1 <= max_bytes <= MAX_TEXT_BYTES:
                raise SurveyError(f"{at}: `max_bytes` must be from 1 to {MAX_TEXT_BYTES}")
            fields["max_bytes"] = max_bytes
            fields["case_sensitive"] = _get(raw, "case_sensitive", bool, at)
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
    breakdowns = _breakdowns(doc, questions, files, ids, path, where, neighbouring)
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
        breakdowns=breakdowns,
        path=where,
        opens=opens,
        closes=closes,
        time_precision=_get(doc, "time_precision", int, where),
        max_clock_skew=_get(doc, "max_clock_skew", int, where),
        id=_get(doc, "id", str, where),
        invitations=_get(doc, "invitations", bool, where) if "invitations" in doc else False,
    )
    return Description(survey, files, ids, doc)


def _breakdowns(
    doc: Mapping[str, Any],
    questions: list[Question],
    files: dict[str, Path],
    ids: dict[str, str],
    path: Path,
    where: str,
    neighbouring: str,
) -> tuple[Question, ...]:
    """survey.json's "breakdowns", each resolved to its two questions; their task
    files and ids are added to `files` and `ids`."""
    raw_list = doc.get("breakdowns", [])
    if not isinstance(raw_list, list):
        raise SurveyError(f"{where}: `breakdowns` must be a list")
    by_id = {q.id: q for q in questions}
    out = []
    for n, raw in enumerate(raw_list):
        at = f"{where}: breakdown {n + 1}"
        if not isinstance(raw, dict):
            raise SurveyError(f"{at}: not an object")
        bid = _get(raw, "id", str, at)
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", bid) or bid in files:
            raise SurveyError(f"{at}: bad or repeated id {bid!r}")
        if raw.get("kind") != "breakdown":
            raise SurveyError(f'{at}: `kind` must be "breakdown"')
        of = by_id.get(_get(raw, "question", str, at))
        by = by_id.get(_get(raw, "by", str, at))
        if of is None or by is None or of is by:
            raise SurveyError(f"{at}: `question` and `by` must name two questions of the survey")
        if of.kind not in BREAKDOWN_OF or by.kind not in BREAKDOWN_BY:
            raise SurveyError(
                f"{at}: a breakdown counts a {', '.join(BREAKDOWN_OF)} question by a"
                f" {' or '.join(BREAKDOWN_BY)} question, not {of.kind} by {by.kind}"
            )
        task_file = _get(raw, "task_file", str, at)
        if Path(task_file).name != task_file:
            raise SurveyError(f"{at}: `task_file` must name a file in the same directory")
        files[bid] = path.parent / task_file
        ids[bid] = _get(raw, "task_id", str, at)
        try:
            b_eps, b_rho = (
                Fraction(_get(raw, key, str, at)) if key in raw else None
                for key in ("epsilon", "rho")
            )
        except (ValueError, ZeroDivisionError) as e:
            raise SurveyError(f"{at}: {e}") from None
        mechanism = raw.get("mechanism", doc.get("mechanism"))
        if mechanism not in MECHANISMS:
            raise SurveyError(f"{at}: unknown mechanism {mechanism!r}")
        text = _get(raw, "text", str, at)
        out.append(
            Question(
                id=bid,
                text=text,
                kind="breakdown",
                epsilon=b_eps,
                rho=b_rho,
                mechanism=mechanism,
                neighbouring=neighbouring,
                of=of,
                by=by,
            )
        )
    return tuple(out)
