"""`veil survey close` and `veil survey extend` on a deployment's files
(veil.cli.window, veil.reschedule): what each writes, and what each refuses
before writing anything. The servers taking the new window: tests/integration/
test_survey_lifecycle.py."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from veil.cli import main
from veil.collector.survey import load_collector_dir
from veil.deploy import deploy_survey
from veil.survey import parse_survey
from veil.survey.description import load_description
from veil.task import HelperTask, LeaderTask, load_task
from veil.times import format_time

TP = 60
SURVEY = """\
[survey]
name = "window"
epsilon = 1
time_precision = 60
# The dates are the trial's.
opens = {opens}
closes = {closes}   # a week

[[question]]
id = "remote"
kind = "yes_no"
text = "Remote?"

[[question]]
id = "days"
kind = "integer"
max = 7
text = "Days in the office?"
"""


def _deploy(root: Path, opens: int, closes: int) -> Path:
    text = SURVEY.format(opens=format_time(opens), closes=format_time(closes))
    out = root / "dep"
    deploy_survey(parse_survey(text), text, out, "127.0.0.1:1", "127.0.0.1:2", tls=False)
    return out


@pytest.fixture
def window() -> tuple[int, int]:
    opens = int(time.time()) // TP * TP - TP
    return opens, opens + 7 * 86400


@pytest.fixture
def dep(tmp_path: Path, window: tuple[int, int]) -> Path:
    return _deploy(tmp_path, *window)


def _ends(dep: Path) -> set[int]:
    """The window's end in every file of the deployment that states it."""
    ends = set()
    for role, kind in (("leader", LeaderTask), ("helper", HelperTask)):
        ends |= {load_task(p, kind).not_after for p in (dep / role / "tasks").glob("*.toml")}
    files = load_collector_dir(dep / "collector")
    ends |= {t.not_after for t in files.tasks.values()}
    assert files.survey.closes is not None
    ends.add(files.survey.closes)
    description = load_description(dep / "client")
    ends |= {t.not_after for t in description.load_tasks().values()}
    assert description.survey.closes is not None
    ends.add(description.survey.closes)
    return ends


def _snapshot(dep: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(dep.rglob("*")) if p.is_file()}


def test_close_changes_every_party_s_files(
    dep: Path, window: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    opens, closes = window
    at = opens + 2 * TP
    survey_toml = (dep / "collector" / "survey.toml").read_text()
    assert main(["survey", "close", str(dep), "--at", format_time(at)]) == 0
    out = capsys.readouterr().out
    assert f"the survey closes at {format_time(at)} (was {format_time(closes)})" in out
    assert "in leader/, helper/, collector/, client/" in out
    assert "DIRECTORY" not in out  # every party's files are here
    assert "kill -HUP" in out
    assert _ends(dep) == {at}
    # The survey file keeps its text, comments and all, but the end.
    assert (dep / "collector" / "survey.toml").read_text() == survey_toml.replace(
        f"closes = {format_time(closes)}", f"closes = {format_time(at)}"
    )
    # Modes as deployed: the client's files public, the others private.
    assert (dep / "client" / "survey.json").stat().st_mode & 0o777 == 0o644
    assert (dep / "client" / "remote.toml").stat().st_mode & 0o777 == 0o644
    assert (dep / "leader" / "tasks" / "remote.toml").stat().st_mode & 0o777 == 0o600
    assert (dep / "collector" / "survey.toml").stat().st_mode & 0o777 == 0o600
    # Run again (the same command twice): nothing to do.
    assert main(["survey", "close", str(dep), "--at", format_time(at)]) == 0
    assert "nothing changed" in capsys.readouterr().out


BREAKDOWN = """
[[question]]
id = "team"
kind = "choice"
options = ["design", "sales"]
text = "Team?"

[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"
"""


def test_a_breakdown_s_files_change_with_the_questions(
    tmp_path: Path, window: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    # A breakdown is a task of its own in every party's files. collector/'s
    # were left out, and a survey with a breakdown could not be closed at
    # all: "leader/ and collector/ hold the task files of different tasks".
    opens, closes = window
    text = SURVEY.format(opens=format_time(opens), closes=format_time(closes)) + BREAKDOWN
    dep = tmp_path / "dep"
    deploy_survey(parse_survey(text), text, dep, "127.0.0.1:1", "127.0.0.1:2", tls=False)
    at = opens + 2 * TP
    assert main(["survey", "close", str(dep), "--at", format_time(at)]) == 0
    assert "18 files changed in leader/, helper/, collector/, client/" in capsys.readouterr().out
    assert _ends(dep) == {at}
    breakdown = load_collector_dir(dep / "collector").tasks["remote_by_team"]
    assert breakdown.not_after == at
    # The survey operator's part alone, as its organisation would run it.
    later = opens + 1 * TP
    assert main(["survey", "close", str(dep / "collector"), "--at", format_time(later)]) == 0
    assert "5 files changed in collector/" in capsys.readouterr().out
    assert load_collector_dir(dep / "collector").tasks["remote_by_team"].not_after == later


def test_each_organisation_changes_its_own_part(
    dep: Path, window: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    opens, _ = window
    until = opens + 14 * 86400
    assert main(["survey", "extend", str(dep / "leader"), "--until", format_time(until)]) == 0
    assert (
        "the other parties (helper/, collector/, client/) change their own files the same way:"
        f" veil survey extend DIRECTORY --until {format_time(until)}"
    ) in capsys.readouterr().out
    leader = {load_task(p, LeaderTask).not_after for p in (dep / "leader" / "tasks").glob("*")}
    helper = {load_task(p, HelperTask).not_after for p in (dep / "helper" / "tasks").glob("*")}
    assert leader == {until} and helper == {opens + 7 * 86400}
    # The deployment as a whole now disagrees with itself: refused, naming a file.
    before = _snapshot(dep)
    assert main(["survey", "extend", str(dep), "--until", format_time(until)]) == 2
    err = capsys.readouterr().err
    assert "gives its task the window" in err and "not one survey's deployment" in err
    assert _snapshot(dep) == before
    for part in ("helper", "collector", "client"):
        assert main(["survey", "extend", str(dep / part), "--until", format_time(until)]) == 0
    assert _ends(dep) == {until}


def test_close_now_rounds_up_to_the_time_precision(
    dep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.time()
    assert main(["survey", "close", str(dep)]) == 0
    (end,) = _ends(dep)
    assert end % TP == 0 and began <= end < time.time() + TP
    assert f"closes at {format_time(end)}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("verb", "when", "refusal"),
    [
        ("close", lambda o, c: c + TP, "is after the survey's current end"),
        ("close", lambda o, c: o, "is not after the survey opens"),
        ("close", lambda o, c: o + TP + 1, "is not aligned to the survey's time precision of 60 s"),
        ("extend", lambda o, c: c - TP, "is before the survey's current end"),
        ("extend", lambda o, c: o + TP + 7, "use "),
    ],
)
def test_what_is_no_close_or_extension_is_refused(
    dep: Path,
    window: tuple[int, int],
    verb: str,
    when: object,
    refusal: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _snapshot(dep)
    t = when(*window)  # type: ignore[operator]
    option = "--at" if verb == "close" else "--until"
    assert main(["survey", verb, str(dep), option, format_time(t)]) == 2
    assert refusal in capsys.readouterr().err
    assert _snapshot(dep) == before


def test_an_extension_to_a_time_past_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A survey that closed an hour ago, extended to a minute ago: it would
    # reopen nothing.
    now = int(time.time()) // TP * TP
    dep = _deploy(tmp_path, now - 7200, now - 3600)
    before = _snapshot(dep)
    assert main(["survey", "extend", str(dep), "--until", format_time(now - TP)]) == 2
    assert "has passed: extend the survey to a time still to come" in capsys.readouterr().err
    assert _snapshot(dep) == before
    assert main(["survey", "extend", str(dep), "--until", format_time(now + 3600)]) == 0
    assert _ends(dep) == {now + 3600}


def test_a_collected_survey_is_not_extended(
    dep: Path, window: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    (dep / "collector" / "collected-into.json").write_text("{}")
    before = _snapshot(dep)
    until = format_time(window[1] + 86400)
    assert main(["survey", "extend", str(dep), "--until", until]) == 2
    assert "extending never reopens it" in capsys.readouterr().err
    assert _snapshot(dep) == before


def test_mixed_deployments_are_refused(
    tmp_path: Path, window: tuple[int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    one = _deploy(tmp_path / "one", *window)
    two = _deploy(tmp_path / "two", *window)
    # The helper's part of another deployment of the same survey: same
    # window, other tasks.
    shutil.rmtree(one / "helper")
    shutil.copytree(two / "helper", one / "helper")
    before = _snapshot(one)
    at = format_time(window[0] + 2 * TP)
    assert main(["survey", "close", str(one), "--at", at]) == 2
    assert "hold the task files of different tasks" in capsys.readouterr().err
    assert _snapshot(one) == before


def test_what_is_not_a_deployment_is_refused(
    tmp_path: Path, dep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["survey", "close", str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["survey", "close", str(tmp_path / "empty")]) == 2
    assert "neither a deployment" in capsys.readouterr().err
    # A task file broken by hand: named, nothing written.
    (dep / "leader" / "tasks" / "days.toml").write_text("role = 'leader'\n")
    before = _snapshot(dep)
    assert main(["survey", "close", str(dep)]) == 2
    assert "days.toml" in capsys.readouterr().err
    assert _snapshot(dep) == before
    # A survey.json edited to another end than its task files.
    doc = json.loads((dep / "client" / "survey.json").read_text())
    doc["closes"] = format_time(int(time.time()) // TP * TP + 3 * 86400)
    (dep / "client" / "survey.json").write_text(json.dumps(doc))
    assert main(["survey", "close", str(dep / "client")]) == 2
    assert "gives the survey the window" in capsys.readouterr().err


def test_a_time_without_an_offset_is_refused(dep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["survey", "extend", str(dep), "--until", "2030-01-01T00:00:00"])
    assert stopped.value.code == 2
    assert "has no UTC offset" in capsys.readouterr().err


def test_close_now_ends_after_every_report_made_by_now(
    dep: Path, window: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Now a third of a second into an aligned second: a report made in that
    # third carries the interval starting at that second, so the survey must
    # close at the end of that interval, not at its start (already passed).
    opens, _ = window
    aligned = opens + 3 * TP
    monkeypatch.setattr(time, "time", lambda: aligned + 0.3)
    assert main(["survey", "close", str(dep)]) == 0
    assert _ends(dep) == {aligned + TP}
