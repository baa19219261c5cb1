"""The privacy statement for the public (issue 41, item 3): two or three plain
sentences first, computed from the exact statement's own guarantees, and the
exact statement kept for auditors in a details section, on report.html and on
the survey page."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest

from veil.render.html import report_html
from veil.survey import parse_survey
from veil.survey.budget import with_local_epsilon
from veil.survey.statement import guess_rate, public_sentences, survey_statement
from veil.web.page import render_page

HEAD = """\
[survey]
name = "Check-in"
{budget}
{extra}
expected_respondents = 100
opens = 2026-12-01T00:00:00Z
closes = 2026-12-15T00:00:00Z
"""
YES_NO = '[[question]]\nid = "remote"\ntext = "Do you work remotely?"\nkind = "yes_no"\n'
TEXT = '[[question]]\nid = "editor"\ntext = "Which editor?"\nkind = "text"\n'
GAUSSIAN_TEXT = TEXT + 'mechanism = "gaussian"\n'
# What an auditor reads and a respondent should not have to.
JARGON = ("L1", "L2", "ε", "ρ", "DP", "min_batch_size", "prefixes", "neighbouring", "replace_one")


def _survey(budget: str, questions: str, extra: str = ""):  # type: ignore[no-untyped-def]
    return parse_survey(HEAD.format(budget=budget, extra=extra) + questions, "s.toml")


def _stated_rate(sentence: str) -> float:
    (figure,) = re.findall(r"right at most ([\d.]+)% of the time", sentence)
    return float(figure) / 100


@pytest.mark.parametrize("epsilon", ["0.25", "1", "2", "5"])
def test_the_first_sentence_is_the_statements_epsilon_in_words(epsilon: str) -> None:
    survey = _survey(f"epsilon = {epsilon}", YES_NO + YES_NO.replace("remote", "office"))
    g = survey_statement(survey).against_collector
    assert g.epsilon == Fraction(epsilon)
    what, who, unit = public_sentences(survey)
    # The best guess between two answers from everything published: e^ε / (1 + e^ε),
    # rounded up to the tenth of a percent shown.
    exact = math.exp(float(epsilon)) / (1 + math.exp(float(epsilon)))
    assert guess_rate(g) == pytest.approx(exact)
    assert exact <= _stated_rate(what) < exact + 0.001
    assert "two encrypted shares" in who and "only by pooling" in who
    assert "Nothing limits a person to one set of answers" in unit
    for sentence in (what, who, unit):
        assert not [word for word in JARGON if word in sentence], sentence


def test_zcdp_states_its_delta_in_the_rate_and_invitations_the_person() -> None:
    survey = _survey("rho = 0.1", GAUSSIAN_TEXT, "invitations = true")
    g = survey_statement(survey).against_collector
    assert g.rho == Fraction(1, 10) and g.delta is not None and g.epsilon is not None
    what, _, unit = public_sentences(survey)
    odds = math.exp(float(g.epsilon))
    assert _stated_rate(what) >= (odds + float(g.delta)) / (1 + odds)
    assert "Each invitation answers once, so this holds for you as a person." in unit
    # The text question's release chance is the statement's own.
    q = survey.question("editor")
    stated = q.release_threshold(survey.expected_respondents).release_probability
    assert f"published with a chance of at most {stated:.2g}" in unit


def test_a_local_layer_and_no_noise_change_what_is_said() -> None:
    survey = with_local_epsilon(_survey("epsilon = 1", YES_NO), Fraction(1))
    everyone = survey_statement(survey).against_everyone
    assert everyone is not None
    _, who, _ = public_sentences(survey)
    assert "could not be sure of them even by pooling their shares" in who
    assert _stated_rate(who) >= guess_rate(everyone)
    (what, *_) = public_sentences(_survey('mechanism = "none"', YES_NO))
    assert what.startswith("No noise is added to this survey's results")


def test_report_and_page_lead_with_the_sentences_and_keep_the_exact_statement() -> None:
    survey = _survey("epsilon = 1", YES_NO + TEXT)
    sentences = public_sentences(survey)
    exact = survey_statement(survey).lines()
    assert any("L1 = " in line for line in exact)
    report = report_html(survey, [])
    page = render_page(survey, "sha384-x", "sha384-y")
    for html, box in ((report, '<div class="privacy"'), (page, '<div class="about"')):
        plain, _, details = html.partition("<details>")
        assert details, "no details section"
        # What a respondent reads first carries none of the auditor's words.
        lead = plain[plain.index(box) :]
        for word in ("L1 = ", "pure ε-DP", "min_batch_size", "4096 prefixes"):
            assert word not in lead
        text = " ".join(re.sub("<[^>]+>", " ", lead).split())
        for sentence in sentences:
            assert " ".join(sentence.replace("'", "&#x27;").split()) in text
        assert "The exact privacy statement, for auditors" in details
        for line in exact:
            assert line.replace("'", "&#x27;") in details
