"""`veil collect` refuses, before any connection, what would close a batch
respondents may still upload to or what it cannot parse: one line, exit 2."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from veil.cli import main
from veil.task import DpSpec, VdafSpec, new_task, write_toml
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
