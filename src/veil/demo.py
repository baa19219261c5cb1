"""Running a survey end to end on this machine: `veil demo` and `veil simulate`.

A leader and a helper start as separate processes on loopback with SQLite in
a temporary directory; simulated respondents answer every question; their
reports go through the client library over gRPC; the leader aggregates with
the helper; the collector collects each question's batch and gets DP
estimates with confidence intervals. Everything is removed afterwards.
"""

from __future__ import annotations

import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from veil.aggregator.local import LocalDeployment
from veil.aggregator.storage import SqliteDatastore
from veil.client import Client
from veil.collector import CollectionResult, Collector
from veil.collector.results import question_results
from veil.dp import local_error
from veil.dp.accounting import zcdp_rho
from veil.dp.local import parse_local_epsilon
from veil.report import Number, QuestionResult
from veil.simulate import simulate_respondents, truth
from veil.survey import Question, Survey, load_survey, parse_survey, sqrt_down
from veil.task import DpSpec, VdafSpec

UPLOAD_CHUNK = 500


def example_survey() -> Survey:
    """The example survey shipped with veil (examples/survey.toml)."""
    text = resources.files("veil").joinpath("data/example_survey.toml").read_text("utf-8")
    return parse_survey(text, "example_survey.toml")


def with_epsilon(survey: Survey, epsilon: Fraction) -> Survey:
    """The same survey with its total rescaled to `epsilon`, every question's share in
    proportion: ε for a pure survey; for one composed under zCDP, the largest ρ that
    gives (ε, δ)-DP at the survey's δ."""
    if survey.total is None:
        raise ValueError("a survey with mechanism none has no budget to rescale")
    if survey.zcdp:
        assert survey.delta is not None
        new_total = zcdp_rho(epsilon, survey.delta)
    else:
        new_total = epsilon
    factor = new_total / survey.total
    questions = []
    for q in survey.questions:
        share = q.share * factor
        if q.mechanism == "gaussian":
            eps, rho = None, share
        elif survey.zcdp:
            eps, rho = sqrt_down(2 * share), None
        else:
            eps, rho = share, None
        questions.append(replace(q, epsilon=eps, rho=rho, share=share))
    return replace(
        survey,
        epsilon=None if survey.zcdp else new_total,
        rho=new_total if survey.zcdp else None,
        questions=tuple(questions),
    )


def with_local_epsilon(survey: Survey, local_epsilon: Fraction) -> Survey:
    """The same survey with randomized response at ε_L on every question."""
    eps = parse_local_epsilon(local_epsilon)
    questions = tuple(replace(q, local_epsilon=eps) for q in survey.questions)
    return replace(survey, questions=questions)


@dataclass(frozen=True)
class LocalCost:
    """The expected error of one question's estimates, with and without its local layer.

    Root mean square per result element, in the units the results are shown in
    (a count, the mean of an integer question, a vector's per-element mean): `without` is the
    servers' noise alone, `with_local` adds the respondents' randomized response,
    at its worst over the answers (None: the question has no local layer).
    """

    question: str
    local_epsilon: Fraction | None
    without: float
    with_local: float | None


def local_costs(survey: Survey, respondents: int) -> list[LocalCost]:
    """What each question's local layer costs in accuracy at `respondents` reports."""
    costs = []
    for q in survey.questions:
        # Integer and vector results are shown as means (per element for a vector).
        scale = 1 / respondents if q.kind in ("integer", "vector") else 1.0
        plain = task_specs(replace(survey, questions=(replace(q, local_epsilon=None),)))[q.id]
        without, _ = local_error(None, plain[1].plan(plain[0]), respondents)
        with_local = None
        if q.local_epsilon is not None:
            vdaf, dp, _ = task_specs(replace(survey, questions=(q,)))[q.id]
            with_local = local_error(dp.local(vdaf), dp.plan(vdaf), respondents)[0] * scale
        costs.append(LocalCost(q.id, q.local_epsilon, without * scale, with_local))
    return costs


def format_local_costs(costs: Sequence[LocalCost], respondents: int) -> str:
    """A plain-text table of `local_costs`."""
    header = ("question", "local epsilon", "rms error without", "with local layer", "ratio")
    rows: list[tuple[str, ...]] = [header]
    for c in costs:
        eps = "-" if c.local_epsilon is None else f"{float(c.local_epsilon):g}"
        with_local = "-" if c.with_local is None else f"{c.with_local:.4g}"
        ratio = "-" if c.with_local is None or not c.without else f"{c.with_local / c.without:.3g}x"
        rows.append((c.question, eps, f"{c.without:.4g}", with_local, ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"Expected error per result element at {respondents:,} respondents "
        "(root mean square; with the local layer: worst case over the answers)"
    ]
    for j, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class ExpectedError:
    """How far one question's estimates are expected to be from the truth at a
    total ε, computed exactly from the noise distribution (no random run).

    Relative to the question's scale: a share of the respondents for counts
    (yes_no, choice, multi_choice), a share of the answer range 0..max for the
    means of integer and vector questions. `median` is the error exceeded half
    the time, `p90` one in ten times (the band), `rms` the root mean square.
    The servers' noise only (without any local layer).
    """

    question: str
    text: str
    unit: str
    epsilon: float
    median: float
    p90: float
    rms: float


def expected_errors(
    survey: Survey, respondents: int, epsilons: Sequence[Fraction]
) -> list[ExpectedError]:
    """`ExpectedError` of every question at each total ε in `epsilons`."""
    from veil.dp.estimates import noise_half_width

    out = []
    for eps in epsilons:
        scaled = with_epsilon(survey, eps)
        plain = replace(
            scaled, questions=tuple(replace(q, local_epsilon=None) for q in scaled.questions)
        )
        specs = task_specs(plain)
        for q in plain.questions:
            vdaf, dp, _ = specs[q.id]
            plan = dp.plan(vdaf)
            if plan.server_noise() is None:
                median = p90 = rms = 0.0
            else:
                unit = 2**plan.config.fixed_point_bits
                median = noise_half_width(plan, 0.5)[0] / unit
                p90 = noise_half_width(plan, 0.1)[0] / unit
                rms = local_error(None, plan, respondents)[0]
            means = q.kind in ("integer", "vector")
            scale = respondents * (q.max if means else 1)
            what = f"share of the range 0..{q.max}" if means else "share of respondents"
            out.append(
                ExpectedError(
                    q.id, q.text, what, float(eps), median / scale, p90 / scale, rms / scale
                )
            )
    return out


def task_specs(survey: Survey) -> dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]]:
    """One task per question, every task under the survey's total budget.

    A gaussian question's task names its ρ (never an ε read as ρ); a survey composed
    under zCDP counts ρ on its ledger, and its pure questions' ε as ε²/2 there.
    """
    specs = {}
    for q in survey.questions:
        vdaf = VdafSpec(q.vdaf_type, **q.vdaf_params)
        local: dict[str, Any] = {}
        if q.local_epsilon is not None:
            local["local_epsilon"] = str(q.local_epsilon)
            if q.kind == "multi_choice":
                local["local_max_choices"] = q.max_choices
        if survey.mechanism == "none" or survey.total is None:
            dp = DpSpec(mechanism="none", **local)
        else:
            gaussian = q.mechanism == "gaussian"
            amount = q.rho if gaussian else q.epsilon
            assert amount is not None
            dp = DpSpec(
                mechanism=q.mechanism,
                epsilon=None if gaussian else str(amount),
                rho=str(amount) if gaussian else None,
                delta=str(survey.delta) if gaussian and survey.delta is not None else None,
                budget=str(amount),
                survey=survey.id,
                survey_budget=str(survey.total),
                survey_unit="rho" if survey.zcdp else "epsilon",
                neighbouring=survey.neighbouring,
                **local,
            )
        specs[q.id] = (vdaf, dp, {"min_batch_size": survey.min_batch_size})
    return specs


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


def _result(q: Question, answers: Sequence[dict[str, Any]], r: CollectionResult) -> QuestionResult:
    """The published rows (`veil.collector.results.question_results`, as `veil survey
    collect` writes them) beside the truth of the simulated answers."""
    g = r.against_collector
    published = question_results(q, r)
    # An integer's sum row is left out: the mean reads on the question's own scale.
    rows = [row for row in published.rows if row.label != "sum"]
    n = len(answers)
    exact = truth(replace(q, neighbouring="replace_one"), answers)
    truths: list[Number]
    if isinstance(exact, int):
        # yes_no: a count, or the share of yes under add_remove; integer: the mean.
        truths = [exact / n if q.add_remove or q.kind == "integer" else exact]
    elif q.add_remove or q.kind == "vector":
        truths = [x / n for x in exact]  # shares, or each element's mean
    else:
        truths = list(exact)
    scalar = q.kind in ("yes_no", "integer")

    def pick(values: list[Any]) -> Any:
        return values[0] if scalar else values

    raw = all(row.raw_estimate is not None for row in rows)
    return QuestionResult(
        q.id,
        q.kind,
        pick(truths),
        pick([row.estimate for row in rows]),
        pick([row.ci_low for row in rows]),
        pick([row.ci_high for row in rows]),
        float(g.epsilon or 0),
        published.n,
        () if scalar else tuple(row.label for row in rows),
        rho=float(g.rho) if g.rho is not None else None,
        delta=float(g.delta) if g.rho is not None and g.delta is not None else None,
        intervals=r.intervals,
        text=q.text,
        raw_estimate=pick([row.raw_estimate for row in rows]) if raw else None,
        raw_ci_low=pick([row.raw_ci_low for row in rows]) if raw else None,
        raw_ci_high=pick([row.raw_ci_high for row in rows]) if raw else None,
        indicative=published.indicative,
    )


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
    return _run(survey, answers, deployment, bars, on_status or (lambda _msg: None))


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
                _result(q, answers, collector.collect(start, precision, simultaneous=True))
            )
    say("collected every question")
    return results


def load(path: str | None) -> Survey:
    return example_survey() if path is None else load_survey(path)
