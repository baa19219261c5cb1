"""`veil survey respond`'s answers as typed: at the terminal and by --answer
ID=ANSWER, each checked against its question before anything is sent (the
command end to end: tests/integration/test_points_survey.py)."""

from __future__ import annotations

import re

import pytest

from veil.cli.respondent import (
    OUTBOX_MAX_REPORTS,
    _show,
    answer_from_text,
    answers_from_options,
    ask,
)
from veil.client.outbox import DEFAULT_MAX_REPORTS
from veil.survey import parse_survey

SURVEY = parse_survey(
    '[survey]\nname = "s"\nepsilon = 1\n'
    '[[question]]\nid = "remote"\nkind = "yes_no"\n'
    '[[question]]\nid = "tools"\nkind = "multi_choice"\noptions = ["chat", "wiki", "video"]\n'
    "max_choices = 2\n"
    '[[question]]\nid = "budget"\ntext = "Split 100 points"\nkind = "points"\n'
    'options = ["training", "tools", "travel"]\ntotal = 100\n'
)


def test_answers_given_as_options() -> None:
    answers = answers_from_options(
        SURVEY, ["remote=yes", "tools=1, video", "budget=training:40,tools:60"]
    )
    assert answers == {
        "remote": "yes",
        "tools": ["chat", "video"],
        "budget": "training:40,tools:60",
    }
    budget = SURVEY.question("budget")
    assert budget.to_measurement(answers["budget"]) == [40, 60, 0]
    assert answer_from_text(budget, " 2:10, 3:5 ") == "2:10, 3:5"
    assert budget.to_measurement(answer_from_text(budget, " 2:10, 3:5 ")) == [0, 10, 5]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["budget=training:70,tools:40"], "the points add up to 110, over the total of 100"),
        (["budget=gym:10"], "'gym' is not one of the options"),
        (["budget"], "give ID=ANSWER"),
        (["nothing=1"], "no question 'nothing' (questions: remote, tools, budget)"),
        (["remote=yes", "remote=no"], "question 'remote' is answered twice"),
        (["remote=maybe"], "'maybe' is not an allowed answer"),
    ],
)
def test_bad_answer_options_are_refused(given: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        answers_from_options(SURVEY, given)


def test_the_terminal_asks_a_points_question_until_the_split_fits() -> None:
    typed = iter(["", "", "training:80, travel:30", "1:80,3:20"])
    shown: list[str] = []
    assert ask(SURVEY, lambda _prompt: next(typed), shown.append) == {"budget": "1:80,3:20"}
    assert "  3) travel" in shown
    assert any("the points add up to 110, over the total of 100; take 10 off" in s for s in shown)


def test_the_summary_shows_a_split_by_option_name() -> None:
    budget = SURVEY.question("budget")
    assert _show(budget, "1:80,3:20") == "training 80, travel 20 (100 of 100 points)"
    assert _show(budget, {"tools": 5}) == "tools 5 (5 of 100 points)"
    assert _show(budget, "0,0,0") == "no points (0 of 100 points)"


def test_the_outbox_limit_in_the_help_is_the_outbox_default() -> None:
    assert OUTBOX_MAX_REPORTS == DEFAULT_MAX_REPORTS
