"""A text question collected by simulation (veil.local.text), and its published
result: the example text question's must-show at 10,000 respondents."""

from __future__ import annotations

import random
from collections import Counter

from veil.dp.heavy_hitters import release_probability
from veil.local.demo import example_text_survey, run_survey
from veil.local.simulate import simulate_text_answers
from veil.local.text import collect_simulated, text_summary
from veil.observations import json_paths, load_inventory, unclassified
from veil.render.html import report_html
from veil.survey.results import results_csv, results_json


def test_example_text_question_at_10000_respondents() -> None:
    """Zipf over 50 answers plus 500 given once: every answer given by 2% or more
    is found, intervals cover, no answer given once is released."""
    survey = example_text_survey()
    (q,) = survey.questions
    answers = simulate_text_answers(q, 10_000, random.Random(7), singletons=500)
    counts = Counter(answers)
    assert sum(1 for c in counts.values() if c == 1) == 500
    result = collect_simulated(survey, q, answers, rng=random.Random(8))
    found = {row.label: row for row in result.rows}
    common = {a for a, c in counts.items() if c >= 200}
    assert len(common) >= 8 and common <= set(found)
    assert not [a for a in found if counts[a] == 1]
    for row in found.values():
        assert row.truth == counts[row.label]
        assert row.ci_low <= row.truth <= row.ci_high, row
    assert result.threshold is not None
    stated = release_probability(q.heavy_hitters(), result.threshold.value)
    assert result.threshold.release_probability == stated < 1e-4
    line = text_summary(result, answers)
    assert "all found" in line and "given once: 500, released: 0" in line
    assert f"at most {stated:.2g} likely" in line


def test_results_files_and_report_carry_the_answers() -> None:
    survey = example_text_survey()
    (q,) = survey.questions
    answers = ["vim"] * 400 + ["emacs"] * 300 + [f"w{i}" for i in range(300)]
    result = collect_simulated(survey, q, answers, rng=random.Random(3))
    assert [row.label for row in result.rows] == ["vim", "emacs"]
    doc = results_json([result])
    assert '"threshold": ' in doc and '"release_probability": ' in doc and '"label": "vim"' in doc
    assert "editor,text,1000,vim," in results_csv([result])
    page = report_html(survey, [result])
    assert "2 answers found" in page and "<svg" in page and ">vim</text>" in page
    nothing = collect_simulated(survey, q, [f"w{i}" for i in range(500)], rng=random.Random(4))
    assert nothing.rows == ()
    assert "no answer was given often enough to be found" in report_html(survey, [nothing])


def test_a_survey_of_text_questions_alone_runs_without_servers() -> None:
    (result,) = run_survey(example_text_survey(), 2_000, progress=False, seed=5)
    assert result.question.kind == "text" and result.n == 2_000
    assert [row.label for row in result.rows][:1] == ["vs code"]


def test_every_results_field_of_a_text_question_is_classified() -> None:
    survey = example_text_survey()
    (q,) = survey.questions
    answers = ["vim"] * 400 + [f"w{i}" for i in range(300)]
    result = collect_simulated(survey, q, answers, rng=random.Random(3))
    # `truth` is the simulation's, never in a collection's results.json.
    observed = [
        w for w in json_paths([result.to_json()], "json:results") if not w.endswith(".truth")
    ]
    assert "json:results[].threshold" in observed
    assert unclassified(load_inventory(), "collector", observed) == []
