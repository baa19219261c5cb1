"""`veil survey deploy --protocol dap` (issue 43): every question's task gets
the [dap] table `veil task new --protocol dap` writes, each server's config
its `[dap] listen`, and the command prints each task's id and
TaskConfiguration; `veil survey close` leaves the TaskConfiguration every
share binds as it was, and `veil survey extend` past the deployed
task_interval is refused when another implementation serves the task.
Malformed values are refused with one line and nothing written. A survey
deployed so, run through real servers: tests/integration/test_dap_survey.py."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import pytest

from veil.cli import main
from veil.dap.messages import TaskConfiguration
from veil.dap.versions import DapVersion
from veil.task import ClientTask, CollectorTask, DapSpec, HelperTask, LeaderTask, load_task
from veil.times import format_time

OPENS, CLOSES = 1_777_593_600, 1_777_593_600 + 7 * 86_400
SURVEY = f"""\
[survey]
name = "dap deploy"
epsilon = 1
min_batch_size = 5
opens = {format_time(OPENS)}
closes = {format_time(CLOSES)}
{{extra}}
[[question]]
id = "likes"
kind = "yes_no"

[[question]]
id = "score"
kind = "integer"
max = 10
{{question}}"""
TEXT_QUESTION = '\n[[question]]\nid = "editor"\nkind = "text"\n'
LEADER, HELPER = "http://127.0.0.1:8001/", "http://127.0.0.1:8002/dap/"


def _dap(leader: str = LEADER, helper: str = HELPER) -> tuple[str, ...]:
    return ("--protocol", "dap", "--dap-leader", leader, "--dap-helper", helper)


DAP = _dap()


def _deploy(tmp_path: Path, *options: str, extra: str = "", question: str = "") -> tuple[int, Path]:
    survey = tmp_path / "survey.toml"
    survey.write_text(SURVEY.format(extra=extra, question=question))
    out = tmp_path / "dep"
    code = main(
        [
            "survey", "deploy", "--survey", str(survey), "--out", str(out),
            "--leader", "127.0.0.1:7001", "--helper", "127.0.0.1:7002", "--no-tls", *options,
        ]
    )  # fmt: skip
    return code, out


def test_every_task_and_server_gets_its_dap_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _deploy(
        tmp_path, "--protocol", "dap", "--dap-leader", LEADER, "--dap-helper", HELPER,
        "--task-info", "dap deploy",
    )  # fmt: skip
    said = capsys.readouterr().out
    assert code == 0
    want = DapSpec(LEADER, HELPER, "dap-19", "dap deploy", task_interval=(OPENS, CLOSES))
    for qid in ("likes", "score"):
        tasks = [
            load_task(out / "leader" / "tasks" / f"{qid}.toml", LeaderTask),
            load_task(out / "helper" / "tasks" / f"{qid}.toml", HelperTask),
            load_task(out / "collector" / f"{qid}.toml", CollectorTask),
            load_task(out / "client" / f"{qid}.toml", ClientTask),
        ]
        assert {t.dap for t in tasks} == {want}
        assert len({t.task_id for t in tasks}) == 1
        client = tasks[-1]
        # What another implementation needs, printed: the id and the bytes.
        configuration = client.dap_configuration().encode(DapVersion.DAP_19)
        assert f"  {qid}: {client.task_id.hex()}\n    {configuration.hex()}\n" in said
        decoded = TaskConfiguration.decode(configuration, DapVersion.DAP_19)
        assert decoded.leader_aggregator_endpoint == LEADER.encode()
    for role, port in (("leader", 8001), ("helper", 8002)):
        config = tomllib.loads((out / role / f"{role}.toml").read_text())
        assert config["dap"] == {"listen": f"127.0.0.1:{port}"}


def test_closing_early_keeps_what_every_share_binds(tmp_path: Path) -> None:
    code, out = _deploy(tmp_path, *DAP)
    assert code == 0
    path = out / "client" / "score.toml"
    before = load_task(path, ClientTask)
    end = OPENS + 86_400
    assert main(["survey", "close", str(out), "--at", format_time(end)]) == 0
    after = load_task(path, ClientTask)
    assert (after.not_before, after.not_after) == (OPENS, end)
    # DAP's task_interval is the window as deployed: a report sealed before
    # the close still opens at both aggregators after it.
    assert after.dap_configuration() == before.dap_configuration()
    assert load_task(out / "helper" / "tasks" / "score.toml", HelperTask).dap == before.dap


def test_with_another_helper_only_the_leader_checks_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _deploy(
        tmp_path, *DAP, "--dap-other-implementation", "helper", extra="invitations = true"
    )
    said = capsys.readouterr().out
    assert code == 0
    task = load_task(out / "leader" / "tasks" / "score.toml", LeaderTask)
    assert task.issuer_public_key is not None and task.dap is not None
    assert task.dap.other_implementation == "helper"
    privacy = said[said.index("privacy (the whole survey") :]
    assert "only veil's leader checks tokens" in " ".join(privacy.split())
    # With both aggregators veil, both check: the statement has no such note.
    (tmp_path / "both").mkdir()
    code, _ = _deploy(tmp_path / "both", *DAP, extra="invitations = true")
    assert code == 0
    assert "only veil's" not in capsys.readouterr().out


def test_without_dap_nothing_changes(tmp_path: Path) -> None:
    code, out = _deploy(tmp_path)
    assert code == 0
    assert load_task(out / "client" / "score.toml", ClientTask).dap is None
    assert "dap" not in tomllib.loads((out / "leader" / "leader.toml").read_text())


@pytest.mark.parametrize(
    ("options", "extra", "question", "message"),
    [
        (("--dap-leader", LEADER), "", "", "--dap-leader belongs to --protocol dap"),
        (("--task-info", "x"), "", "", "--task-info belongs to --protocol dap"),
        (
            ("--protocol", "dap", "--dap-leader", LEADER),
            "",
            "",
            "--protocol dap needs --dap-leader and --dap-helper",
        ),
        ((*DAP, "--dap-version", "dap-17"), "", "", "unknown DAP version 'dap-17'"),
        (
            (*DAP, "--dap-other-implementation", "collector"),
            "",
            "",
            "other_implementation must be one of leader, helper",
        ),
        ((*DAP, "--task-info", "x" * 256), "", "", "task_info is 256 bytes"),
        ((*DAP, "--batch-mode", "leader-selected"), "", "", "is not for surveys"),
        (
            (*DAP, "--dap-other-implementation", "leader"),
            "invitations = true",
            "",
            "cannot have another DAP implementation as its leader",
        ),
        (
            _dap("https://127.0.0.1:8001/"),
            "",
            "",
            "the leader's DAP endpoint 'https://127.0.0.1:8001/' must be an http URL",
        ),
        (
            _dap(helper="http://:8002/"),
            "",
            "",
            "names no host",
        ),
        (
            _dap("http://127.0.0.1:99999/"),
            "",
            "",
            "has no valid port",
        ),
        (
            _dap("http://127.0.0.1:7001/"),
            "",
            "",
            "is on its gRPC port 7001",
        ),
        (DAP, "", TEXT_QUESTION, "question 'editor' is a poplar1 task, which DAP cannot carry"),
    ],
)
def test_malformed_values_are_refused_and_nothing_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: tuple[str, ...],
    extra: str,
    question: str,
    message: str,
) -> None:
    code, out = _deploy(tmp_path, *options, extra=extra, question=question)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("veil survey deploy: ") and message in err, err
    assert err.count("\n") == 1, err
    assert not out.exists()


DAY = 86_400


def _deploy_ahead(tmp_path: Path, *options: str) -> tuple[Path, int, int]:
    """The survey deployed over DAP with a window that is still to come:
    (the deployment, its opening, its end)."""
    opens = (int(time.time()) // DAY + 2) * DAY
    closes = opens + 7 * DAY
    text = SURVEY.format(extra="", question="")
    text = text.replace(format_time(OPENS), format_time(opens))
    text = text.replace(format_time(CLOSES), format_time(closes))
    (tmp_path / "survey.toml").write_text(text)
    out = tmp_path / "dep"
    code = main(
        [
            "survey", "deploy", "--survey", str(tmp_path / "survey.toml"), "--out", str(out),
            "--leader", "127.0.0.1:7001", "--helper", "127.0.0.1:7002", "--no-tls", *DAP,
            *options,
        ]
    )  # fmt: skip
    assert code == 0
    return out, opens, closes


def _files(out: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _extend(out: Path, until: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["survey", "extend", str(out), "--until", format_time(until)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("other", ["helper", "leader"])
def test_extending_past_the_interval_another_implementation_enforces_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], other: str
) -> None:
    out, opens, closes = _deploy_ahead(tmp_path, "--dap-other-implementation", other)
    assert main(["survey", "close", str(out), "--at", format_time(opens + DAY)]) == 0
    before = _files(out)
    code, err = _extend(out, closes + DAY, capsys)
    assert code == 2
    assert err.startswith("veil survey extend: ") and err.count("\n") == 1, err
    assert f"another implementation as the {other}" in err
    assert f"extend the survey to {format_time(closes)} at the latest" in err
    assert _files(out) == before
    # Each party's part alone is refused too: every one holds the [dap] table.
    for part in ("leader", "helper", "collector", "client"):
        assert _extend(out / part, closes + DAY, capsys)[0] == 2
    assert _files(out) == before
    # Back to the deployed end, inside the interval: veil's servers and the
    # other implementation take the same reports.
    assert _extend(out, closes, capsys)[0] == 0
    after = load_task(out / "client" / "score.toml", ClientTask)
    assert after.not_after == closes
    assert after.dap is not None and after.dap.task_interval == (opens, closes)


def test_extending_past_the_interval_between_two_veils_moves_the_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both aggregators veil: each follows the window its files state, and the
    # bytes every share binds stay as deployed.
    out, _, closes = _deploy_ahead(tmp_path)
    path = out / "helper" / "tasks" / "likes.toml"
    bound = load_task(path, HelperTask).dap_configuration()
    assert _extend(out, closes + DAY, capsys)[0] == 0
    after = load_task(path, HelperTask)
    assert after.not_after == closes + DAY
    assert after.dap_configuration() == bound


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("task_interval_end", '"soon"', "task_interval_end"),
        ("task_interval_end", "-1", "task_interval_end"),
        ("task_interval_end", "1.5", "task_interval_end"),
        ("task_interval_end", str(2**64), "task_interval_end"),
        ("task_interval_end", "0", "task_interval_start must be before task_interval_end"),
        ("other_implementation", '"collector"', "other_implementation must be one of"),
        ("other_implementation", "7", "other_implementation"),
    ],
)
def test_a_hostile_dap_table_stops_an_extension_with_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, message: str
) -> None:
    out, _, closes = _deploy_ahead(tmp_path, "--dap-other-implementation", "helper")
    path = out / "leader" / "tasks" / "score.toml"
    text = path.read_text()
    lines = [line for line in text.splitlines() if not line.startswith(f"{key} =")]
    at = lines.index("[dap]") + 1
    path.write_text("\n".join([*lines[:at], f"{key} = {value}", *lines[at:]]) + "\n")
    before = _files(out)
    code, err = _extend(out, closes + DAY, capsys)
    assert code == 2
    assert err.startswith("veil survey extend: ") and message in err, err
    assert _files(out) == before
