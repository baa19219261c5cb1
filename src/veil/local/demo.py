"""Running a survey end to end on this machine: `veil demo` and `veil simulate`.

A leader and a helper start as separate processes on loopback with SQLite in
a temporary directory; simulated respondents answer every question; their
reports go through the client library over gRPC; the leader aggregates with
the helper; the collector collects each question's batch and gets DP
estimates with confidence intervals. Everything is removed afterwards.

A text question goes the same way: its answers are normalised and sharded as
Poplar1 reports, uploaded, and collected level by level through the collector's
descent (`veil.collector.text`, as `veil survey collect` runs it): both
aggregators verify each level in two rounds, noise every prefix count and charge
their ledgers. `veil demo` adds the example points question
(`data/example_points_survey.toml`) and the example text question
(`data/example_text_survey.toml`) to the example survey's run, each its own
survey.
"""

from __future__ import annotations

import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client
from veil.client.survey import UPLOAD_CHUNK, device_measurements
from veil.collector import Collector
from veil.collector.survey import level_query, local_breakdown, text_guarantee
from veil.collector.text import TextProgress, descend
from veil.local.launcher import LocalDeployment
from veil.local.simulate import simulate_respondents, truth
from veil.survey import Question, Survey, load_survey, parse_survey
from veil.survey.reconciled import reconcile_results
from veil.survey.results import Number, QuestionResult, question_result, text_result
from veil.survey.tasks import task_specs
from veil.survey.text import MAX_PREFIXES, encode_text_answer


def example_survey() -> Survey:
    """The example survey shipped with veil (examples/survey.toml)."""
    text = resources.files("veil").joinpath("data/example_survey.toml").read_text("utf-8")
    return parse_survey(text, "example_survey.toml")


def example_points_survey() -> Survey:
    """The example points question shipped with veil (examples/points_survey.toml)."""
    text = resources.files("veil").joinpath("data/example_points_survey.toml").read_text("utf-8")
    return parse_survey(text, "example_points_survey.toml")


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
    # Counts, except where the rows are means (integer, vector, points) or shares
    # (add_remove).
    per_respondent = q.add_remove or q.mean_top is not None
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
    with tempfile.TemporaryDirectory(prefix="veil-demo-") as tmp:
        root = workdir or Path(tmp)
        say(f"starting a leader and a helper on 127.0.0.1 (SQLite in {root})")
        deployment = LocalDeployment.start(root, task_specs(survey))
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
    of its tasks (`task_specs(survey)`), and collect every question."""
    rng = random.Random(secrets.randbits(64) if seed is None else seed)
    answers = simulate_respondents(survey, respondents, rng)
    bars = _Progress(progress, stream)
    say = on_status or (lambda _msg: None)
    return _run(survey, answers, deployment, bars, say)


def _run(
    survey: Survey,
    answers: list[dict[str, Any]],
    deployment: LocalDeployment,
    bars: _Progress,
    say: Callable[[str], None],
) -> list[QuestionResult]:
    total = len(answers) * len(survey.tasked)
    batch: dict[str, tuple[int, int]] = {}
    # One report per respondent and question: say so, or "1500 reports" for
    # 300 respondents looks like a miscount.
    per = f"{len(answers):,} respondents x {len(survey.questions)} questions"
    if survey.breakdowns:
        per += f" and {len(survey.breakdowns)} breakdowns"
    # As each device sends them: an answer with a local layer drawn once, for its
    # question's report and its breakdowns' alike (veil.client.survey).
    tasks = {q.id: deployment.tasks[q.id].client for q in survey.tasked}
    sent = [
        device_measurements(
            survey, tasks, {q.id: q.to_measurement(a[q.id]) for q in survey.questions}
        )
        for a in answers
    ]
    with bars.bar(total, f"upload ({per})") as bar:
        for q in survey.tasked:
            with Client(deployment.tasks[q.id].client) as client:
                report_time = client.report_time()
                precision = deployment.tasks[q.id].client.time_precision
                batch[q.id] = (report_time, precision)
                measurements = [s[q.id] for s, _ in sent]
                drawn = bool(sent) and q.id in sent[0][1]
                for i in range(0, len(measurements), UPLOAD_CHUNK):
                    chunk = measurements[i : i + UPLOAD_CHUNK]
                    client.upload_batch(chunk, report_time, randomized=drawn)
                    bar.update(len(chunk))

    # A text question's reports are aggregated when each level is collected.
    counted = [q for q in survey.tasked if q.kind != "text"]
    total = len(answers) * len(counted)
    store = SqliteDatastore(deployment.root / "leader.db")
    try:
        with bars.bar(total, "aggregate") as bar:
            done = 0
            while done < total:
                pending = sum(
                    store.unaggregated_count(
                        deployment.tasks[q.id].client.task_id, start, start + precision
                    )
                    for q in counted
                    for start, precision in [batch[q.id]]
                )
                bar.update(total - pending - done)
                done = total - pending
                if pending:
                    time.sleep(0.2)
    finally:
        store.close()

    results = []
    collected = {}
    for q in survey.tasked:
        start, precision = batch[q.id]
        with Collector(deployment.tasks[q.id].collector) as collector:
            if q.kind == "text":
                typed = [a[q.id] for a in answers]
                results.append(_collect_text(survey, q, typed, collector, start, precision, say))
                continue
            collected[q.id] = collector.collect(start, precision, simultaneous=True)
            if q.kind == "breakdown":
                collected[q.id] = local_breakdown(
                    q, deployment.tasks[q.id].collector, collected[q.id]
                )
            results.append(_with_truth(q, answers, question_result(q, collected[q.id])))
    say("collected every question")
    # As `veil survey collect` publishes them: each breakdown with its questions.
    return reconcile_results(survey, results, collected)


def _collect_text(
    survey: Survey,
    q: Question,
    answers: Sequence[str],
    collector: Collector,
    start: int,
    duration: int,
    say: Callable[[str], None],
) -> QuestionResult:
    """Text question `q`'s answers found through both aggregators, level by level
    (as `veil survey collect` finds them), each row with its truth among `answers`
    (as typed), and a line saying what was found and what was not released."""
    n = len(answers)
    threshold = q.release_threshold(survey.expected_respondents or n)
    reports: list[int] = []  # each level's report count
    found = descend(
        TextProgress(q.max_bytes),
        threshold.value,
        MAX_PREFIXES,
        level_query(collector, start, duration, reports.append, wait=3600),
        save=lambda _: None,
        say=lambda what: say(f"{q.id}: {what}"),
        lower_case=not q.case_sensitive,
    ).survivors
    result = text_result(
        q, found, reports[-1], threshold, text_guarantee(survey, q), levels=len(reports)
    )
    given = Counter(encode_text_answer(a, q.max_bytes, q.case_sensitive).text for a in answers)
    result = replace(
        result, rows=tuple(replace(row, truth=given.get(row.label, 0)) for row in result.rows)
    )
    say(f"{q.id}: " + text_summary(result, given))
    return result


def text_summary(result: QuestionResult, truth: Counter[str], share: float = 0.02) -> str:
    """One line on a simulated text question: the answers found, whether every
    answer given by at least `share` of the respondents (`truth`: each normalised
    answer's count) is among them, whether any answer given once was released (with
    the stated probability), and how many intervals cover the truth."""
    assert result.threshold is not None
    n = sum(truth.values())
    found = {row.label for row in result.rows}
    common = [a for a, c in truth.items() if c >= share * n]
    missed = [a for a in common if a not in found]
    once = [a for a, c in truth.items() if c == 1]
    released = [a for a in found if truth.get(a) == 1]
    covered = sum(1 for row in result.rows if row.ci_low <= (row.truth or 0) <= row.ci_high)
    return (
        f"{len(result.rows)} answers found (noisy count at least {result.threshold.value});"
        f" given by at least {share:.0%}: {len(common)}, "
        + ("all found" if not missed else f"missed {', '.join(repr(a) for a in missed)}")
        + f"; given once: {len(once)}, released: {len(released)} (each at most"
        f" {result.threshold.release_probability:.2g} likely);"
        f" intervals covering the truth: {covered} of {len(result.rows)}"
    )


def load(path: str | None) -> Survey:
    return example_survey() if path is None else load_survey(path)
