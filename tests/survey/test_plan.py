"""Planning a survey's size (veil.survey.plan, `veil survey plan`, deploy's plan)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest

from veil.cli import main
from veil.collector import CollectionResult
from veil.dp.accounting import Guarantee
from veil.dp.estimates import estimate
from veil.local.demo import example_survey
from veil.survey import SurveyError, parse_survey
from veil.survey.plan import expected_errors, plan_survey
from veil.survey.results import question_result
from veil.survey.tasks import task_specs

SURVEY = """\
[survey]
name = "plan test"
epsilon = 1
min_batch_size = 5
expected_respondents = 40
{extra}
opens = 2026-05-01T00:00:00Z
closes = 2026-05-08T00:00:00Z

[[question]]
id = "likes"
kind = "yes_no"

[[question]]
id = "score"
kind = "integer"
max = 10
target_error = 0.25
"""


def test_the_interval_planned_is_the_one_collect_shows() -> None:
    # Under replace_one the interval depends on public parameters only: the
    # plan's half-width is what the collector's estimates give at any answer.
    survey = example_survey()
    specs = task_specs(survey)
    for n in (10, 1000):
        for p in plan_survey(survey, n):
            q = survey.question(p.question)
            vdaf, dp, _ = specs[q.id]
            k = q.vdaf_params.get("length", 1)
            (e, *_) = estimate([0] * k, dp.plan(vdaf), 0.05, simultaneous=True)
            per_row = Fraction(1, n) if q.kind in ("integer", "vector") else 1
            assert p.raw_half_width == round(float((e.high - e.low) / 2 * per_row), 6)
            # The results of a collection at n carry the banner exactly when planned.
            collected = CollectionResult(
                start=0, duration=3600, report_count=n,
                estimate=[e.value] * k if k > 1 else e.value,
                lower=[e.low] * k if k > 1 else e.low,
                upper=[e.high] * k if k > 1 else e.high,
                confidence=0.95, intervals="simultaneous (exact max-of-k)", spent=Fraction(1),
                unit="epsilon", against_collector=Guarantee.pure(Fraction(1)),
                mechanism="geometric", noisy_aggregate=[0] * k, seconds=0.0,
            )  # fmt: skip
            assert question_result(q, collected).indicative == p.indicative, p


@pytest.mark.parametrize("neighbouring", ["replace_one", "add_remove", "local"])
def test_respondents_needed_is_the_smallest_that_reaches_the_target(neighbouring: str) -> None:
    survey = example_survey()
    if neighbouring == "add_remove":
        survey = replace(
            survey,
            neighbouring="add_remove",
            questions=tuple(replace(q, neighbouring="add_remove") for q in survey.questions),
        )
    elif neighbouring == "local":
        survey = replace(
            survey,
            questions=tuple(replace(q, local_epsilon=Fraction(3)) for q in survey.questions),
        )
    for p in plan_survey(survey, 100):
        assert p.needed is not None and p.needed >= survey.min_batch_size
        (at,) = [x for x in plan_survey(survey, p.needed) if x.question == p.question]
        assert at.half_width < at.target and at.reaches_target
        if p.needed > survey.min_batch_size:
            (below,) = [x for x in plan_survey(survey, p.needed - 1) if x.question == p.question]
            assert below.half_width >= below.target and not below.reaches_target
        assert 0 < p.median <= p.p90


def test_errors_fall_with_respondents_for_means_and_not_for_counts() -> None:
    survey = example_survey()
    small = {p.question: p for p in plan_survey(survey, 100)}
    large = {p.question: p for p in plan_survey(survey, 10_000)}
    # A count's noise is in respondents, whatever n; a mean's shrinks as 1/n.
    assert large["remote"].median == small["remote"].median
    assert large["commute"].median == pytest.approx(small["commute"].median / 100, rel=1e-3)
    assert small["remote"].target == 10 and large["remote"].target == 1000
    assert small["commute"].target == 18 and small["commute"].unit == "mean answer (0 to 180)"


def test_survey_settings_and_their_errors() -> None:
    survey = parse_survey(SURVEY.format(extra="target_error = 0.05"))
    assert survey.expected_respondents == 40 and survey.target_error == Fraction(1, 20)
    assert survey.question("score").target_error == Fraction(1, 4)
    plans = {p.question: p for p in plan_survey(survey, 40)}
    assert plans["likes"].target_error == 0.05 and plans["score"].target_error == 0.25
    overridden = plan_survey(survey, 40, Fraction(1, 2))
    assert all(p.target_error == 0.5 for p in overridden)
    for extra, message in [
        ("target_error = 0", "target_error"),
        ("target_error = 1.5", "target_error"),
        ('target_error = "ten percent"', "target_error"),
        ("target_error = nan", "target_error"),
    ]:
        with pytest.raises(SurveyError, match=message) as info:
            parse_survey(SURVEY.format(extra=extra), "s.toml")
        assert str(info.value).startswith("s.toml:6:"), info.value
    for bad in ("0", "-3", '"many"', "2000000", "true", "4.5"):
        text = SURVEY.replace("expected_respondents = 40", f"expected_respondents = {bad}")
        with pytest.raises(SurveyError, match="expected_respondents") as info:
            parse_survey(text.format(extra=""), "s.toml")
        assert str(info.value).startswith("s.toml:5:"), info.value


def test_plan_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SURVEY.format(extra=""))
    assert main(["survey", "plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan test: expected accuracy at 40 respondents")
    assert "likes" in out and "score" in out and "respondents needed" in out
    assert main(["survey", "plan", str(path), "--respondents", "4"]) == 0
    assert "nothing is released: the survey's min_batch_size is 5" in capsys.readouterr().out
    assert main(["survey", "plan", str(path), "--respondents", "5000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["respondents"] == 5000 and [q["question"] for q in doc["questions"]] == [
        "likes",
        "score",
    ]
    assert all(q["reaches_target"] for q in doc["questions"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--respondents", "ten"], "not a whole number: 'ten'"),
        (["--respondents", "0"], "must be at least 1"),
        (["--target-error", "one"], "not a number: 'one'"),
        (["--target-error", "2"], "at most 1"),
        (["--target-error", "-0.1"], "must be > 0"),
    ],
)
def test_plan_command_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SURVEY.format(extra=""))
    with pytest.raises(SystemExit) as info:
        main(["survey", "plan", str(path), *args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_plan_command_needs_a_size_and_a_readable_survey(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SURVEY.format(extra="").replace("expected_respondents = 40\n", ""))
    assert main(["survey", "plan", str(path)]) == 2
    assert "give --respondents N, or expected_respondents" in capsys.readouterr().err
    assert main(["survey", "plan", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read survey file" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe[survey")
    assert main(["survey", "plan", str(tmp_path / "bad.toml")]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_deploy_prints_the_plan_and_strict_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SURVEY.format(extra=""))
    args = ["survey", "deploy", "--survey", str(path), "--leader", "127.0.0.1:1"]
    args += ["--helper", "127.0.0.1:2", "--no-tls"]
    # At 40 respondents and ε = 1/2 a yes/no question misses ±10% (±4).
    assert main([*args, "--strict", "--out", str(tmp_path / "strict")]) == 2
    said = capsys.readouterr()
    assert "expected accuracy at 40 respondents" in said.out
    assert "refused (--strict)" in said.err and "likes cannot reach" in said.err
    assert "nothing was written" in said.err
    assert not (tmp_path / "strict").exists()
    assert main([*args, "--out", str(tmp_path / "dep")]) == 0
    said = capsys.readouterr()
    assert "warning: at the expected 40 respondents, likes cannot reach" in said.err
    assert (tmp_path / "dep" / "collector").is_dir()
    # Enough respondents: no warning, and --strict deploys.
    path.write_text(SURVEY.format(extra="").replace("= 40", "= 4000"))
    assert main([*args, "--strict", "--out", str(tmp_path / "big")]) == 0
    said = capsys.readouterr()
    assert "expected accuracy at 4,000 respondents" in said.out and said.err == ""


def test_expected_error_is_exact_relative_and_falls_with_epsilon() -> None:
    survey = example_survey()
    errors = expected_errors(survey, 1000, [Fraction(1, 2), Fraction(2)])
    by = {(e.question, e.epsilon): e for e in errors}
    for q in survey.questions:
        low, high = by[(q.id, 0.5)], by[(q.id, 2.0)]
        # Four times the ε, about a quarter of the error (the geometric noise's
        # scale is 1/ε); the band lies above the median.
        assert 0 < high.median < low.median and high.median <= low.median / 2
        assert low.median <= low.p90
    # The same inputs give the same figures: nothing random in them.
    assert errors == expected_errors(survey, 1000, [Fraction(1, 2), Fraction(2)])
    remote = by[("remote", 2.0)]
    assert remote.unit == "share of respondents" and remote.median < 0.05
    assert by[("commute", 2.0)].unit == "share of the range 0..180"


MIXED = """\
[survey]
name = "mixed"
epsilon = 1
min_batch_size = 10
expected_respondents = 35
opens = 2026-05-01T00:00:00Z
closes = 2026-05-08T00:00:00Z

[[question]]
id = "remote"
kind = "yes_no"

[[question]]
id = "team"
kind = "choice"
options = ["eng", "design", "sales"]

[[question]]
id = "hours"
kind = "integer"
max = 60

[[question]]
id = "editor"
kind = "text"
"""


def test_a_text_question_that_finds_nothing_is_named_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Four questions at ε = 1: the text question's 16 levels of ε/64 each need
    # thousands of respondents giving one answer, far above the 35 expected.
    survey = parse_survey(MIXED, "mixed.toml")
    editor = {p.question: p for p in plan_survey(survey, 35)}["editor"]
    assert editor.impossible and editor.detection_floor is not None
    assert editor.possible_from == editor.detection_floor > 35
    # At possible_from an answer every respondent gives is found, one fewer not.
    bigger = {p.question: p for p in plan_survey(survey, editor.possible_from)}["editor"]
    assert not bigger.impossible
    assert {p.question: p for p in plan_survey(survey, bigger.respondents - 1)}["editor"].impossible
    path = tmp_path / "mixed.toml"
    path.write_text(MIXED)
    assert main(["survey", "plan", str(path)]) == 0
    out = capsys.readouterr().out
    needs = f"this question needs about {editor.possible_from:,} respondents at this ε"
    assert "no answer can be found, not even one that every respondent gives" in out
    assert needs in out
    # Never a share of the respondents above 100%.
    assert not [s for s in re.findall(r"([\d.,]+)%", out) if float(s.replace(",", "")) > 100]
    assert main(["survey", "plan", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (text,) = [q for q in doc["questions"] if q["kind"] == "text"]
    assert text["finds_nothing"] is True and text["possible_from"] == editor.possible_from
    args = ["survey", "deploy", "--survey", str(path), "--leader", "127.0.0.1:1"]
    args += ["--helper", "127.0.0.1:2", "--no-tls", "--out", str(tmp_path / "dep")]
    assert main(args) == 0
    assert "warning: editor: at 35 respondents no answer can be found" in capsys.readouterr().err


def test_the_text_mechanism_variant_states_the_same_epsilon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from veil.dp.accounting import zcdp_epsilon
    from veil.survey.budget import text_mechanism_variant
    from veil.survey.plan import variant_plans

    survey = parse_survey(MIXED, "mixed.toml")
    variant = text_mechanism_variant(survey)
    assert variant is not None and variant.rho is not None and variant.delta is not None
    # Gaussian text at the same ε (now with δ): ρ solved down, so the ε it implies
    # is at most the survey's, and within rounding of it.
    assert Fraction(999, 1000) < zcdp_epsilon(variant.rho, variant.delta) <= 1
    assert [q.mechanism for q in variant.questions] == ["geometric"] * 3 + ["gaussian"]
    # The total shared in the same proportions.
    assert len({q.share / variant.rho for q in variant.questions}) == 1
    back = text_mechanism_variant(variant)
    assert back is not None and back.rho is None and back.epsilon is not None
    assert [q.mechanism for q in back.questions] == ["geometric"] * 4
    # Both ways in the plan: the other questions' intervals widen, the floor falls.
    now = plan_survey(survey, 35)
    _, then = variant_plans(survey, 35) or (None, [])
    for a, b in zip(now[:3], then[:3], strict=True):
        assert b.raw_half_width > 2 * a.raw_half_width
    assert then[3].detection_floor is not None and now[3].detection_floor is not None
    assert then[3].detection_floor < now[3].detection_floor / 4
    path = tmp_path / "mixed.toml"
    path.write_text(MIXED)
    assert main(["survey", "plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "text geometric (as written)" in out and "text gaussian" in out
    # Nothing to compare without a text question, or with text questions only.
    assert text_mechanism_variant(parse_survey(SURVEY.format(extra=""), "s.toml")) is None
    only_text = (
        MIXED[: MIXED.index("[[question]]")] + MIXED[MIXED.index('[[question]]\nid = "editor"') :]
    )
    assert text_mechanism_variant(parse_survey(only_text, "t.toml")) is None


def _true_sums(q, n: int, where: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The aggregate of n answers at the bottom of the range or in its middle."""
    k = q.vdaf_params.get("length", 1)
    # One answer each: a single choice's counts (a breakdown's cells of one) add up to n.
    single = q.vdaf_type == "histogram"
    if where == "low":
        return [n] + [0] * (k - 1) if single else [0] * k
    if single:
        sums = [n // k] * k
        sums[0] += n - sum(sums)
        return sums
    top = q.max if q.kind in ("integer", "vector") else 1
    return [n * top // 2] * k


@pytest.mark.parametrize("n", [10, 100, 10_000])
def test_the_plan_is_what_simulated_releases_publish(n: int) -> None:
    """Issue 41: at n = 10 the plan said ±12, ±37, ±114 where a published interval
    spans at most 5 each side. Releases drawn with the question's own noise and
    published as `veil survey collect` does: no published interval is wider than
    planned, nor any estimate further from the truth than the planned range; in the
    middle of the range at 10,000 respondents every interval is the planned one."""
    import random

    survey = example_survey()
    specs = task_specs(survey)
    rng = random.Random(41 + n)
    for p in plan_survey(survey, n):
        q = survey.question(p.question)
        vdaf, dp, _ = specs[q.id]
        plan = dp.plan(vdaf)
        noise = plan.server_noise()
        assert noise is not None
        widths = []
        for where in ("low", "middle"):
            truth = _true_sums(q, n, where)
            for _ in range(20):
                noised = [t + noise.sample(rng) + noise.sample(rng) for t in truth]
                est = estimate(noised, plan, 0.05, simultaneous=True)
                k = len(est)
                collected = CollectionResult(
                    start=0, duration=3600, report_count=n,
                    estimate=[e.value for e in est] if k > 1 else est[0].value,
                    lower=[e.low for e in est] if k > 1 else est[0].low,
                    upper=[e.high for e in est] if k > 1 else est[0].high,
                    confidence=0.95, intervals="simultaneous (exact max-of-k)",
                    spent=Fraction(1), unit="epsilon",
                    against_collector=Guarantee.pure(Fraction(1)), mechanism="geometric",
                    noisy_aggregate=noised, seconds=0.0,
                )  # fmt: skip
                result = question_result(q, collected)
                per_row = Fraction(1, n) if q.kind in ("integer", "vector") else 1
                # A single choice's interval is widened to hold its projected
                # estimate only when the noise's intervals miss (at most 5%).
                held = all(e.low <= t <= e.high for e, t in zip(est, truth, strict=True))
                for row in result.shown:
                    half = (row.ci_high - row.ci_low) / 2
                    assert half <= p.half_width + 1e-6 or not held, (p.question, n, row)
                    widths.append((where, half))
                for row, t in zip(result.shown, truth, strict=True):
                    assert abs(row.estimate - float(t * per_row)) <= p.range_high + 1e-6
        assert p.half_width <= p.range_high / 2
        if n == 10_000:
            # Far from the edges nothing is cut: the published interval is the plan's.
            middle = [h for where, h in widths if where == "middle"]
            assert all(abs(h - p.half_width) <= 1e-6 for h in middle), (p.question, middle[:3])
            assert p.half_width == p.raw_half_width
        if n == 10:
            # The noise alone is wider than the range: the plan says the cut one.
            assert p.raw_half_width > p.half_width == p.range_high / 2
