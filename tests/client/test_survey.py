"""`veil survey respond` and `veil.survey.SurveyClient` on malformed input:
one line naming the file, the line, the question, the answer and what is
allowed, exit status 2, and nothing sent (every answer is checked before a
connection is made: the aggregators here do not exist)."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest

from veil.cli import main
from veil.client import SurveyClient
from veil.client.survey import WindowClosed
from veil.deploy import deploy_survey
from veil.survey import AnswerError, parse_survey
from veil.times import format_time

SURVEY = """\
[survey]
name = "t"
epsilon = 1
time_precision = 60
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "remote"
kind = "yes_no"

[[question]]
id = "commute"
kind = "integer"
max = 120

[[question]]
id = "team"
kind = "choice"
options = ["engineering", "design", "sales"]
"""


@pytest.fixture
def client_dir(tmp_path: Path) -> Path:
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now - 60), closes=format_time(now + 3600))
    # Port 9 (discard) on loopback: nothing listens; nothing may be sent.
    dep = deploy_survey(parse_survey(text), text, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")
    return dep.client_dir


GOOD = {"remote": "yes", "commute": 3, "team": "design"}


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "a.jsonl",
            json.dumps(GOOD) + "\n\n" + json.dumps({**GOOD, "team": "marketing"}) + "\n",
            "a.jsonl:3: question 'team': 'marketing' is not one of the options; give one of"
            " 'engineering', 'design', 'sales'",
        ),
        ("a.jsonl", '{"remote": true}\n{"commute": 2.5}\n', "a.jsonl:2: question 'commute': 2.5"),
        ("a.jsonl", '{"colour": "red"}\n', "'colour' is not a question of this survey"),
        ("a.jsonl", '{"remote": true}\n[1, 2\n', "a.jsonl:2: not a JSON object"),
        ("a.jsonl", "[" * 100_000 + "\n", "a.jsonl:1: not a JSON object"),
        ("a.jsonl", "[1, 2]\n", "answers must be an object keyed by question id"),
        ("a.jsonl", b"\xff\xfe\n", "not UTF-8 text"),
        ("a.json", '{"remote": "maybe"}', "a.json: question 'remote': 'maybe'"),
        ("a.toml", "remote = yes\n", "a.toml: not valid TOML"),
        ("a.toml", "commute = 121\n", "give a whole number from 0 to 120"),
        ("a.txt", "yes\n", ".jsonl (one respondent a line)"),
        ("a.json", "{}", "no answers given: nothing was sent"),
    ],
)
def test_malformed_answers_are_refused_in_one_line(
    tmp_path: Path,
    client_dir: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: str | bytes,
    message: str,
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    assert main(["survey", "respond", "--survey-dir", str(client_dir), "--answers", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("veil survey respond: ") and message in err, err
    assert len(err.splitlines()) == 1, err


def test_missing_answers_file_and_directory(tmp_path: Path, client_dir: Path) -> None:
    args = ["survey", "respond", "--survey-dir", str(client_dir)]
    assert main([*args, "--answers", str(tmp_path / "none.jsonl")]) == 2
    assert main(["survey", "respond", "--survey-dir", str(tmp_path)]) == 2


def test_survey_client_checks_every_answer_first(client_dir: Path) -> None:
    with SurveyClient(client_dir) as client:
        assert client.measurements({"remote": "no", "team": "sales"}) == {"remote": 0, "team": 2}
        with pytest.raises(AnswerError, match="respondent 2: question 'commute'"):
            client.respond_many([GOOD, {"commute": -1}])


def test_outside_the_window_nothing_is_sent(client_dir: Path) -> None:
    with (
        SurveyClient(client_dir, clock=lambda: 0.0) as client,
        pytest.raises(WindowClosed, match=r"the survey opens at .* in "),
    ):
        client.respond(GOOD)
    with (
        SurveyClient(client_dir, clock=lambda: 4e9) as client,
        pytest.raises(WindowClosed, match="the survey closed at"),
    ):
        client.respond(GOOD)


def test_a_task_file_of_another_deployment_is_refused(tmp_path: Path, client_dir: Path) -> None:
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now), closes=format_time(now + 60))
    other = deploy_survey(
        parse_survey(text), text, tmp_path / "other", "127.0.0.1:9", "127.0.0.1:9"
    )
    (client_dir / "team.toml").chmod(0o644)
    (client_dir / "team.toml").write_bytes((other.client_dir / "team.toml").read_bytes())
    with pytest.raises(Exception, match="mixes two deployments"):
        SurveyClient(client_dir)


def test_an_unreachable_aggregator_is_named(client_dir: Path) -> None:
    from veil.client import Client, UploadError
    from veil.task import ClientTask, load_task

    task = load_task(client_dir / "remote.toml", ClientTask)  # both on 127.0.0.1:9
    with (
        Client(task, retries=0) as client,
        pytest.raises(UploadError, match=r"the leader at 127\.0\.0\.1:9 cannot be reached"),
    ):
        client.upload(1)


def test_report_page_is_self_contained_and_says_what_was_spent() -> None:
    from fractions import Fraction

    from veil.dp.accounting import Guarantee
    from veil.render.html import report_html
    from veil.survey.results import QuestionResult, Row

    now = int(time.time()) // 60 * 60
    survey = parse_survey(SURVEY.format(opens=format_time(now), closes=format_time(now + 60)))
    team = survey.question("team")
    rows = (Row("engineering", 5.0, -2.0, 12.0), Row("design", 1.0, -6.0, 8.0))
    results = [QuestionResult(team, 6, Guarantee.pure(Fraction(1, 4)), rows, "respondents", 0.95)]
    page = report_html(survey, results)
    # What the ledgers charge for the team question's one collection (its ε, 1/3
    # of the survey's), as `veil survey status` counts it.
    assert "budget spent ε = 0.3333 of the survey&#x27;s 1" in page
    assert page.count("<svg") == 1 and "<script" not in page and "<link" not in page
    assert "engineering" in page and "respondents" in page
    # results.json keeps the exact decimal; the page shows what a reader takes in.
    third = [QuestionResult(team, 6, Guarantee.pure(Fraction(1, 3)), rows, "", 0.95)]
    assert "ε = 0.333<" in report_html(survey, third)


def test_a_required_question_must_be_answered_and_others_may_be_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now - 60), closes=format_time(now + 3600))
    text = text.replace('kind = "yes_no"\n', 'kind = "yes_no"\nrequired = true\n')
    survey = parse_survey(text)
    assert survey.question("remote").required and not survey.question("team").required
    dep = deploy_survey(survey, text, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")
    description = json.loads((dep.client_dir / "survey.json").read_text())
    assert [q.get("required", False) for q in description["questions"]] == [True, False, False]
    with SurveyClient(dep.client_dir) as client:
        assert client.survey.question("remote").required
        # Skipped questions send nothing; the required one may not be skipped.
        assert set(client.measurements({"remote": "no"})) == {"remote"}
        with pytest.raises(AnswerError, match="question 'remote' needs an answer"):
            client.measurements({"team": "design"})
        with pytest.raises(AnswerError, match="question 'remote' needs an answer"):
            client.measurements({"remote": None, "team": "design"})
    answers = tmp_path / "a.json"
    answers.write_text('{"team": "sales"}')
    assert (
        main(["survey", "respond", "--survey-dir", str(dep.client_dir), "--answers", str(answers)])
        == 2
    )
    assert "question 'remote' needs an answer" in capsys.readouterr().err


@pytest.mark.parametrize("value", ['"yes"', "1", "[true]"])
def test_required_must_be_true_or_false(value: str) -> None:
    text = SURVEY.format(opens="2026-05-01T00:00:00Z", closes="2026-05-02T00:00:00Z")
    text = text.replace('kind = "yes_no"\n', f'kind = "yes_no"\nrequired = {value}\n')
    from veil.survey import SurveyError

    with pytest.raises(SurveyError, match="`required` must be true or false") as info:
        parse_survey(text, "s.toml")
    assert str(info.value).startswith("s.toml:11:"), info.value


def test_the_terminal_asks_a_required_question_again() -> None:
    from veil.cli.respondent import ask

    text = SURVEY.format(opens="2026-05-01T00:00:00Z", closes="2026-05-02T00:00:00Z")
    survey = parse_survey(text.replace('kind = "yes_no"\n', 'kind = "yes_no"\nrequired = true\n'))
    replies = iter(["", "yes", "", "design"])
    prompts: list[str] = []
    shown: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(replies)

    assert ask(survey, read, shown.append) == {"remote": "yes", "team": "design"}
    assert "  this question needs an answer" in shown
    assert "empty to skip" not in prompts[0] and "empty to skip" in prompts[2]


EDITOR = '\n[[question]]\nid = "editor"\ntext = "Which editor?"\nkind = "text"\nmax_bytes = 4\n'


def test_the_terminal_asks_a_text_question_until_it_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from veil.cli.respondent import ask

    text = SURVEY.format(opens="2026-05-01T00:00:00Z", closes="2026-05-02T00:00:00Z")
    survey = parse_survey(text + EDITOR)
    replies = iter(["", "", "", "Emacs", "  Vim "])
    prompts: list[str] = []
    shown: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(replies)

    assert ask(survey, read, shown.append) == {"editor": "Vim"}
    assert "a short text, at most 4 bytes, counted in lower case" in prompts[-1]
    assert any("too long: 5 bytes in UTF-8, at most 4" in line for line in shown)

    # `veil survey respond` on a terminal shows the answers before sending
    # them, a text answer with what it counts as; declined, nothing is sent.
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now - 60), closes=format_time(now + 3600)) + EDITOR
    dep = deploy_survey(parse_survey(text), text, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    typed = iter(["", "", "", "  Vim ", "n"])
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
    assert main(["survey", "respond", "--survey-dir", str(dep.client_dir)]) == 1
    out, err = capsys.readouterr()
    assert "  Which editor?: Vim (counted as 'vim')" in out
    assert "stopped: nothing was sent" in err


def test_a_points_split_over_the_total_is_refused_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now - 60), closes=format_time(now + 3600)) + (
        '\n[[question]]\nid = "budget"\nkind = "points"\noptions = ["a", "b"]\ntotal = 10\n'
    )
    dep = deploy_survey(parse_survey(text), text, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")
    with SurveyClient(dep.client_dir) as client:
        assert client.measurements({"budget": {"a": 4, "b": 6}}) == {"budget": [4, 6]}
        assert client.measurements({"budget": "b:3"}) == {"budget": [0, 3]}
        with pytest.raises(AnswerError, match="respondent 2: question 'budget': the points add"):
            client.respond_many([GOOD, {"budget": {"a": 6, "b": 6}}])
    answers = tmp_path / "a.toml"
    answers.write_text("[budget]\na = 8\nb = 3\n")
    args = ["survey", "respond", "--survey-dir", str(dep.client_dir)]
    assert main([*args, "--answers", str(answers)]) == 2
    assert main([*args, "--answer", "budget=a:8,b:3"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"veil survey respond: {answers}: question 'budget': the points add up to 11, over the"
        " total of 10; take 1 off",
        "veil survey respond: --answer 'budget=a:8,b:3': question 'budget': the points add up"
        " to 11, over the total of 10; take 1 off",
    ]
