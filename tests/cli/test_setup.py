"""`veil task new` (veil.cli.setup) against what may already be at its file names:
a planted link is never written through, an existing task never replaced
without --force."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from veil.cli import main as veil_main
from veil.task import CollectorTask, load_task


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
