"""Published rows of a collected question (veil.survey.results): consistent
estimates within the possible range, the raw ones kept, the indicative banner."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from tests.support.results import SEVEN_SURVEY, collected, seven
from veil.collector.survey import State, write_results
from veil.render.text import summary_lines
from veil.survey import parse_survey
from veil.survey.results import BANNER, question_result, results_csv


def test_seven_respondents_every_shown_figure_is_possible() -> None:
    published = {r.question.id: r for r in seven()}
    for r in published.values():
        for row in r.rows:
            assert row.possible_low is not None and row.possible_high is not None
            assert row.possible_low <= row.ci_low <= row.estimate <= row.ci_high
            assert row.ci_high <= row.possible_high, (r.question.id, row)
        # Every interval here spans more than half its range: all are indicative.
        assert r.indicative, r.question.id
    (yes,) = published["remote"].rows
    assert (yes.estimate, yes.ci_low, yes.ci_high) == (7, 7, 7)
    assert yes.raw_estimate == 25 and (yes.raw_ci_low, yes.raw_ci_high) == (9, 41)
    mean, total = published["commute"].rows
    assert (mean.estimate, mean.ci_low, mean.ci_high) == (0, 0, 120)
    assert mean.raw_estimate == -115 and total.possible_high == 840
    team = published["team"].rows
    assert sum(row.estimate for row in team) == 7
    assert [row.estimate for row in team] == [0, 0, 7]
    pay = published["ratings"].rows[1]
    assert pay.estimate == 0 and pay.raw_estimate == round(-425 / 7, 6)
    assert 0 <= pay.ci_low <= pay.ci_high <= 10


def test_results_json_keeps_the_raw_estimates_named(tmp_path: Path) -> None:
    survey = parse_survey(SEVEN_SURVEY)
    write_results(survey, seven(), tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    for q in doc:
        assert q["estimates"] == "consistent" and q["indicative_only"] is True
        assert q["note"] == BANNER
        for row in q["rows"]:
            low, high = row["possible"]
            assert low <= row["ci_low"] <= row["estimate"] <= row["ci_high"] <= high
            assert {"raw_estimate", "raw_ci_low", "raw_ci_high"} <= set(row)
    remote = doc[0]["rows"][0]
    assert remote["raw_estimate"] == 25 and remote["estimate"] == 7
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert len(rows) == 1 + 2 + 3 + 3 + 2
    for row in rows:
        assert 0 <= float(row["ci_low"]) <= float(row["estimate"]) <= float(row["ci_high"])
        top = {"yes_no": 7, "choice": 7, "multi_choice": 7, "vector": 10}.get(row["kind"])
        if row["label"] == "sum":
            top = 840
        elif row["kind"] == "integer":
            top = 120
        assert float(row["ci_high"]) <= top, row
        assert row["note"] == BANNER
    page = (tmp_path / "report.html").read_text()
    assert page.count(BANNER.capitalize()) == 5
    assert "<main>" in page
    # No figure on the page below 0: the table's cells and the bars' titles.
    numbers = re.findall(r"<td>(-?[\d.,]+)</td>", page) + re.findall(
        r"<td>(-?[\d.,]+) to (-?[\d.,]+)</td>", page
    )
    assert numbers and not any("-" in str(n) for n in numbers)


def test_a_large_batch_is_not_indicative_and_unchanged() -> None:
    survey = parse_survey(SEVEN_SURVEY)
    r = question_result(survey.question("team"), collected([400, 350, 250], 20, n=1000))
    assert not r.indicative
    assert [row.estimate for row in r.rows] == [400, 350, 250]
    assert [(row.ci_low, row.ci_high) for row in r.rows] == [(380, 420), (330, 370), (230, 270)]
    assert [row.raw_estimate for row in r.rows] == [400, 350, 250]
    assert "note" not in r.to_json()
    assert results_csv([r]).splitlines()[1].endswith(",")


def test_the_banner_depends_on_the_noise_not_the_answers() -> None:
    # The same n and noise, answers at either end: the same verdict.
    survey = parse_survey(SEVEN_SURVEY)
    q = survey.question("remote")
    wide = [question_result(q, collected([v], 30, n=100)).indicative for v in (0, 50, 100)]
    narrow = [question_result(q, collected([v], 20, n=100)).indicative for v in (0, 50, 100)]
    assert wide == [True] * 3 and narrow == [False] * 3


def test_terminal_summary_shows_intervals_and_banner() -> None:
    lines = summary_lines(seven())
    assert lines[0] == "  remote: n = 7; yes 7 [7, 7]"
    assert lines[1] == f"    ({BANNER})"
    assert any(line.startswith("  commute: n = 7; mean 0 [0, 120]") for line in lines)
    assert not any("sum" in line for line in lines)
    assert "raw unbiased estimates" in lines[-1]


ADD_REMOVE = SEVEN_SURVEY.replace(
    "min_batch_size = 5", 'min_batch_size = 5\nneighbouring = "add_remove"'
)


def test_add_remove_keeps_the_noisy_sums_and_the_count() -> None:
    survey = parse_survey(ADD_REMOVE)
    # A noisy count of -3 and yes 25: the share stays within [0, 1].
    r = question_result(survey.question("remote"), collected([-28, 25], 16))
    (row,) = r.rows
    assert 0 <= row.ci_low <= row.estimate <= row.ci_high <= 1
    assert r.n == 0 and r.indicative
    doc = r.to_json()
    assert [s["label"] for s in doc["raw_sums"]] == ["no", "yes", "count"]
    assert doc["raw_sums"][2]["estimate"] == -3
    mean = question_result(survey.question("commute"), collected([-805, 7], 30))
    (row,) = mean.rows
    assert 0 <= row.ci_low <= row.estimate <= row.ci_high <= 120
    assert [s.label for s in mean.raw_sums] == ["sum", "count"]


def test_results_and_state_are_not_written_through_planted_links(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    out = tmp_path / "results"
    out.mkdir()
    for name in ("results.json", "report.html", "state.json"):
        (out / name).symlink_to(victim)
    survey = parse_survey(SEVEN_SURVEY)
    write_results(survey, seven(), out)
    State(survey.id, 0, 3600).save(out / "state.json")
    assert victim.read_text() == "someone else's file\n"
    for name in ("results.json", "report.html", "state.json"):
        assert not (out / name).is_symlink()
    assert json.loads((out / "state.json").read_text())["survey"] == survey.id


def test_a_text_question_that_could_find_nothing_says_so_everywhere(tmp_path: Path) -> None:
    # 35 respondents, the text question one of four at ε = 1: its detection floor
    # (public parameters and n only) is in the thousands.
    from veil.collector.survey import text_guarantee
    from veil.render.html import report_html
    from veil.survey.results import results_json, text_result

    survey = parse_survey(
        """\
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
id = "editor"
kind = "text"
""",
        "mixed.toml",
    )
    q = survey.question("editor")
    threshold = q.release_threshold(survey.expected_respondents)
    nothing = text_result(q, [], 35, threshold, text_guarantee(survey, q))
    assert nothing.finds_nothing and nothing.indicative
    floor = nothing.detection_floor
    assert floor is not None and floor > 35
    needs = f"this question needs about {floor:,} respondents at this ε"
    (doc,) = json.loads(results_json([nothing]))
    assert doc["indicative_only"] is True and doc["detection_floor"] == floor
    assert doc["note"].startswith(BANNER) and needs in doc["note"]
    (line,) = list(csv.DictReader(io.StringIO(results_csv([nothing]))))
    assert (line["question"], line["n"], line["label"]) == ("editor", "35", "")
    assert needs in line["note"]
    page = report_html(survey, [nothing])
    assert 'class="banner"' in page and needs in page
    summary = summary_lines([nothing])
    assert summary[0] == "  editor: n = 35; no answer found" and needs in summary[1]
    # Enough respondents for an answer everyone gives: no such note.
    enough = text_result(q, [], floor, threshold, text_guarantee(survey, q))
    assert not enough.finds_nothing and needs not in results_json([enough])
