"""The survey page's own text (no server): what it tells a respondent."""

from __future__ import annotations

import re

from veil.survey import parse_survey
from veil.web.page import render_page

SURVEY = """
[survey]
name = "Check-in"
epsilon = 1
opens = 2026-12-01T00:00:00Z
closes = 2026-12-15T00:00:00Z

[[question]]
id = "remote"
text = "Do you work remotely?"
kind = "yes_no"
"""


def test_page_states_when_the_window_opens_and_closes() -> None:
    # `veil survey serve` renders the page once at start, often before the
    # window opens: "Open until 15 December" read as open now.
    page = render_page(parse_survey(SURVEY), "sha384-x", "sha384-y")
    assert "Open from 2026-12-01 00:00 UTC until 2026-12-15 00:00 UTC." in page


def test_page_states_the_conditions_of_its_promise() -> None:
    """Issue 25: the page said no one could read an answer, without the conditions."""
    page = " ".join(render_page(parse_survey(SURVEY), "sha384-x", "sha384-y").split())
    assert "nor this web server can read" not in page
    assert "as long as it serves the genuine survey script" in page
    assert "which could read them only by pooling their shares" in page
    assert "each organisation sees when answers arrive, and from where" in page


def test_page_gives_its_script_the_window_and_marks_required_questions() -> None:
    # The script disables the form before the window opens and after it
    # closes ("This survey opens on ..."), and a question may be skipped
    # unless the survey marks it required.
    survey = parse_survey(SURVEY + 'required = true\n[[question]]\nid = "b"\nkind = "yes_no"\n')
    page = render_page(survey, "sha384-x", "sha384-y")
    assert (
        '<form id="survey" novalidate data-opens="1796083200000" data-closes="1797292800000">'
        in page
    )
    assert '<fieldset class="question" id="q-remote" data-kind="yes_no" data-required>' in page
    assert '<fieldset class="question" id="q-b" data-kind="yes_no">' in page
    assert page.count("An answer is needed.") == 1
    assert "A question you leave unanswered is not sent" in " ".join(page.split())


def test_a_text_question_gets_a_labelled_text_input_with_its_limit() -> None:
    survey = parse_survey(
        '[survey]\nname = "s"\nepsilon = 4\n[[question]]\nid = "editor"\n'
        'text = "Which editor?"\nkind = "text"\nmax_bytes = 8\n'
    )
    page = render_page(survey, "sha384-x", "sha384-y")
    assert '<label class="text" for="a-editor">Your answer <input type="text"' in page
    assert 'aria-describedby="hint-editor err-editor"' in page
    assert "at most 8 bytes" in page and "counted in lower case" in page


def test_a_survey_by_invitation_tells_its_script_so() -> None:
    """Issue 41: the script disables the form on load when the link has no code."""
    plain = render_page(parse_survey(SURVEY), "sha384-x", "sha384-y")
    assert "data-invitations" not in plain
    invited = SURVEY.replace("[survey]\n", "[survey]\ninvitations = true\n", 1)
    page = render_page(parse_survey(invited), "sha384-x", "sha384-y")
    assert re.search(r'<form id="survey" novalidate[^>]* data-invitations>', page)


def test_a_points_question_gets_a_labelled_number_per_option_and_a_running_total() -> None:
    survey = parse_survey(
        SURVEY + '[[question]]\nid = "budget"\ntext = "Split 100 points"\nkind = "points"\n'
        'options = ["training", "<tools>"]\ntotal = 100\n'
    )
    page = render_page(survey, "sha384-x", "sha384-y")
    assert '<fieldset class="question" id="q-budget" data-kind="points">' in page
    for i, option in enumerate(["training", "&lt;tools&gt;"]):
        assert f'<label class="number" for="a-budget-{i}">{option} <input' in page
        assert f'id="a-budget-{i}" name="budget" data-index="{i}"' in page
    # Each box is described by the hint, the running total and the error.
    assert page.count('aria-describedby="hint-budget total-budget err-budget"') == 2
    assert (
        '<p class="points-total" id="total-budget" aria-live="polite" data-total="100">'
        "0 of 100 points given.</p>" in page
    )
    assert "Split up to 100 points across the options" in page
    assert '<p class="error" id="err-budget" role="alert" hidden></p>' in page
