"""The operator's commands (veil.cli.operator) on input they cannot use.

`veil collect` refuses, before any connection, what would close a batch
respondents may still upload to or what it cannot parse: one line, exit 2.

`veil survey collect` and `veil survey status` on files they cannot use:
one line, exit 2, nothing collected and no connection made (the aggregators
here do not exist).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from veil.cli import main
from veil.collector.survey import STATE_FORMAT
from veil.deploy import deploy_survey
from veil.survey import parse_survey
from veil.task import DapSpec, DpSpec, VdafSpec, new_task, write_toml
from veil.times import format_time


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    task = new_task(
        VdafSpec("count"), "127.0.0.1:9", "127.0.0.1:9", min_batch_size=1, dp=DpSpec("none")
    )
    paths = {}
    for role in ("collector", "client"):
        paths[role] = tmp_path / f"{role}.toml"
        write_toml(paths[role], getattr(task, role).to_dict(), secret=True)
    return paths


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        rc = main(["collect", *args])
    except SystemExit as e:  # a task file of another role: refused while loading it
        rc = int(str(e.code))
    return rc, capsys.readouterr().err.strip()


def test_refusals(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    collector = str(files["collector"])
    hour = int(time.time()) // 3600 * 3600
    cases = [
        (["--task", str(files["client"])], "the collector needs its own"),
        (["--task", collector, "--start", "yesterday"], "--start: 'yesterday' is not an RFC 3339"),
        (["--task", collector, "--start", "2026-05-01T09:00:00"], "has no UTC offset"),
        (["--task", collector, "--start", str(hour + 5)], "not aligned to the task's time"),
        (["--task", collector, "--start", format_time(hour)], "has not ended"),
        (["--task", collector, "--duration", "100"], "multiple of 3600 s"),
        (["--task", collector, "--job-id", "abc"], "--job-id must be 32 hex digits"),
    ]
    for args, message in cases:
        rc, err = run(capsys, *args)
        assert rc == 2 and err.startswith("veil collect: ") and message in err, (args, err)
        assert len(err.splitlines()) == 1, err


def test_help_says_what_an_open_batch_costs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["collect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--include-open" in text and "stops every later upload to it" in text
    assert "last complete interval" in text


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
"""


def deployment(tmp_path: Path, closes_in: int) -> Path:
    now = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(now - 600), closes=format_time(now + closes_in))
    dep = deploy_survey(parse_survey(text), text, tmp_path / "dep", "127.0.0.1:9", "127.0.0.1:9")
    return dep.collector_dir


def collect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(["survey", "collect", *args])
    return rc, capsys.readouterr().err.strip()


def test_refused_before_the_window_closes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    collector = deployment(tmp_path, 3600)
    rc, err = collect(capsys, "--survey-dir", str(collector), "--out", str(tmp_path / "r"))
    assert rc == 2 and "the survey closes at" in err and "nothing was collected" in err
    assert not (tmp_path / "r" / "state.json").exists()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("{", "cannot resume from it"),
        ('{"format": "other"}', "cannot resume from it"),
        (
            json.dumps(
                {"format": STATE_FORMAT, "survey": "t", "batch": {"start": 0, "duration": 60},
                 "jobs": {}}
            ),
            "over another batch: give another --out directory",
        ),
        (
            json.dumps(
                {"format": STATE_FORMAT, "survey": "t", "batch": {"start": 0, "duration": 60},
                 "jobs": {"remote": "xyz"}}
            ),
            "cannot resume from it",
        ),
    ],
)  # fmt: skip
def test_a_state_file_it_did_not_write_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], state: str, message: str
) -> None:
    collector = deployment(tmp_path, -60)
    out = tmp_path / "r"
    out.mkdir()
    (out / "state.json").write_text(state)
    rc, err = collect(capsys, "--survey-dir", str(collector), "--out", str(out))
    assert rc == 2 and message in err, err
    assert len(err.splitlines()) == 1
    assert (out / "state.json").read_text() == state  # left as it was


def test_not_a_collector_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    collector = deployment(tmp_path, -60)
    rc, err = collect(capsys, "--survey-dir", str(tmp_path), "--out", str(tmp_path / "r"))
    assert rc == 2 and "give the collector/ directory" in err
    client = collector.parent / "client"
    rc, err = collect(capsys, "--survey-dir", str(client), "--out", str(tmp_path / "r"))
    assert rc == 2 and "give the collector/ directory" in err
    (collector / "remote.toml").write_text("role = 'collector'\n")
    rc, err = collect(capsys, "--survey-dir", str(collector), "--out", str(tmp_path / "r"))
    assert rc == 2 and "question 'remote'" in err
    assert main(["survey", "status", "--survey-dir", str(tmp_path)]) == 2


def test_collect_names_an_unreachable_leader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens on 127.0.0.1:9: the error says which server, at which
    address, instead of gRPC's "failed to connect to all addresses"."""
    collector = deployment(tmp_path, -60)
    rc = main(
        [
            "collect",
            "--task",
            str(collector / "remote.toml"),
            "--wait",
            "0.5",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert "the leader at 127.0.0.1:9 cannot be reached" in err
    assert "\n" not in err


@pytest.fixture
def dap_files(tmp_path: Path) -> dict[str, Path]:
    dap = DapSpec("http://127.0.0.1:9/", "http://127.0.0.1:9/h/")
    task = new_task(
        VdafSpec("count"), "127.0.0.1:9", "127.0.0.1:9", min_batch_size=1, dp=DpSpec("none"),
        dap=dap,
    )  # fmt: skip
    paths = {}
    for role in ("collector", "client"):
        paths[role] = tmp_path / f"dap.{role}.toml"
        write_toml(paths[role], getattr(task, role).to_dict(), secret=True)
    return paths


def test_refusals_for_a_leader_selected_dap_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """veil collect names no batch of a task whose leader chooses them:
    each option that would is refused alone, before any connection."""
    dap = DapSpec("http://127.0.0.1:9/", "http://127.0.0.1:9/h/", batch_mode="leader-selected")
    task = new_task(
        VdafSpec("count"), "127.0.0.1:9", "127.0.0.1:9", min_batch_size=1, dp=DpSpec("none"),
        dap=dap,
    )  # fmt: skip
    collector = tmp_path / "collector.toml"
    write_toml(collector, task.collector.to_dict(), secret=True)
    hour = int(time.time()) // 3600 * 3600
    for option in (
        ["--start", format_time(hour - 3600)],
        ["--duration", "3600"],
        ["--include-open"],
    ):
        rc, err = run(capsys, "--task", str(collector), *option)
        assert rc == 2 and err.startswith(f"veil collect: {option[0]} names a batch"), err
        assert "this task is leader-selected" in err and len(err.splitlines()) == 1
    # A job id names the leader's job: one of another length or alphabet is
    # refused before any connection.
    for job in ("00" * 15, "00" * 17, "zz" * 16, "-" + "0" * 31):
        rc, err = run(capsys, "--task", str(collector), "--job-id", job)
        assert rc == 2 and "--job-id must be 32 hex digits" in err, err
    # Without them (or with a job id) it asks the leader, which nothing answers here.
    for option in ([], ["--job-id", "00" * 16]):
        rc, err = run(capsys, "--task", str(collector), "--wait", "1", *option)
        assert rc == 1 and "cannot reach" in err, err


def test_refusals_for_a_dap_task(
    dap_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """What veil collect and veil upload refuse for a task served over DAP,
    before any connection (nothing listens at its endpoints)."""
    collector, client = str(dap_files["collector"]), str(dap_files["client"])
    job = "00" * 16
    hour = int(time.time()) // 3600 * 3600
    for args, message in [
        (["--task", collector, "--job-id", "abc"], "--job-id must be 32 hex digits"),
        (["--task", collector, "--job-id", job + "00"], "--job-id must be 32 hex digits"),
        (["--task", collector, "--job-id", "g" * 32], "--job-id must be 32 hex digits"),
        (["--task", collector, "--start", format_time(hour)], "has not ended"),
        (["--task", collector, "--duration", "-3600"], "multiple of 3600 s"),
        (["--task", collector, "--leader-ca", "/nonexistent/ca.pem"], "ca.pem"),
    ]:
        rc, err = run(capsys, *args)
        assert rc == 2 and err.startswith("veil collect: ") and message in err, (args, err)
        assert len(err.splitlines()) == 1, err
    for args, message in [
        (["--client-cert", "c.pem", "1"], "--client-cert cannot be used"),
        (
            ["--client-key", "k.pem", "--client-cert", "c.pem", "1"],
            "--client-cert and --client-key",
        ),
        (["1", "abc"], "value 2: not a valid count measurement"),
        ([], "give a value or --file"),
        (["--file", "/nonexistent/values.txt"], "cannot read --file"),
    ]:
        rc = main(["upload", "--task", client, *args])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.startswith("veil upload: ") and message in err, (args, err)
