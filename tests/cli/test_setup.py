"""`veil task new` (veil.cli.setup) against what may already be at its file names:
a planted link is never written through, an existing task never replaced
without --force."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from veil.cli import main as veil_main
from veil.dap.messages import BatchMode, TaskConfiguration
from veil.dap.versions import DapVersion
from veil.task import CollectorTask, DapSpec, load_task

ROLES = ("leader", "helper", "collector", "client")


def task_new(out: Path, *extra: str) -> int:
    return veil_main(
        [
            "task", "new", "--vdaf", "count", "--leader", "127.0.0.1:1", "--helper",
            "127.0.0.1:2", "--name", "t", "--out", str(out), *extra,
        ]
    )  # fmt: skip


def test_a_planted_link_is_not_followed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tasks"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    victim.chmod(0o644)
    (out / "t.collector.toml").symlink_to(victim)
    (out / "t.leader.toml").symlink_to(tmp_path / "not-yet")  # dangling
    capsys.readouterr()
    assert task_new(out) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil task new: ") and err.count("\n") == 1
    assert "already exists" in err and "--force" in err
    assert victim.read_text() == "someone else's file\n"
    assert not (tmp_path / "not-yet").exists()
    # Nothing written: no half task beside the links.
    assert sorted(p.name for p in out.iterdir()) == ["t.collector.toml", "t.leader.toml"]
    # --force replaces the links themselves; their targets stay as they were.
    assert task_new(out, "--force") == 0
    assert victim.read_text() == "someone else's file\n" and not (tmp_path / "not-yet").exists()
    collector = out / "t.collector.toml"
    assert not collector.is_symlink()
    assert isinstance(load_task(collector, CollectorTask), CollectorTask)
    for role in ("leader", "helper", "collector"):
        assert stat.S_IMODE(os.lstat(out / f"t.{role}.toml").st_mode) == 0o600, role
    assert stat.S_IMODE(os.lstat(out / "t.client.toml").st_mode) == 0o644


def test_an_existing_task_is_kept_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "leader.toml"
    assert task_new(tmp_path, "--leader-config", str(config)) == 0
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    assert task_new(tmp_path, "--leader-config", str(config)) == 2
    err = capsys.readouterr().err
    assert "t.leader.toml already exists" in err and err.count("\n") == 1
    # Every file as it was: the running task keeps its keys, the config its list.
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    assert task_new(tmp_path, "--force", "--leader-config", str(config)) == 0
    replaced = load_task(tmp_path / "t.collector.toml", CollectorTask)
    assert replaced.id_text != load_task_bytes(files["t.collector.toml"], tmp_path).id_text


def load_task_bytes(data: bytes, tmp_path: Path) -> CollectorTask:
    copy = tmp_path / "old" / "t.collector.toml"
    copy.parent.mkdir()
    copy.write_bytes(data)
    task = load_task(copy, CollectorTask)
    assert isinstance(task, CollectorTask)
    return task


# --- --protocol dap -----------------------------------------------------------------

DAP = (
    "--protocol",
    "dap",
    "--dap-leader",
    "https://l.example/",
    "--dap-helper",
    "https://h.example/",
)


def test_a_dap_task_is_written_with_its_task_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert task_new(tmp_path, *DAP, "--task-info", "survey 7") == 0
    printed = capsys.readouterr().out
    tasks = {role: load_task(tmp_path / f"t.{role}.toml") for role in ROLES}
    for task in tasks.values():
        assert task.dap == DapSpec("https://l.example/", "https://h.example/", "dap-19", "survey 7")
    client = tasks["client"]
    configuration = client.dap_configuration()
    # The printed bytes are the TaskConfiguration every party binds.
    hex_line = next(line for line in printed.splitlines() if "TaskConfiguration" in line)
    encoded = bytes.fromhex(hex_line.split()[-1])
    assert encoded == configuration.encode(DapVersion.DAP_19)
    decoded = TaskConfiguration.decode(encoded, DapVersion.DAP_19)
    assert decoded.leader_aggregator_endpoint == b"https://l.example/"
    assert decoded.task_info == b"survey 7" and decoded.vdaf_type == 1  # Prio3Count
    assert f"task id {client.task_id.hex()} (hex)" in printed
    # --json carries the same, and -18 is chosen per task.
    assert (
        task_new(tmp_path, *DAP, "--dap-version", "dap-18", "--task-info", "x", "--force", "--json")
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    task = load_task(tmp_path / "t.collector.toml")
    assert doc["dap"] == {
        "version": "dap-18",
        "task_id_hex": task.task_id.hex(),
        "task_configuration": task.dap_configuration().encode(DapVersion.DAP_18).hex(),
    }


def test_a_dap_task_beside_another_implementation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert task_new(tmp_path, *DAP, "--dap-other-implementation", "helper", "--json") == 0
    privacy = json.loads(capsys.readouterr().out)["privacy"]
    assert privacy["noise_added_by"] == ["leader"]
    assert privacy["against_collector_and_helper"] == privacy["against_collector"]
    for role in ROLES:
        task = load_task(tmp_path / f"t.{role}.toml")
        assert task.dap is not None and task.dap.other_implementation == "helper"
    assert task_new(tmp_path, *DAP, "--dap-other-implementation", "leader", "--force") == 0
    assert "Only the helper (veil) adds noise" in capsys.readouterr().out


def test_a_leader_selected_dap_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert task_new(tmp_path, *DAP, "--batch-mode", "leader-selected", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    for role in ROLES:
        task = load_task(tmp_path / f"t.{role}.toml")
        assert task.dap is not None and task.dap.batch_mode == "leader-selected"
    config = load_task(tmp_path / "t.collector.toml").dap_configuration()
    assert config.batch_mode is BatchMode.LEADER_SELECTED
    assert doc["dap"]["task_configuration"] == config.encode(DapVersion.DAP_19).hex()
    # The default is time-interval, written as before (no key).
    assert task_new(tmp_path, *DAP, "--force") == 0
    assert "batch_mode" not in (tmp_path / "t.leader.toml").read_text()
    # Reports may expire past the margin a leader-selected batch retires
    # within (the larger of time_precision and max_clock_skew).
    assert task_new(tmp_path, *DAP, "--batch-mode", "leader-selected", "--report-expiry-age",
                    "3601", "--force") == 0  # fmt: skip
    assert load_task(tmp_path / "t.leader.toml").report_expiry_age == 3601


def test_a_grpc_task_has_no_dap_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert task_new(tmp_path, "--protocol", "grpc") == 0
    assert "TaskConfiguration" not in capsys.readouterr().out
    assert load_task(tmp_path / "t.leader.toml").dap is None


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--protocol", "dap"), "needs --dap-leader and --dap-helper"),
        (("--protocol", "dap", "--dap-leader", "https://l/"), "needs --dap-leader and"),
        (("--dap-leader", "https://l/"), "--dap-leader belongs to --protocol dap"),
        (("--task-info", "x"), "--task-info belongs to --protocol dap"),
        ((*DAP, "--dap-version", "dap-17"), "unknown DAP version 'dap-17'"),
        ((*DAP, "--dap-version", "dap-18"), "dap-18 needs a task_info of at least one byte"),
        ((*DAP, "--task-info", "é" * 128), "task_info is 256 bytes in UTF-8"),
        (("--protocol", "dap", "--dap-leader", "https://l /", "--dap-helper", "https://h/"),
         "leader_endpoint must be a URL of printable ASCII"),
        (("--protocol", "dap", "--dap-leader", "", "--dap-helper", "https://h/"),
         "leader_endpoint must be a URL"),
        (("--dap-other-implementation", "helper"),
         "--dap-other-implementation belongs to --protocol dap"),
        ((*DAP, "--dap-other-implementation", "other"),
         "other_implementation must be one of leader, helper"),
        ((*DAP, "--dap-other-implementation", ""), "other_implementation must be one of"),
        ((*DAP, "--dap-other-implementation", "helper", "--mode", "split", "--split-opt-in"),
         "use independent mode"),
        (("--batch-mode", "leader-selected"), "--batch-mode belongs to --protocol dap"),
        ((*DAP, "--batch-mode", "fixed-size"),
         "batch_mode must be one of time-interval, leader-selected, got 'fixed-size'"),
        ((*DAP, "--batch-mode", ""), "batch_mode must be one of"),
        ((*DAP, "--batch-mode", "Leader-Selected"), "batch_mode must be one of"),
        ((*DAP, "--batch-mode", "leader-selected", "--report-expiry-age", "3600"),
         "report_expiry_age = 3600 is no larger than the larger of time_precision = 3600 and"
         " max_clock_skew = 60"),
        ((*DAP, "--batch-mode", "leader-selected", "--report-expiry-age", "90",
          "--time-precision", "60", "--max-clock-skew", "90"),
         "report_expiry_age = 90 is no larger than the larger of time_precision = 60 and"
         " max_clock_skew = 90"),
    ],
    ids=["no-endpoints", "no-helper", "leader-without-dap", "info-without-dap", "version",
         "dap-18-empty-info", "info-too-long", "space-in-url", "empty-url",
         "other-without-dap", "other-unknown", "other-empty", "other-split",
         "mode-without-dap", "mode-unknown", "mode-empty", "mode-case",
         "expiry-within-precision", "expiry-within-skew"],
)  # fmt: skip
def test_malformed_dap_arguments_are_refused_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], says: str
) -> None:
    capsys.readouterr()
    assert task_new(tmp_path, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("veil task new: ") and says in err, err
    assert list(tmp_path.iterdir()) == []


def test_a_vdaf_dap_cannot_carry_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = veil_main(
        [
            "task", "new", "--vdaf", "l1boundsum", "--max-value", "3", "--length", "2",
            "--chunk-length", "1", "--leader", "127.0.0.1:1", "--helper", "127.0.0.1:2",
            "--out", str(tmp_path), *DAP,
        ]
    )  # fmt: skip
    assert code == 2
    assert "cannot be served over DAP yet" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        task_new(tmp_path, "--protocol", "http")
