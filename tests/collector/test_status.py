"""`veil survey status`'s figures (veil.collector.status), from a real deployment's
collector files: budget spent in the survey's unit, counts withheld under add_remove."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from veil.collector.status import QuestionInfo, render_text, survey_status
from veil.collector.survey import load_collector_dir
from veil.deploy import deploy_survey
from veil.survey import parse_survey

MIXED = """[survey]
name = "mixed"
rho = 1
opens = "2026-01-01T00:00:00Z"
closes = "2026-01-02T00:00:00Z"
[[question]]
id = "a"
kind = "yes_no"
mechanism = "gaussian"
rho = 0.5
[[question]]
id = "b"
kind = "yes_no"
epsilon = 0.3
"""


def test_a_pure_question_counts_as_rho_in_a_zcdp_survey(tmp_path: Path) -> None:
    """Issue 25: ε 0.3 of a pure question was added to ρ as 0.3; it costs ρ 0.045."""
    files = load_collector_dir(_deployed(tmp_path, MIXED))
    done = QuestionInfo(7, 0, 1, False)
    status = survey_status(files.survey, files.tasks, {"a": done, "b": done}, now=2e9)
    a, b = status["questions"]
    assert (a["spent"], a["spent_unit"]) == ("1/2", "rho")
    assert (b["spent"], b["spent_unit"], b["spent_in_own_unit"]) == ("9/200", "epsilon", "3/10")
    assert Fraction(status["spent"]) == Fraction(1, 2) + Fraction(9, 200)  # ρ 0.545, not 0.8
    assert (status["unit"], status["total"], status["state"]) == ("rho", "1", "collected")
    text = render_text(status, 2e9, files.survey.opens, files.survey.closes)
    assert "ρ 0.045 (ε 3/10)" in text
    assert "budget spent over the survey: ρ 0.545 of 1" in text
    assert "a pure question's ε counts as ρ = ε²/2" in text


def test_counts_withheld_under_add_remove(tmp_path: Path) -> None:
    text = MIXED.replace("rho = 1\n", 'rho = 1\nneighbouring = "add_remove"\n', 1)
    files = load_collector_dir(_deployed(tmp_path, text))
    # Even if a leader sent counts, the collector's own add_remove task withholds them.
    infos = {"a": QuestionInfo(7, 1, 0, True), "b": QuestionInfo(7, 1, 0, False)}
    status = survey_status(files.survey, files.tasks, infos, now=1.7e9)
    assert status["state"] == "not_open"
    for q in status["questions"]:
        assert (q["reports"], q["rejected"], q["counts_withheld"]) == (None, None, True)
    privacy = status["privacy"]
    assert privacy["covers"]["against_collector"] == ["values", "participation"]
    assert privacy["covers"]["against_collector_and_one_aggregator"] == ["values"]
    assert privacy["released_exactly"] == ["batch_floor_reached"]
    shown = render_text(status, 1.7e9, files.survey.opens, files.survey.closes)
    assert " 7 " not in shown and "withheld" in shown
    assert "ready to collect after 2026-01-02T00:00:00Z" in shown


def _deployed(tmp_path: Path, text: str) -> Path:
    survey = parse_survey(text)
    deploy_survey(survey, text, tmp_path / "dep", "127.0.0.1:1", "127.0.0.1:2", tls=False)
    return tmp_path / "dep" / "collector"
