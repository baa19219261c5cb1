"""`veil survey deploy`: permissions, refusal to overwrite, and a deployment
that really runs (plaintext on loopback) from the written files."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from tests.support.window import LONG_WINDOW, close_survey
from veil.client import Client, UploadError
from veil.collector import CollectionError, Collector
from veil.deploy import DeployError, deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.survey import DESCRIPTION_FILE, SurveyError, load_description, parse_survey
from veil.task import ClientTask, CollectorTask, HelperTask, LeaderTask, load_task
from veil.times import format_time

WINDOW = "opens = 2026-05-01T00:00:00Z\ncloses = 2026-05-08T00:00:00Z\n"

SURVEY = """\
[survey]
name = "deploy test"
epsilon = 1
mechanism = "none"
min_batch_size = 5
{window}
[[question]]
id = "likes"
kind = "yes_no"

[[question]]
id = "score"
kind = "integer"
max = 10
text = "Score, 0 to 10"
"""


def survey_text(window: str = WINDOW) -> str:
    return SURVEY.format(window=window)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_owner_only_except_client(tmp_path: Path) -> None:
    text = survey_text()
    survey = parse_survey(text)
    dep = deploy_survey(survey, text, tmp_path / "out", "a.example:443", "b.example:443")
    for party in ("leader", "helper", "collector"):
        assert mode(tmp_path / "out" / party) == 0o700
        for f in (tmp_path / "out" / party).rglob("*"):
            assert mode(f) == (0o700 if f.is_dir() else 0o600), f
    for f in dep.client_dir.glob("*.toml"):
        assert mode(f) == 0o644
        assert load_task(f, ClientTask).role == "client"  # no secrets: a client file
        assert "verify_key" not in f.read_text() and "private" not in f.read_text()
    assert load_task(dep.collector_dir / "likes.toml", CollectorTask).role == "collector"
    assert load_task(dep.leader_config.parent / "tasks" / "likes.toml", LeaderTask)
    assert load_task(dep.helper_config.parent / "tasks" / "likes.toml", HelperTask)
    assert "[tls]" in dep.leader_config.read_text()
    assert mode(dep.client_dir / DESCRIPTION_FILE) == 0o644


def test_public_description_and_task_windows(tmp_path: Path) -> None:
    text = survey_text()
    survey = parse_survey(text)
    dep = deploy_survey(survey, text, tmp_path / "out", "a.example:443", "b.example:443")
    described = load_description(dep.client_dir)
    assert described.survey.questions == survey.questions
    assert (described.survey.opens, described.survey.closes) == (survey.opens, survey.closes)
    for q in survey.questions:
        client = load_task(described.task_files[q.id])
        assert described.task_ids[q.id] == client.id_text
        assert (client.not_before, client.not_after) == (survey.opens, survey.closes)
        for party in ("leader/tasks", "helper/tasks", "collector"):
            task = load_task(dep.out / party / f"{q.id}.toml")
            assert (task.not_before, task.not_after) == (survey.opens, survey.closes)
    doc = json.loads((dep.client_dir / DESCRIPTION_FILE).read_text())
    assert doc["opens"] == "2026-05-01T00:00:00Z" and doc["questions"][1]["max"] == 10
    assert "verify_key" not in (dep.client_dir / DESCRIPTION_FILE).read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not a survey description"),
        ('{"format": "veil-survey/2"}', "not a veil-survey/1"),
        ("[]", "not a veil-survey/1"),
        ("PATCH", "questions"),
        ("TRAVERSE", "same directory"),
        ("KIND", "unknown kind"),
        ("OPENS", "no UTC offset"),
    ],
)
def test_hostile_descriptions_are_refused(tmp_path: Path, content: str, message: str) -> None:
    text = survey_text()
    dep = deploy_survey(parse_survey(text), text, tmp_path / "out", "a:1", "b:2")
    good = json.loads((dep.client_dir / DESCRIPTION_FILE).read_text())
    edits = {
        "PATCH": {**good, "questions": "all"},
        "TRAVERSE": {**good, "questions": [{**good["questions"][0], "task_file": "../x.toml"}]},
        "KIND": {**good, "questions": [{**good["questions"][0], "kind": "essay"}]},
        "OPENS": {**good, "opens": "2026-05-01T00:00:00"},
    }
    target = dep.client_dir / DESCRIPTION_FILE
    target.chmod(0o644)
    target.write_text(json.dumps(edits[content]) if content in edits else content)
    with pytest.raises(SurveyError, match=message):
        load_description(dep.client_dir)


def test_a_survey_without_window_is_not_deployed(tmp_path: Path) -> None:
    text = survey_text(window="")
    with pytest.raises(DeployError, match="needs a window: add `opens` and `closes`"):
        deploy_survey(parse_survey(text), text, tmp_path / "out", "a:1", "b:2")
    assert not (tmp_path / "out").exists()


def test_refuses_existing_directory_and_bad_addresses(tmp_path: Path) -> None:
    text = survey_text()
    survey = parse_survey(text)
    (tmp_path / "taken").mkdir()
    with pytest.raises(DeployError, match="already exists"):
        deploy_survey(survey, text, tmp_path / "taken", "a:1", "b:2")
    with pytest.raises(DeployError, match="host:port"):
        deploy_survey(survey, text, tmp_path / "new", "a", "b:2")
    assert not (tmp_path / "new").exists()
    # A link planted at the name, even one to nowhere, is not followed.
    (tmp_path / "planted").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DeployError, match="already exists"):
        deploy_survey(survey, text, tmp_path / "planted", "a:1", "b:2")
    assert not (tmp_path / "elsewhere").exists()


def test_written_deployment_runs(tmp_path: Path) -> None:
    # A window of an hour from now (time precision 2 s): uploads inside it
    # are taken; collecting is refused while it is open; closed now
    # (tests/support/window.py), the batch is released and later uploads are
    # refused.
    opens = int(time.time()) // 2 * 2
    closes = opens + LONG_WINDOW
    text = survey_text(
        f'time_precision = 2\nopens = "{format_time(opens)}"\ncloses = "{format_time(closes)}"\n'
    )
    survey = parse_survey(text)
    leader_addr = f"127.0.0.1:{free_port()}"
    helper_addr = f"127.0.0.1:{free_port()}"
    dep = deploy_survey(survey, text, tmp_path / "out", leader_addr, helper_addr, tls=False)
    # Exact sums (mechanism none): each operator opts in in its own config.
    for config in (dep.leader_config, dep.helper_config):
        config.write_text("allow_exact_release = true\n" + config.read_text())
    servers = [
        ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper_addr),
        ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader_addr),
    ]
    try:
        for s in servers:
            s.start()
        with Client(load_task(dep.client_dir / "score.toml")) as client:
            client.upload_batch([1, 2, 3, 4, 10], opens)
        with (
            Collector(load_task(dep.collector_dir / "score.toml")) as collector,
            pytest.raises(CollectionError, match="accepts reports until"),
        ):
            collector.collect(opens, closes - opens, wait=10)
        closes = close_survey(dep.out, servers)
        with Collector(load_task(dep.collector_dir / "score.toml")) as collector:
            result = collector.collect(opens, closes - opens, wait=60)
        assert result.report_count == 5 and result.estimate == 20
        with (
            Client(load_task(dep.client_dir / "score.toml")) as client,
            pytest.raises(UploadError, match=r"OUT_OF_RANGE.*the survey is closed"),
        ):
            client.upload(1, closes)
    finally:
        for s in servers:
            s.stop()


def test_ca_pins(tmp_path: Path) -> None:
    from tests.support.tls import new_ca, pem
    from veil.trust import fingerprint

    (_, LEADER_CA), (_, HELPER_CA) = new_ca("leader CA"), new_ca("helper CA")
    LEADER_PEM, HELPER_PEM = pem(LEADER_CA), pem(HELPER_CA)

    text = survey_text()
    survey = parse_survey(text)
    args = (survey, text)
    bad = [
        ({"leader_ca": LEADER_PEM}, "give both --leader-ca and --helper-ca"),
        ({"leader_ca": LEADER_PEM, "helper_ca": LEADER_PEM}, "the same certificate"),
        ({"leader_ca": LEADER_PEM + HELPER_PEM, "helper_ca": HELPER_PEM}, "holds 2 certificates"),
        ({"leader_ca": b"junk", "helper_ca": HELPER_PEM}, "the leader's CA: no PEM certificate"),
        ({"leader_ca": LEADER_PEM, "helper_ca": HELPER_PEM, "tls": False}, "drop --no-tls"),
    ]
    for kwargs, message in bad:
        with pytest.raises(DeployError, match=message):
            deploy_survey(*args, tmp_path / "bad", "a:1", "b:2", **kwargs)  # type: ignore[arg-type]
        assert not (tmp_path / "bad").exists()
    dep = deploy_survey(
        *args, tmp_path / "out", "a:1", "b:2", leader_ca=LEADER_PEM, helper_ca=HELPER_PEM
    )
    for f in [*dep.client_dir.glob("*.toml"), *dep.collector_dir.glob("*.toml")]:
        if f.name == "survey.toml":
            continue
        task = load_task(f)
        assert task.leader_ca_sha256 == fingerprint(LEADER_CA), f
        assert task.helper_ca_sha256 == fingerprint(HELPER_CA), f
    assert (dep.client_dir / "leader-ca.pem").read_bytes() == LEADER_PEM
    assert mode(dep.client_dir / "helper-ca.pem") == 0o644
    assert (tmp_path / "out" / "leader" / "tls" / "helper-ca.crt").read_bytes() == HELPER_PEM


def test_command_names_where_the_certificates_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "an empty tls/ folder", which the leader's is not (the helper's CA
    # is there), and named no file; the files it names are those the configs read.
    import tomllib

    from veil.cli import main

    (tmp_path / "s.toml").write_text(survey_text())
    out = tmp_path / "d"
    args = ["survey", "deploy", "--survey", str(tmp_path / "s.toml"), "--out", str(out)]
    assert main([*args, "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2"]) == 0
    said = capsys.readouterr().out
    for role in ("leader", "helper"):
        tls = tomllib.loads((out / role / f"{role}.toml").read_text())["tls"]
        assert f"{out / role}/{tls['cert']}" in said
        assert f"{tls['key'].removeprefix('tls/')}" in said
    assert "empty" not in said


def test_written_configs_log_as_the_readme_says(tmp_path: Path) -> None:
    # They wrote log_format = "json" while the docs say servers log text lines.
    import tomllib

    operating = (Path(__file__).resolve().parents[1] / "docs" / "OPERATING.md").read_text()
    assert "## Logs\n\nText lines by default" in operating
    dep = deploy_survey(
        parse_survey(survey_text()), survey_text(), tmp_path / "d", "127.0.0.1:1", "127.0.0.1:2",
        tls=False,
    )  # fmt: skip
    for config in (dep.leader_config, dep.helper_config):
        assert tomllib.loads(config.read_text())["log_format"] == "text"
