"""`veil upload --outbox` and `veil outbox flush|status` given files and
arguments they cannot use: one line `veil <command>: <message>`, exit 2,
nothing written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from veil.cli import main
from veil.client import Outbox, prepare_reports
from veil.hpke import ROLE_HELPER, ROLE_LEADER, generate_keypair
from veil.task import DpSpec, VdafSpec, new_task, write_toml

FILES = new_task(
    VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none")
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def task_file(tmp_path: Path) -> str:
    path = tmp_path / "client.toml"
    write_toml(path, FILES.client.to_dict(), secret=True)
    return str(path)


def test_status_of_a_missing_or_foreign_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "outbox", "status", "--outbox", str(tmp_path / "none"))
    assert code == 2 and err == f"veil outbox status: no outbox at {tmp_path / 'none'}\n"
    assert not (tmp_path / "none").exists()
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n" * 100)
    code, _, err = run(capsys, "outbox", "status", "--outbox", str(text))
    assert code == 2 and err.startswith("veil outbox status: ") and "not a veil outbox" in err
    assert err.count("\n") == 1
    assert text.read_text() == "my notes\n" * 100


def test_flush_of_a_foreign_file(
    tmp_path: Path, task_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n" * 100)
    code, _, err = run(capsys, "outbox", "flush", "--outbox", str(text), "--task", task_file)
    assert code == 2 and err.startswith("veil outbox flush: ") and err.count("\n") == 1
    code, _, err = run(
        capsys, "outbox", "flush", "--outbox", str(tmp_path / "none"), "--task", task_file
    )
    assert code == 2 and "no outbox at" in err


def test_upload_with_a_foreign_outbox_or_bad_bound(
    tmp_path: Path, task_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n" * 100)
    code, _, err = run(capsys, "upload", "--task", task_file, "--outbox", str(text), "1")
    assert code == 2 and err.startswith("veil upload: ") and "not a veil outbox" in err
    for bad in ("0", "-3", "many"):
        code, _, err = run(
            capsys, "upload", "--task", task_file, "--outbox", "x", "--outbox-max", bad, "1"
        )
        assert code == 2 and "--outbox-max" in err
    for bad in ("-1", "some"):
        code, _, err = run(capsys, "upload", "--task", task_file, "--retries", bad, "1")
        assert code == 2 and "--retries" in err
    assert not Path("x").exists()


def test_upload_to_a_full_outbox_stores_nothing(
    tmp_path: Path, task_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    box = tmp_path / "box"
    keys = generate_keypair(1), generate_keypair(2)
    with Outbox(box) as outbox:
        configs = keys[0].config, keys[1].config
        outbox.add(FILES.client.task_id, prepare_reports(FILES.client, [1, 1], *configs, 0))
        # Configs fetched just now: the client seals without the network.
        for role, config in zip((ROLE_LEADER, ROLE_HELPER), configs, strict=True):
            outbox.save_config(FILES.client.task_id, role, config, time.time())
    code, _, err = run(
        capsys, "upload", "--task", task_file, "--outbox", str(box), "--outbox-max", "3", "1", "1"
    )
    assert code == 1 and "is full" in err and err.count("\n") == 1
    code, out, _ = run(capsys, "outbox", "status", "--outbox", str(box), "--json")
    assert code == 0 and json.loads(out)[0]["pending"] == 2
