"""`veil demo` and `veil simulate` end to end at a small size: real leader
and helper processes on loopback, uploads through the client library,
collection with DP noise."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from tests.support.images import png_size
from veil.local.demo import example_survey, run_survey
from veil.survey.budget import with_epsilon
from veil.survey.results import QuestionResult


def _within(result: QuestionResult, widths: float = 3.0) -> bool:
    for row in result.shown:
        assert row.truth is not None
        width = max(row.ci_high - row.ci_low, 1e-9)
        if abs(row.estimate - row.truth) > widths * width:
            return False
    return True


def test_demo_estimates_lie_near_the_truth() -> None:
    survey = example_survey()
    results = run_survey(survey, 300, progress=False, seed=1)
    assert [r.question.id for r in results] == [q.id for q in survey.tasked]
    for r in results:
        assert r.n == 300
        assert _within(r), r
    spent = sum((r.guarantee.epsilon or Fraction(0) for r in results), Fraction(0))
    assert spent == survey.epsilon


def test_mechanism_none_gives_the_exact_truth() -> None:
    survey = example_survey()
    exact = type(survey)(**{**survey.__dict__, "mechanism": "none"})
    for r in run_survey(exact, 150, progress=False, seed=2):
        for row in r.rows:
            assert row.truth == pytest.approx(row.estimate)
            assert row.ci_low == row.ci_high == row.estimate
        assert r.guarantee.epsilon is None and r.privacy["epsilon"] == "none"


def test_with_epsilon_rescales_every_question() -> None:
    survey = with_epsilon(example_survey(), Fraction(1, 2))
    assert survey.epsilon == Fraction(1, 2)
    assert sum((q.epsilon for q in survey.tasked), Fraction(0)) == Fraction(1, 2)


def test_demo_command_json(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "veil.cli", "demo", "--respondents", "200", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data = json.loads(out.stdout)
    # stderr is a pipe here: no progress bars drawn into it (only on a terminal).
    assert "report/s" not in out.stderr and "\r" not in out.stderr, out.stderr[-300:]
    assert [d["question"] for d in data] == [
        "remote", "commute", "team", "tools", "ratings", "remote_by_team", "budget", "editor"
    ]  # fmt: skip
    assert [d["labels"] for d in data][:2] == ["yes", "mean"]
    assert data[4]["labels"] == ["workload", "tooling", "pay"]
    # The breakdown: remote by team, a cell per team and answer, row by row.
    assert data[5]["kind"] == "breakdown" and len(data[5]["labels"]) == 12
    assert data[5]["labels"][:2] == ["engineering / no", "engineering / yes"]
    assert sum(data[5]["truth"]) == 200
    # The points question (its own survey): each option's mean points, at most 100 in all.
    assert data[6]["kind"] == "points" and data[6]["epsilon"] == 1
    assert data[6]["labels"] == ["training", "tools", "travel", "hiring"]
    assert len(data[6]["truth"]) == 4 and sum(data[6]["truth"]) <= 100
    assert sum(data[6]["estimate"]) <= 100 + 1e-6
    # The text question (its own zCDP survey) states ρ and δ too.
    assert data[7]["kind"] == "text" and data[7]["rho"] == 0.1
    for d in data:
        assert set(d) - {"rho", "delta"} == {
            "question", "kind", "truth", "estimate", "ci_low", "ci_high", "intervals", "epsilon",
            "labels", "raw_estimate", "raw_ci_low", "raw_ci_high", "indicative_only",
        }  # fmt: skip
        # Bonferroni: the breakdown and the questions it was reconciled with.
        assert d["intervals"] in (
            "per-coordinate", "simultaneous (exact max-of-k)", "simultaneous (Bonferroni)"
        )  # fmt: skip
        columns = [
            d[k] if isinstance(d[k], list) else [d[k]] for k in ("estimate", "ci_low", "ci_high")
        ]
        rows = zip(*columns, strict=True)
        # The shown estimate lies in its interval, which lies in the possible range.
        for est, low, high in rows:
            assert 0 <= low <= est <= high


def test_simulate_command_plots(tmp_path: Path) -> None:
    plot = tmp_path / "out.png"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "veil.cli",
            "simulate",
            "--survey",
            "examples/survey.toml",
            "--respondents",
            "150",
            "--plot",
            str(plot),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert png_size(plot) == (1200, 1200)


def test_simulate_reports_survey_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[survey]\nname = "x"\nepsilon = 1\n\n[[question]]\nid = "q"\nkind = "essay"\n')
    out = subprocess.run(
        [sys.executable, "-m", "veil.cli", "simulate", "--survey", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert f"{bad}:7: unknown kind 'essay'" in out.stderr


def test_simulate_and_demo_refuse_bad_arguments_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was a traceback or an internal message ("division by zero",
    # "report_count must be ...", "bad [dp] table"), the plot's after a
    # whole simulation.
    from veil.cli import main

    example = str(Path(__file__).resolve().parents[2] / "examples" / "survey.toml")
    for argv, says in (
        (["demo", "--respondents", "0"], "argument --respondents: must be at least 1, got 0"),
        (["simulate", "--survey", example, "--respondents", "-5"], "must be at least 1"),
        (["simulate", "--survey", example, "--sweep-epsilon", "0", "1"], "must be > 0, got 0"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert says in capsys.readouterr().err
    missing = tmp_path / "no-such-dir" / "results.png"
    for extra in ([], ["--sweep-epsilon", "1", "2"]):
        assert main(["simulate", "--survey", example, "--plot", str(missing), *extra]) == 2
        err = capsys.readouterr().err
        assert err == f"veil simulate: cannot write {missing}: no directory {missing.parent}\n"
    assert not missing.parent.exists()


def test_plot_without_matplotlib_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib is the `plots` extra: an install without it is told so at
    # once, before a simulation runs, and nothing is written.
    from veil.cli import main

    example = str(Path(__file__).resolve().parents[2] / "examples" / "survey.toml")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "results.png"
    for extra in ([], ["--sweep-epsilon", "1", "2"]):
        assert main(["simulate", "--survey", example, "--plot", str(out), *extra]) == 2
        assert capsys.readouterr().err == (
            "veil simulate: --plot needs matplotlib, an optional extra: pip install 'veil[plots]'\n"
        )
    assert list(tmp_path.iterdir()) == []


def test_sweep_without_plot_prints_a_table_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # It wrote sweep.png into the current directory unasked.
    from veil.cli import main

    example = str(Path(__file__).resolve().parents[2] / "examples" / "survey.toml")
    monkeypatch.chdir(tmp_path)
    argv = ["simulate", "--survey", example, "--respondents", "500", "--sweep-epsilon", "1", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Expected error of each question at 500 respondents")
    assert [line.split()[:2] for line in out[3:5]] == [["remote", "1"], ["remote", "4"]]
    assert len(out) == 3 + 5 * 2
    assert list(tmp_path.iterdir()) == []


def test_a_non_number_epsilon_is_refused_in_one_line_of_our_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from veil.cli import main

    example = str(Path(__file__).resolve().parents[2] / "examples" / "survey.toml")
    assert main(["simulate", "--survey", example, "--epsilon", "one"]) == 2
    err = capsys.readouterr().err
    assert err == "veil simulate: --epsilon: not a number: 'one'\n"
