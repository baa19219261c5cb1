"""A text question in `veil demo`: its answers through a real leader and helper
(Poplar1 reports uploaded, collected level by level, both ledgers charged), and
its published result and summary line."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from veil.collector.survey import text_guarantee
from veil.dp.heavy_hitters import release_probability
from veil.local.demo import example_text_survey, run_survey, text_summary
from veil.observations import json_paths, load_inventory, unclassified
from veil.render.html import report_html
from veil.survey.results import QuestionResult, results_csv, results_json, text_result


def _found(q_max: int, counts: dict[str, int]) -> list[tuple[bytes, int]]:
    return [(a.encode().ljust(q_max, b"\0"), c) for a, c in counts.items()]


def _result(counts: dict[str, int], n: int) -> QuestionResult:
    survey = example_text_survey()
    (q,) = survey.questions
    threshold = q.release_threshold(survey.expected_respondents or n)
    return text_result(q, _found(q.max_bytes, counts), n, threshold, text_guarantee(survey, q))


@pytest.mark.slow
def test_a_text_question_goes_through_the_servers() -> None:
    """1,000 simulated respondents: the reports reach both aggregators (the
    report count is theirs), the common answers are found with estimates near
    the truth, and no answer given once is released."""
    lines: list[str] = []
    (result,) = run_survey(
        example_text_survey(), 1_000, progress=False, seed=5, on_status=lines.append
    )
    assert result.question.kind == "text" and result.n == 1_000
    assert [row.label for row in result.rows][:1] == ["vs code"]
    for row in result.rows:
        assert row.truth is not None and row.truth > 1
        # The noise is drawn from `secrets`: a 95% interval misses now and
        # then (the demo's runs count how often); an estimate three interval
        # widths from the truth would be a fault, not chance.
        assert abs(row.estimate - row.truth) <= 3 * (row.ci_high - row.ci_low), row
    # The levels ran through the collector's descent, one line each; once every
    # survivor was a whole answer (the common ones are short) it went straight
    # to the last byte.
    levels = [line for line in lines if line.startswith("editor: byte ")]
    assert 2 <= len(levels) < 16 and levels[-1].startswith("editor: byte 16 of 16:")
    (summary,) = [line for line in lines if "answers found" in line]
    assert ", released: 0 (" in summary


def test_the_summary_line_states_what_was_found_and_released() -> None:
    (q,) = example_text_survey().questions
    given = Counter({"vim": 400, "emacs": 300, "nano": 150} | {f"w{i}": 1 for i in range(150)})
    result = _result({"vim": 410, "emacs": 290}, 1_000)
    rows = tuple(replace(row, truth=given[row.label]) for row in result.rows)
    result = replace(result, rows=rows)
    line = text_summary(result, given)
    assert result.threshold is not None
    stated = release_probability(q.heavy_hitters(), result.threshold.value)
    assert result.threshold.release_probability == stated < 1e-4
    assert "2 answers found" in line and "given by at least 2%: 3, missed 'nano'" in line
    assert f"given once: 150, released: 0 (each at most {stated:.2g} likely)" in line
    assert "intervals covering the truth: 2 of 2" in line


def test_results_files_and_report_carry_the_answers() -> None:
    survey = example_text_survey()
    result = _result({"vim": 400, "emacs": 300}, 1_000)
    assert [row.label for row in result.rows] == ["vim", "emacs"]
    doc = results_json([result])
    assert '"threshold": ' in doc and '"release_probability": ' in doc and '"label": "vim"' in doc
    assert "editor,text,1000,vim," in results_csv([result])
    page = report_html(survey, [result])
    assert "2 answers found" in page and "<svg" in page and ">vim</text>" in page
    nothing = _result({}, 500)
    assert nothing.rows == ()
    empty = report_html(survey, [nothing])
    assert "no answer was given often enough to be found" in empty
    assert "<table" not in empty  # no table of headers without a row


def test_every_results_field_of_a_text_question_is_classified() -> None:
    result = _result({"vim": 400}, 700)
    # `truth` is the simulation's, never in a collection's results.json.
    observed = [
        w for w in json_paths([result.to_json()], "json:results") if not w.endswith(".truth")
    ]
    assert "json:results[].threshold" in observed
    assert unclassified(load_inventory(), "collector", observed) == []
