"""Collecting a whole survey once its window has closed: `veil survey collect`.

The survey operator's collector/ directory holds the survey file and one
collector task file per question. Every question is collected over exactly
the window [opens, closes), once. The run is resumable: RESULTS/state.json
records each question's collection job id *before* the job is created, so a
run killed at any point is resumed by running it again, which polls the same
jobs (the leader answers a known job id with the same job, and serves a
finished job's sealed shares again) and never starts a second collection of a
question. Over DAP the leader names the job: its id is recorded as soon as
the leader answers the request, and a run stopped before that sends the same
request again, which a veil leader answers with the same job; a job kept
that the leader no longer holds (404) is asked for again so too. Before
any batch is closed, every question's collector HPKE key is checked against
the one the leader's task seals to (over gRPC).

A text question is collected level by level (`veil.collector.text`): one
collection of the same batch per byte of its answers, each asking for the
survivors of the last extended by every byte. state.json keeps its progress
(the levels done, the survivors and their noisy counts, the job of the level
under way, written before that job exists), so a run stopped between or during
levels resumes where it stopped.

When every question is collected the run writes RESULTS/results.json,
RESULTS/results.csv (veil.survey.results) and RESULTS/report.html
(veil.render.html).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from veil.collector.collector import (
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
    text_agg_param,
)
from veil.collector.dap import DapCollector, collector_for
from veil.collector.estimate import SIMULTANEOUS_BONFERRONI
from veil.collector.text import LevelQuery, TextProgress, descend
from veil.dp.accounting import Guarantee
from veil.dp.counted import counted_breakdown_estimate
from veil.dp.local import breakdown_estimate
from veil.files import replace_file
from veil.render.html import report_html
from veil.survey import Survey, SurveyError, load_survey
from veil.survey.model import Question, counted, counted_channels
from veil.survey.reconciled import reconcile_results
from veil.survey.results import (
    QuestionResult,
    question_result,
    results_csv,
    results_json,
    text_result,
)
from veil.survey.text import MAX_PREFIXES
from veil.task import CollectorTask, Task, TaskError, load_task
from veil.times import format_duration, format_time

__all__ = [
    "SurveyCollectError",
    "SurveyStillOpen",
    "collect_survey",
    "level_query",
    "load_collector_dir",
    "local_breakdown",
    "text_guarantee",
    "write_results",
]

STATE_FILE = "state.json"
STATE_FORMAT = "veil-survey-collection/1"


class SurveyCollectError(Exception):
    """The survey cannot be collected (now, or with these files); nothing was closed."""


class SurveyStillOpen(SurveyCollectError):
    """The window has not closed yet."""


@dataclass
class State:
    """RESULTS/state.json: the batch and each question's collection job."""

    survey: str
    start: int
    duration: int
    jobs: dict[str, str] = field(default_factory=dict)  # question id -> job id (hex)
    failed: dict[str, str] = field(default_factory=dict)  # question id -> last failure
    # Text questions: question id -> {"progress": TextProgress, "report_count": n}.
    text: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "survey": self.survey,
            "batch": {"start": self.start, "duration": self.duration},
            "jobs": self.jobs,
            "failed": self.failed,
            "text": {
                qid: {"progress": t["progress"].to_json(), "report_count": t["report_count"]}
                for qid, t in self.text.items()
            },
        }

    def save(self, path: Path) -> None:
        """Atomically and durably: a job id must be on disk before its job exists."""
        # Written beside it and renamed over it, never through a link at its name.
        replace_file(path, json.dumps(self.to_json(), indent=2).encode())
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
                {
                    str(k): {
                        "progress": TextProgress.from_json(v["progress"]),
                        "report_count": int(v["report_count"]),
                    }
                    for k, v in doc.get("text", {}).items()
                },
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


def load_collector_dir(directory: str | os.PathLike[str]) -> SurveyFiles:
    """The survey and each question's collector task file, checked together."""
    directory = Path(directory)
    try:
        survey = load_survey(directory / "survey.toml")
    except SurveyError as e:
        raise SurveyCollectError(
            f"{e} (give the collector/ directory that `veil survey deploy` wrote)"
        ) from None
    if survey.opens is None or survey.closes is None:
        raise SurveyCollectError(f"{survey.path}: the survey has no window (`opens`, `closes`)")
    tasks = {}
    for q in survey.tasked:
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
    """What one run did: results of the collected questions, why the others
    are not collected yet (to be resumed by running again), and the questions
    another collection already took (`elsewhere`: running again cannot help;
    `collected_into` is where this collector/ directory last collected to)."""

    results: list[QuestionResult]
    pending: dict[str, str]
    elsewhere: dict[str, str] = field(default_factory=dict)
    collected_into: Path | None = None
    # Text questions a level of which failed: each aggregator takes a level
    # of a batch once, so running again cannot collect them.
    ended: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.pending and not self.elsewhere and not self.ended


@dataclass(frozen=True)
class _Ended:
    """A text question whose level failed: why (it cannot be resumed)."""

    why: str


class CollectedElsewhere(SurveyCollectError):
    """The survey is collected into another results directory; `where` is it."""

    def __init__(self, message: str, where: Path) -> None:
        super().__init__(message)
        self.where = where


# In the collector/ directory: where its survey is collected to (its RESULTS
# directory), so that a run into another --out can say where to look.
RECORD_FILE = "collected-into.json"
RECORD_FORMAT = "veil-survey-collected-into/1"


def collected_into(directory: str | os.PathLike[str]) -> Path | None:
    """The results directory the survey of `directory` is collected into, if
    a `veil survey collect` recorded one there (None: none, or unreadable)."""
    try:
        doc = json.loads((Path(directory) / RECORD_FILE).read_text(encoding="utf-8"))
        if doc.get("format") != RECORD_FORMAT or not isinstance(doc.get("results"), str):
            return None
        return Path(doc["results"])
    except (OSError, ValueError, AttributeError):
        return None


def _record(directory: Path, out: Path) -> None:
    """Best effort: a read-only collector/ directory still collects."""
    tmp = directory / (RECORD_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps({"format": RECORD_FORMAT, "results": str(out)}) + "\n")
        os.replace(tmp, directory / RECORD_FILE)
    except OSError:
        tmp.unlink(missing_ok=True)


def collect_survey(
    directory: str | os.PathLike[str],
    out: str | os.PathLike[str],
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
    out = Path(out)
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
    here = out.resolve()
    before = collected_into(directory)
    if (
        before is not None
        and before != here
        and (before / STATE_FILE).exists()
        and not (out / STATE_FILE).exists()
    ):
        # A second set of jobs would be refused question by question: the
        # batches are collected once, by the jobs in that state file.
        raise CollectedElsewhere(
            f"this survey is collected into {before} (its {STATE_FILE} keeps the collection"
            " jobs, and each question is collected only once): its results are there; to"
            f" resume that collection or write its results again, give --out {before}",
            before,
        )
    out.mkdir(parents=True, exist_ok=True)
    if before != here:
        _record(Path(directory), here)
    state_path = out / STATE_FILE
    state = State.load(state_path, survey, start, duration)
    # Over DAP for a survey deployed with --protocol dap (its tasks' [dap] tables).
    collectors = {
        qid: collector_for(task, leader_root_certificates=leader_root_certificates)
        for qid, task in files.tasks.items()
    }
    try:
        # Every key is checked before any batch is closed: one wrong file
        # must not cost the questions collected before it is found. DAP has no
        # call to ask the leader for it: a share sealed to another key fails,
        # named, when it is opened (docs/DAP.md).
        for q in survey.tasked:
            c = collectors[q.id]
            if isinstance(c, Collector) and q.id not in state.jobs and q.id not in state.text:
                try:
                    c.check_collector_key()
                except CollectionError as e:
                    raise SurveyCollectError(f"question {q.id!r}: {e.message}") from e
        results: list[QuestionResult] = []
        collected: dict[str, CollectionResult] = {}
        pending: dict[str, str] = {}
        elsewhere: dict[str, str] = {}
        ended: dict[str, str] = {}
        for q in survey.tasked:
            if q.kind == "text":
                text_collector = collectors[q.id]
                assert isinstance(text_collector, Collector)  # no text question over DAP
                outcome = _collect_text(
                    survey, q, text_collector, state, state_path, wait, confidence, say
                )
                if isinstance(outcome, _Ended):
                    ended[q.id] = outcome.why
                elif isinstance(outcome, str):
                    pending[q.id] = outcome
                else:
                    results.append(outcome)
                continue
            job_hex = state.jobs.get(q.id)
            over_dap = files.tasks[q.id].dap is not None
            if job_hex is not None:
                say(f"{q.id}: resuming job {job_hex}")
            elif over_dap:
                # A DAP leader names the job itself (its Location), kept once
                # it is created (`on_job`); until then the same request finds it.
                say(f"{q.id}: collecting over DAP (the leader names the job from the request)")
            else:
                job_hex = secrets.token_bytes(16).hex()
                state.jobs[q.id] = job_hex
                state.save(state_path)  # before the job exists: a kill now resumes it
                say(f"{q.id}: collecting (job {job_hex})")
            job = _Job(q.id, collectors[q.id], state, state_path, say)
            try:
                try:
                    r = job.collect(start, duration, job_hex, wait, confidence)
                except CollectionError as e:
                    if not over_dap or job_hex is None or e.code is not grpc.StatusCode.NOT_FOUND:
                        raise
                    # The leader no longer holds the job kept (deleted, or
                    # another leader's): the same request finds or recreates it.
                    say(
                        f"{q.id}: the leader holds no job {job_hex} ({e.message}); asking again"
                        " with the same request, which finds or recreates the job"
                    )
                    state.jobs.pop(q.id, None)
                    state.save(state_path)
                    job_hex = None
                    r = job.collect(start, duration, None, wait, confidence)
            except CollectionJobFailed as e:
                # The job is over; the next run may start another (the
                # aggregators still refuse a batch already collected).
                state.jobs.pop(q.id, None)
                state.failed[q.id] = f"{e.code.name}: {e.message}"
                state.save(state_path)
                pending[q.id] = f"the collection failed: {e.code.name}: {e.message}"
                continue
            except CollectionError as e:
                if e.kind == "batch_collected":
                    # Another job (another --out, another copy of collector/)
                    # took this batch; this one was never created.
                    state.jobs.pop(q.id, None)
                    state.save(state_path)
                    elsewhere[q.id] = e.message
                    continue
                job_hex = state.jobs.get(q.id)  # a DAP leader's, once it named it
                again = (
                    "run again to resume: the leader finds the job by its request"
                    if job_hex is None
                    else f"run again to resume job {job_hex}"
                )
                pending[q.id] = f"{e.code.name}: {e.message} ({again})"
                continue
            state.failed.pop(q.id, None)
            if q.kind == "breakdown":
                r = local_breakdown(q, files.tasks[q.id], r)
            collected[q.id] = r
            results.append(question_result(q, r))
            say(
                f"{q.id}: count withheld (add_remove)"
                if q.add_remove
                else f"{q.id}: {r.report_count} reports"
            )
        state.save(state_path)
    finally:
        for c in collectors.values():
            c.close()
    # Each breakdown and the questions it crosses, published as one consistent set.
    results = reconcile_results(survey, results, collected)
    if not pending and not elsewhere and not ended:
        write_results(survey, results, out)
    return Outcome(results, pending, elsewhere, before if before != here else None, ended)


@dataclass(frozen=True)
class _Job:
    """One question's collection job, as `collect_survey` runs it: a DAP
    leader's job id is kept in state.json as soon as the leader names it,
    so that a run stopped from then on polls that job (as a gRPC question's
    id, kept before its job exists)."""

    qid: str
    collector: Collector | DapCollector
    state: State
    state_path: Path
    say: Callable[[str], None]

    def collect(
        self, start: int, duration: int, job_hex: str | None, wait: float, confidence: float
    ) -> CollectionResult:
        c = self.collector
        options: dict[str, Any] = {
            "wait": wait,
            "confidence": confidence,
            # One level for the whole question: every row's interval holds at
            # once at `confidence` (the row count is public).
            "simultaneous": True,
            "collection_job_id": None if job_hex is None else bytes.fromhex(job_hex),
            "on_wait": _prefixed(self.say, self.qid),
        }
        if isinstance(c, DapCollector):
            return c.collect(start, duration, on_job=self._named, **options)
        return c.collect(start, duration, **options)

    def _named(self, job: bytes) -> None:
        self.state.jobs[self.qid] = job.hex()
        self.state.save(self.state_path)  # a run stopped from now on polls this job
        self.say(f"{self.qid}: the leader named the job {job.hex()}")


def _collect_text(
    survey: Survey,
    q: Question,
    collector: Collector,
    state: State,
    state_path: Path,
    wait: float,
    confidence: float,
    say: Callable[[str], None],
) -> QuestionResult | str | _Ended:
    """A text question's levels, from where the state left them: its result,
    why it is not finished (to resume by running again), or why it cannot be
    (a level failed)."""
    assert survey.opens is not None and survey.closes is not None
    start, duration = survey.opens, survey.closes - survey.opens
    saved = state.text.get(q.id)
    progress = saved["progress"] if saved else TextProgress(q.max_bytes)
    report_count = saved["report_count"] if saved else 0
    threshold = q.release_threshold(survey.expected_respondents)

    def counted(n: int) -> None:
        nonlocal report_count
        report_count = n

    query = level_query(
        collector,
        start,
        duration,
        counted,
        wait=wait,
        confidence=confidence,
        on_wait=_prefixed(say, q.id),
    )

    def save(p: TextProgress) -> None:
        state.text[q.id] = {"progress": p, "report_count": report_count}
        state.save(state_path)

    try:
        done = descend(
            progress,
            threshold.value,
            MAX_PREFIXES,
            query,
            save,
            _prefixed(say, q.id),
            lower_case=not q.case_sensitive,
        )
    except CollectionJobFailed as e:
        # The level's job is over: the aggregators take that level of this batch
        # only once, so the question cannot be resumed; say so.
        state.failed[q.id] = f"{e.code.name}: {e.message}"
        state.save(state_path)
        return _Ended(f"the collection of a level failed: {e.code.name}: {e.message}")
    except CollectionError as e:
        job = state.text[q.id]["progress"].job if q.id in state.text else None
        return f"{e.code.name}: {e.message} (run again to resume level job {job})"
    state.failed.pop(q.id, None)
    say(f"{q.id}: {len(done.survivors)} answers found, {report_count} reports")
    return text_result(
        q,
        done.survivors,
        report_count,
        threshold,
        text_guarantee(survey, q),
        confidence,
        levels=len(done.queried),
    )


def level_query(
    collector: Collector,
    start: int,
    duration: int,
    counted: Callable[[int], None],
    *,
    wait: float,
    confidence: float = 0.95,
    on_wait: Callable[[str], None] | None = None,
) -> LevelQuery:
    """The descent's query of one level (`veil.collector.text.descend`) as a
    collection through both aggregators of the batch [start, start + duration);
    `counted` gets each level's report count."""

    def query(level: int, prefixes: Sequence[bytes], job: bytes) -> list[int]:
        got = collector.collect_prefixes(
            start,
            duration,
            text_agg_param(prefixes),
            wait=wait,
            confidence=confidence,
            collection_job_id=job,
            on_wait=on_wait,
        )
        counted(got.report_count)
        counts = dict(zip(got.prefix_bytes(), got.noisy_counts, strict=True))
        return [counts[p] for p in prefixes]

    return query


def local_breakdown(b: Question, task: Task, r: CollectionResult) -> CollectionResult:
    """A breakdown's collection with its cells de-biased for its questions' local
    layers (`veil.dp.local.breakdown_estimate`: each device sent a randomized answer
    once, to the question's task and the breakdown's alike; for a randomized multiple
    choice or number, `counted_breakdown_estimate` over its bits and each group's
    count), every cell's interval at once; unchanged when neither question randomizes."""
    assert b.of is not None and b.by is not None
    if counted(b):
        group, question = counted_channels(b)
        cells = counted_breakdown_estimate(
            r.noisy_aggregate,
            r.report_count,
            (len(b.groups()), len(b.categories()) or 1),
            group,
            question,
            task.dp.plan(task.vdaf),
            alpha=1 - r.confidence,
        )
        return replace(
            r,
            estimate=[e.value for e in cells],
            lower=[e.low for e in cells],
            upper=[e.high for e in cells],
            intervals=SIMULTANEOUS_BONFERRONI,
        )
    channels = b.breakdown_channels()
    if channels == (None, None):
        return r
    cells = breakdown_estimate(
        r.noisy_aggregate,
        r.report_count,
        (len(b.groups()), len(b.categories()) or 1),
        channels,
        task.dp.plan(task.vdaf),
        {"integer": b.of.max, "points": b.of.total}.get(b.of.kind, 1),
        alpha=1 - r.confidence,
    )
    return replace(
        r,
        estimate=[e.value for e in cells],
        lower=[e.low for e in cells],
        upper=[e.high for e in cells],
        intervals=SIMULTANEOUS_BONFERRONI,
    )


def text_guarantee(survey: Survey, q: Question) -> Guarantee:
    """What text question `q`'s levels cost together, as its result states it."""
    guarantee, _ = q.heavy_hitters().guarantees()
    if guarantee.rho is not None and survey.delta is not None:
        guarantee = Guarantee.zcdp(guarantee.rho, survey.delta)
    return guarantee


def _prefixed(say: Callable[[str], None], qid: str) -> Callable[[str], None]:
    """`say`, each line starting with the question's id."""
    return lambda what: say(f"{qid}: {what}")


def write_results(
    survey: Survey, results: Sequence[QuestionResult], out: str | os.PathLike[str]
) -> None:
    """RESULTS/results.json, results.csv and report.html of collected results."""
    out = Path(out)
    # Each replaced by a rename, never written through a link at its name.
    replace_file(out / "results.json", results_json(results).encode())
    replace_file(out / "results.csv", results_csv(results).encode())
    replace_file(out / "report.html", report_html(survey, results).encode())
