"""Running a survey end to end on this machine: `veil demo` and `veil simulate`.

A leader and a helper start as separate processes on loopback with SQLite in
a temporary directory; simulated respondents answer every question; their
reports go through the client library over gRPC; the leader aggregates with
the helper; the collector collects each question's batch and gets DP
estimates with confidence intervals. Everything is removed afterwards.

A text question is collected by simulation (`veil.local.text`): the collector's
own descent over the simulated answers' exact prefix counts with each
aggregator's noise drawn as the servers draw it (through the servers a level
costs each aggregator work in proportion to reports times prefixes: minutes
at the demo's size). `veil demo` adds the example text question
(`data/example_text_survey.toml`) to the example survey's run.
"""

from __future__ import annotations

import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from veil.aggregator.storage import SqliteDatastore
from veil.client import Client
from veil.client.survey import UPLOAD_CHUNK
from veil.collector import Collector
from veil.local.launcher import LocalDeployment
from veil.local.simulate import simulate_respondents, truth
from veil.local.text import collect_simulated, text_summary
from veil.survey import Question, Survey, load_survey, parse_survey
from veil.survey.results import Number, QuestionResult, question_result
from veil.survey.tasks import task_specs


def example_survey() -> Survey:
    """The example survey shipped with veil (examples/survey.toml)."""
    text = resources.files("veil").joinpath("data/example_survey.toml").read_text("utf-8")
    return parse_survey(text, "example_survey.toml")


def example_text_survey() -> Survey:
    """The example text question shipped with veil (examples/text_survey.toml)."""
    text = resources.files("veil").joinpath("data/example_text_survey.toml").read_text("utf-8")
    return parse_survey(text, "example_text_survey.toml")


@dataclass
class _Progress:
    enabled: bool
    stream: TextIO

    def bar(self, total: int, desc: str) -> tqdm[Any]:
        return tqdm(
            total=total,
            desc=desc,
            unit="report",
            # None: tqdm draws only on a terminal (a log file gets no bar lines).
            disable=None if self.enabled else True,
            file=self.stream,
            leave=True,
            dynamic_ncols=True,
        )


def _with_truth(
    q: Question, answers: Sequence[dict[str, Any]], r: QuestionResult
) -> QuestionResult:
    """The published result (`veil.survey.results.question_result`, as `veil survey
    collect` writes it) with the truth of the simulated answers on each row, in
    the row's units."""
    n = len(answers)
    exact = truth(replace(q, neighbouring="replace_one"), answers)
    sums = [exact] if isinstance(exact, int) else exact
    # Counts, except where the rows are means (integer, vector) or shares (add_remove).
    per_respondent = q.add_remove or q.kind in ("integer", "vector")
    values: list[Number] = [v / n if per_respondent else v for v in sums]
    truths = iter(values)
    shown = r.shown
    # An integer's sum row (replace_one) holds the plain sum.
    rows = tuple(replace(row, truth=next(truths) if row in shown else sums[0]) for row in r.rows)
    return replace(r, rows=rows)


def run_survey(
    survey: Survey,
    respondents: int,
    *,
    progress: bool = True,
    stream: TextIO = sys.stderr,
    seed: int | None = None,
    workdir: Path | None = None,
    on_status: Callable[[str], None] | None = None,
) -> list[QuestionResult]:
    """Deploy the survey locally, simulate `respondents`, and collect every question."""
    if respondents < survey.min_batch_size:
        raise ValueError(
            f"{respondents} respondents are fewer than the survey's min_batch_size "
            f"({survey.min_batch_size}): no batch could be released"
        )
    say = on_status or (lambda _msg: None)
    served = replace(survey, questions=tuple(q for q in survey.questions if q.kind != "text"))
    if not served.questions:
        rng = random.Random(secrets.randbits(64) if seed is None else seed)
        return _text_results(survey, simulate_respondents(survey, respondents, rng), say)
    with tempfile.TemporaryDirectory(prefix="veil-demo-") as tmp:
        root = workdir or Path(tmp)
        say(f"starting a leader and a helper on 127.0.0.1 (SQLite in {root})")
        deployment = LocalDeployment.start(root, task_specs(served))
        try:
            return run_on(
                deployment,
                survey,
                respondents,
                progress=progress,
                stream=stream,
                seed=seed,
                on_status=say,
            )
        finally:
            deployment.stop()


def run_on(
    deployment: LocalDeployment,
    survey: Survey,
    respondents: int,
    *,
    progress: bool = True,
    stream: TextIO = sys.stderr,
    seed: int | None = None,
    on_status: Callable[[str], None] | None = None,
) -> list[QuestionResult]:
    """Simulate `respondents` answering `survey` against a running deployment
    of its tasks (`task_specs(survey)` but text questions), and collect every
    question (text questions by simulation)."""
    rng = random.Random(secrets.randbits(64) if seed is None else seed)
    answers = simulate_respondents(survey, respondents, rng)
    bars = _Progress(progress, stream)
    say = on_status or (lambda _msg: None)
    served = replace(survey, questions=tuple(q for q in survey.questions if q.kind != "text"))
    results = _run(served, answers, deployment, bars, say)
    text = iter(_text_results(survey, answers, say))
    served_results = iter(results)
    return [next(text) if q.kind == "text" else next(served_results) for q in survey.questions]


def _text_results(
    survey: Survey, answers: list[dict[str, Any]], say: Callable[[str], None]
) -> list[QuestionResult]:
    """Each text question collected by simulation (veil.local.text), with a line
    saying what was found and what was not released."""
    out = []
    for q in survey.questions:
        if q.kind == "text":
            typed = [a[q.id] for a in answers]
            say(f"{q.id}: text answers collected by simulation (the collector's descent over")
            say("  exact prefix counts with both aggregators' noise; not through the servers)")
            result = collect_simulated(survey, q, typed)
            say(f"{q.id}: " + text_summary(result, typed))
            out.append(result)
    return out


def _run(
    survey: Survey,
    answers: list[dict[str, Any]],
    deployment: LocalDeployment,
    bars: _Progress,
    say: Callable[[str], None],
) -> list[QuestionResult]:
    total = len(answers) * len(survey.questions)
    batch: dict[str, tuple[int, int]] = {}
    # One report per respondent and question: say so, or "1500 reports" for
    # 300 respondents looks like a miscount.
    per = f"{len(answers):,} respondents x {len(survey.questions)} questions"
    with bars.bar(total, f"upload ({per})") as bar:
        for q in survey.questions:
            with Client(deployment.tasks[q.id].client) as client:
                report_time = client.report_time()
                precision = deployment.tasks[q.id].client.time_precision
                batch[q.id] = (report_time, precision)
                measurements = [q.to_measurement(a[q.id]) for a in answers]
                for i in range(0, len(measurements), UPLOAD_CHUNK):
                    chunk = measurements[i : i + UPLOAD_CHUNK]
                    client.upload_batch(chunk, report_time)
                    bar.update(len(chunk))

    store = SqliteDatastore(deployment.root / "leader.db")
    try:
        with bars.bar(total, "aggregate") as bar:
            done = 0
            while done < total:
                pending = sum(
                    store.unaggregated_count(
                        deployment.tasks[q.id].client.task_id, start, start + precision
                    )
                    for q in survey.questions
                    for start, precision in [batch[q.id]]
                )
                bar.update(total - pending - done)
                done = total - pending
                if pending:
                    time.sleep(0.2)
    finally:
        store.close()

    results = []
    for q in survey.questions:
        start, precision = batch[q.id]
        with Collector(deployment.tasks[q.id].collector) as collector:
            results.append(
                _with_truth(
                    q,
                    answers,
                    question_result(q, collector.collect(start, precision, simultaneous=True)),
                )
            )
    say("collected every question")
    return results


def load(path: str | None) -> Survey:
    return example_survey() if path is None else load_survey(path)
