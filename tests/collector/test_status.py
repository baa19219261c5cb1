"""`veil survey status`'s figures (veil.collector.status), from a real deployment's
collector files: budget spent in the survey's unit, counts withheld under add_remove."""

from __future__ import annotations

import re
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
    # Issue 41: `spent` is ρ here, and was labelled "epsilon" (the question's own unit).
    assert (b["spent"], b["spent_unit"]) == ("9/200", "rho")
    assert (b["spent_in_own_unit"], b["own_unit"]) == ("3/10", "epsilon")
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


TEXT = """[survey]
name = "text"
epsilon = 1
opens = "2026-01-01T00:00:00Z"
closes = "2026-01-02T00:00:00Z"
[[question]]
id = "remote"
kind = "yes_no"
[[question]]
id = "editor"
kind = "text"
"""


def test_a_collected_question_shows_its_collected_count(tmp_path: Path) -> None:
    """Issue 41: the leader deletes a batch's reports once collected, and status
    showed `reports 0` for every collected question."""
    files = load_collector_dir(_deployed(tmp_path, TEXT))
    infos = {"remote": QuestionInfo(0, 1, 1, False), "editor": QuestionInfo(0, 0, 3, False)}
    status = survey_status(files.survey, files.tasks, infos, 2e9, collected={"remote": 37})
    remote, editor = status["questions"]
    assert (remote["reports"], remote["rejected"]) == (37, 1)
    assert editor["reports"] is None
    text = render_text(status, 2e9, files.survey.opens, files.survey.closes)
    assert re.search(r"^  remote +37 +1 +1 ", text, re.M), text
    assert re.search(r"^  editor +collected +0 +3 ", text, re.M), text
    # Before any collection the leader's count stands.
    waiting = {"remote": QuestionInfo(5, 0, 0, False), "editor": QuestionInfo(5, 0, 0, False)}
    before = survey_status(files.survey, files.tasks, waiting, 2e9, collected={"remote": 37})
    assert [q["reports"] for q in before["questions"]] == [5, 5]


def test_report_html_spends_what_status_counts(tmp_path: Path) -> None:
    """Issue 41: report.html said "budget spent ε = 1 of 1" where status said 0.766:
    a text question's descent queried fewer levels than its max_bytes, and only
    those are charged."""
    from tests.support.results import collected
    from veil.collector.survey import text_guarantee
    from veil.render.html import report_html
    from veil.survey.results import question_result, text_result

    files = load_collector_dir(_deployed(tmp_path, TEXT))
    survey = files.survey
    remote, editor = survey.questions
    infos = {"remote": QuestionInfo(0, 0, 1, False), "editor": QuestionInfo(0, 0, 5, False)}
    status = survey_status(survey, files.tasks, infos, 2e9)
    spent = Fraction(status["spent"])
    assert 0 < spent < 1
    threshold = editor.release_threshold(100)
    results = [
        question_result(remote, collected([50], 10, n=100)),
        text_result(editor, [], 100, threshold, text_guarantee(survey, editor), levels=5),
    ]
    page = report_html(survey, results)
    assert f"budget spent ε = {float(spent):.4g} of the survey&#x27;s 1" in page
