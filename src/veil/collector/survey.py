"""Collecting a whole survey once its window has closed: `veil survey collect`.

The survey operator's collector/ directory holds the survey file and one
collector task file per question. Every question is collected over exactly
the window [opens, closes), once. The run is resumable: RESULTS/state.json
records each question's collection job id *before* the job is created, so a
run killed at any point is resumed by running it again, which polls the same
jobs (the leader answers a known job id with the same job, and serves a
finished job's sealed shares again) and never starts a second collection of a
question. Before any batch is closed, every question's collector HPKE key is
checked against the one the leader's task seals to.

When every question is collected the run writes RESULTS/results.json,
RESULTS/results.csv and RESULTS/report.html (veil.collector.report_page).
"""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from veil.collector.collector import (
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
)
from veil.dp.accounting import decimal_text
from veil.dp.estimates import Estimate
from veil.survey import Question, Survey, SurveyError, load_survey
from veil.task import CollectorTask, TaskError, load_task
from veil.times import format_duration, format_time

STATE_FILE = "state.json"
STATE_FORMAT = "veil-survey-collection/1"


class SurveyCollectError(Exception):
    """The survey cannot be collected (now, or with these files); nothing was closed."""


class SurveyStillOpen(SurveyCollectError):
    """The window has not closed yet."""


@dataclass(frozen=True)
class Row:
    label: str
    estimate: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class QuestionResults:
    """One question's published result (one object of results.json)."""

    question: Question
    n: int
    privacy: dict[str, str]
    rows: tuple[Row, ...]
    unit: str
    confidence: float
    intervals: str = "per-coordinate"

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question.id,
            "text": self.question.text,
            "kind": self.question.kind,
            "n": self.n,
            **self.privacy,
            "confidence": self.confidence,
            "intervals": self.intervals,
            "rows": [
                {"label": r.label, "estimate": r.estimate, "ci_low": r.ci_low, "ci_high": r.ci_high}
                for r in self.rows
            ],
        }


def _f(x: Fraction) -> float:
    return round(float(x), 6)


def question_results(q: Question, r: CollectionResult) -> QuestionResults:
    """Labelled rows of one collected question: option names for choices;
    "yes" for yes_no; "mean" (the noisy sum over the report count) and "sum"
    for an integer; each element's mean for a vector (its labels, or [i]).

    Under add_remove the collector is not told the report count: `n` is the noisy
    count, and every row is a ratio of noisy sums (the share of yes, of each
    option, of respondents choosing each option; the mean per element), with an
    interval that holds whenever the question's simultaneous intervals do."""
    if q.add_remove:
        return _ratio_results(q, r)
    n = r.report_count
    est = r.estimate if isinstance(r.estimate, list) else [r.estimate]
    low = r.lower if isinstance(r.lower, list) else [r.lower]
    high = r.upper if isinstance(r.upper, list) else [r.upper]
    rows: list[Row]
    if q.kind == "yes_no":
        rows = [Row("yes", _f(est[0]), _f(low[0]), _f(high[0]))]
        unit = "respondents"
    elif q.kind == "integer":
        rows = [
            Row("mean", _f(est[0] / n), _f(low[0] / n), _f(high[0] / n)),
            Row("sum", _f(est[0]), _f(low[0]), _f(high[0])),
        ]
        unit = f"mean answer (0 to {q.max})"
    elif q.kind == "vector":
        rows = [
            Row(label, _f(e / n), _f(lo / n), _f(hi / n))
            for label, e, lo, hi in zip(q.element_labels(), est, low, high, strict=True)
        ]
        unit = f"mean answer (0 to {q.max})"
    else:
        rows = [
            Row(label, _f(e), _f(lo), _f(hi))
            for label, e, lo, hi in zip(q.options, est, low, high, strict=True)
        ]
        unit = "respondents"
    # This collection's guarantee against the collector: {"epsilon", "delta"},
    # or {"rho", "epsilon", "delta"} under zCDP (veil.dp.accounting.Guarantee).
    privacy = r.against_collector.to_json() or {"epsilon": "none"}
    if q.local_epsilon is not None:
        # Answers randomized on the device (veil.dp.local): the estimates are
        # de-biased, and each answer is ε_L-private even against both aggregators.
        privacy = {**privacy, "local_epsilon": decimal_text(q.local_epsilon)}
    return QuestionResults(q, n, privacy, tuple(rows), unit, r.confidence, r.intervals)


def _ratio_results(q: Question, r: CollectionResult) -> QuestionResults:
    values = r.estimate if isinstance(r.estimate, list) else [r.estimate]
    lows = r.lower if isinstance(r.lower, list) else [r.lower]
    highs = r.upper if isinstance(r.upper, list) else [r.upper]
    coords = [
        Estimate(Fraction(v), Fraction(lo), Fraction(hi), r.confidence, r.confidence)
        for v, lo, hi in zip(values, lows, highs, strict=True)
    ]
    results, count = q.ratio_estimates(coords)
    labels: tuple[str, ...]
    if q.kind == "yes_no":
        labels, unit = ("yes",), "share of respondents"
    elif q.kind in ("choice", "multi_choice"):
        labels, unit = q.options, "share of respondents"
    elif q.kind == "integer":
        labels, unit = ("mean",), f"mean answer (0 to {q.max})"
    else:
        labels, unit = q.element_labels(), f"mean answer (0 to {q.max})"
    rows = tuple(
        Row(label, _f(e.value), _f(e.low), _f(e.high))
        for label, e in zip(labels, results, strict=True)
    )
    privacy = r.against_collector.to_json() or {"epsilon": "none"}
    privacy = {**privacy, "neighbouring": "add_remove"}
    n = max(round(count.value), 0)
    return QuestionResults(q, n, privacy, rows, unit, r.confidence, r.intervals)


@dataclass
class State:
    """RESULTS/state.json: the batch and each question's collection job."""

    survey: str
    start: int
    duration: int
    jobs: dict[str, str] = field(default_factory=dict)  # question id -> job id (hex)
    failed: dict[str, str] = field(default_factory=dict)  # question id -> last failure

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "survey": self.survey,
            "batch": {"start": self.start, "duration": self.duration},
            "jobs": self.jobs,
            "failed": self.failed,
        }

    def save(self, path: Path) -> None:
        """Atomically and durably: a job id must be on disk before its job exists."""
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def load(path: Path, survey: Survey, start: int, duration: int) -> State:
        if not path.exists():
            return State(survey.id, start, duration)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("format") != STATE_FORMAT:
                raise ValueError("not a survey collection state file")
            state = State(
                str(doc["survey"]),
                int(doc["batch"]["start"]),
                int(doc["batch"]["duration"]),
                {str(k): str(v) for k, v in doc["jobs"].items()},
                {str(k): str(v) for k, v in doc.get("failed", {}).items()},
            )
            for job in state.jobs.values():
                if len(bytes.fromhex(job)) != 16:
                    raise ValueError(f"bad collection job id {job!r}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SurveyCollectError(
                f"{path}: cannot resume from it ({e}); it is not a state file this command wrote"
            ) from None
        if (state.survey, state.start, state.duration) != (survey.id, start, duration):
            raise SurveyCollectError(
                f"{path} records the collection of survey {state.survey!r} over another batch:"
                " give another --out directory"
            )
        return state


@dataclass(frozen=True)
class SurveyFiles:
    survey: Survey
    tasks: dict[str, CollectorTask]


def load_collector_dir(directory: Path) -> SurveyFiles:
    """The survey and each question's collector task file, checked together."""
    try:
        survey = load_survey(directory / "survey.toml")
    except SurveyError as e:
        raise SurveyCollectError(
            f"{e} (give the collector/ directory that `veil survey deploy` wrote)"
        ) from None
    if survey.opens is None or survey.closes is None:
        raise SurveyCollectError(f"{survey.path}: the survey has no window (`opens`, `closes`)")
    tasks = {}
    for q in survey.questions:
        path = directory / f"{q.id}.toml"
        try:
            task = load_task(path, CollectorTask)
        except (OSError, TaskError) as e:
            raise SurveyCollectError(f"question {q.id!r}: {e}") from None
        if (task.not_before, task.not_after) != (survey.opens, survey.closes):
            raise SurveyCollectError(
                f"{path}: the task's window is not the survey's [{format_time(survey.opens)},"
                f" {format_time(survey.closes)})"
            )
        tasks[q.id] = task
    return SurveyFiles(survey, tasks)


@dataclass
class Outcome:
    """What one run did: results of the collected questions, and why the
    others are not collected yet (to be resumed by running again)."""

    results: list[QuestionResults]
    pending: dict[str, str]

    @property
    def complete(self) -> bool:
        return not self.pending


def collect_survey(
    directory: Path,
    out: Path,
    *,
    leader_root_certificates: bytes | None = None,
    wait: float = 300.0,
    confidence: float = 0.95,
    clock: Callable[[], float] = time.time,
    say: Callable[[str], None] = lambda _: None,
) -> Outcome:
    """Collect every question over [opens, closes), or resume a run that
    stopped. Raises SurveyStillOpen before `closes`, SurveyCollectError
    (WrongCollectorKey as its cause) when nothing may be collected."""
    files = load_collector_dir(directory)
    survey = files.survey
    assert survey.opens is not None and survey.closes is not None
    now = clock()
    if now < survey.closes:
        raise SurveyStillOpen(
            f"the survey closes at {format_time(survey.closes)}, in"
            f" {format_duration(survey.closes - now)}: collect after that (nothing was collected;"
            " collecting earlier would stop respondents from answering)"
        )
    start, duration = survey.opens, survey.closes - survey.opens
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / STATE_FILE
    state = State.load(state_path, survey, start, duration)
    collectors = {
        qid: Collector(task, leader_root_certificates=leader_root_certificates)
        for qid, task in files.tasks.items()
    }
    try:
        # Every key is checked before any batch is closed: one wrong file
        # must not cost the questions collected before it is found.
        for q in survey.questions:
            if q.id not in state.jobs:
                try:
                    collectors[q.id].check_collector_key()
                except CollectionError as e:
                    raise SurveyCollectError(f"question {q.id!r}: {e.message}") from e
        results: list[QuestionResults] = []
        pending: dict[str, str] = {}
        for q in survey.questions:
            job_hex = state.jobs.get(q.id)
            if job_hex is None:
                job_hex = secrets.token_bytes(16).hex()
                state.jobs[q.id] = job_hex
                state.save(state_path)  # before the job exists: a kill now resumes it
                say(f"{q.id}: collecting (job {job_hex})")
            else:
                say(f"{q.id}: resuming job {job_hex}")
            try:
                r = collectors[q.id].collect(
                    start,
                    duration,
                    wait=wait,
                    confidence=confidence,
                    # One level for the whole question: every row's interval
                    # holds at once at `confidence` (the row count is public).
                    simultaneous=True,
                    collection_job_id=bytes.fromhex(job_hex),
                )
            except CollectionJobFailed as e:
                # The job is over; the next run may start another (the
                # aggregators still refuse a batch already collected).
                del state.jobs[q.id]
                state.failed[q.id] = f"{e.code.name}: {e.message}"
                state.save(state_path)
                pending[q.id] = f"the collection failed: {e.code.name}: {e.message}"
                continue
            except CollectionError as e:
                pending[q.id] = f"{e.code.name}: {e.message} (run again to resume job {job_hex})"
                continue
            state.failed.pop(q.id, None)
            results.append(question_results(q, r))
            say(f"{q.id}: {r.report_count} reports")
        state.save(state_path)
    finally:
        for c in collectors.values():
            c.close()
    if not pending:
        write_results(survey, results, out)
    return Outcome(results, pending)


def results_json(results: Sequence[QuestionResults]) -> str:
    return json.dumps([r.to_json() for r in results], indent=2, ensure_ascii=False) + "\n"


def results_csv(results: Sequence[QuestionResults]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["question", "kind", "n", "label", "estimate", "ci_low", "ci_high"])
    for r in results:
        for row in r.rows:
            w.writerow(
                [
                    r.question.id,
                    r.question.kind,
                    r.n,
                    row.label,
                    row.estimate,
                    row.ci_low,
                    row.ci_high,
                ]
            )
    return buf.getvalue()


def write_results(survey: Survey, results: Sequence[QuestionResults], out: Path) -> None:
    from veil.collector.report_page import report_html

    (out / "results.json").write_text(results_json(results), encoding="utf-8")
    (out / "results.csv").write_text(results_csv(results), encoding="utf-8")
    (out / "report.html").write_text(report_html(survey, results), encoding="utf-8")
