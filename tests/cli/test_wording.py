"""What the command line says where issue 41 found it unclear: `veil --help`'s
survey line, the invitation options named, and `veil upload`'s refusal of a task
that takes invited respondents only (no "invalid measurement:" before it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from veil.cli import build_parser, main
from veil.client import SurveyClient
from veil.deploy import deploy_survey
from veil.survey import SurveyError, parse_survey
from veil.times import format_time

INVITED = """\
[survey]
name = "invited"
epsilon = 1
invitations = true
time_precision = 60
opens = {opens}
closes = {closes}

[[question]]
id = "remote"
kind = "yes_no"
"""


def test_help_names_the_survey_commands() -> None:
    help_text = " ".join(build_parser().format_help().split())
    assert "and more" not in help_text
    assert (
        "survey surveys: plan, deploy, respond, serve, invite, issuer, status, close, extend,"
        " collect" in help_text
    )


@pytest.fixture
def invited(tmp_path: Path) -> Path:
    opens = int(time.time()) // 60 * 60
    text = INVITED.format(opens=format_time(opens), closes=format_time(opens + 3600))
    deploy_survey(
        parse_survey(text), text, tmp_path / "dep", "127.0.0.1:1", "127.0.0.1:2", tls=False
    )
    return tmp_path / "dep" / "client"


def test_upload_says_why_an_invited_task_is_refused(
    invited: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upload", "--task", str(invited / "remote.toml"), "1"]) == 2
    err = capsys.readouterr().err
    assert "invalid measurement" not in err
    assert err.startswith("veil upload: this task takes reports from invited respondents only")
    assert "--invitation CODE --issuer URL" in err


def test_a_survey_client_without_an_invitation_names_the_options(invited: Path) -> None:
    with pytest.raises(SurveyError) as refused:
        SurveyClient(invited)
    assert "--invitation CODE --issuer URL" in str(refused.value)
    assert "invitation=CODE, issuer=URL" in str(refused.value)
