"""The `veil` command by hand: task new, leader, helper, upload, collect."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.cli import run_veil as veil
from tests.support.deployment import Server, free_port
from veil.times import format_time

pytestmark = pytest.mark.slow


def test_cli_round_trip(tmp_path: Path) -> None:
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    made = veil(
        "task", "new", "--vdaf", "sum", "--max-measurement", "50", "--min-batch-size", "3",
        "--mechanism", "none", "--leader", leader, "--helper", helper, "--name", "ages",
        "--out", "tasks", "--leader-config", "leader.toml", "--helper-config", "helper.toml",
        cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "allow_exact_release = true" in made.stderr  # mechanism none: each server opts in
    for role in ("leader", "helper"):
        config = tmp_path / f"{role}.toml"
        config.write_text("allow_exact_release = true\n" + config.read_text())
    assert (tmp_path / "tasks" / "ages.client.toml").exists()
    assert (tmp_path / "tasks" / "ages.leader.toml").stat().st_mode & 0o077 == 0
    servers = [
        Server("helper", tmp_path / "helper.toml", tmp_path / "helper.log", helper),
        Server("leader", tmp_path / "leader.toml", tmp_path / "leader.log", leader),
    ]
    try:
        for s in servers:
            s.start()
        # The collections below default to the last complete hour, each in
        # its own process: an hour turning before the last of them would move
        # it. With under a minute of this hour left, start in the next one.
        time.sleep(max(0.0, 60 - (3600 - time.time() % 3600)))
        now = int(time.time())
        t = now - now % 3600 - 3600
        (tmp_path / "values.txt").write_text("# ages\n10\n20\n")
        up = veil(
            "upload", "--task", "tasks/ages.client.toml", "--time", str(t), "--file", "values.txt",
            "30", cwd=tmp_path,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert "uploaded 3 reports" in up.stdout
        bad = veil("upload", "--task", "tasks/ages.client.toml", "51", cwd=tmp_path)
        assert bad.returncode == 2 and "invalid measurement: value 1:" in bad.stderr
        # Errors in a file name its line, not an index into the batch.
        (tmp_path / "bad.txt").write_text("# ages\n10\n\n51\n")
        bad = veil("upload", "--task", "tasks/ages.client.toml", "--file", "bad.txt", cwd=tmp_path)
        assert bad.returncode == 2 and "invalid measurement: bad.txt:4:" in bad.stderr, bad.stderr
        (tmp_path / "bad.txt").write_text("10\nforty\n")
        bad = veil("upload", "--task", "tasks/ages.client.toml", "--file", "bad.txt", cwd=tmp_path)
        assert bad.returncode == 2 and "bad.txt:2: not a valid" in bad.stderr, bad.stderr
        # The default batch is the last complete hour, where the reports went.
        job = "0123456789abcdef0123456789abcdef"
        out = veil("collect", "--task", "tasks/ages.collector.toml", "--job-id", job, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["report_count"] == 3 and result["estimate"] == 60
        assert result["batch"]["start"] == t and result["collection_job_id"] == job
        # --job-id resumes (here: fetches again) the same collection.
        resumed = veil(
            "collect", "--task", "tasks/ages.collector.toml", "--job-id", job, cwd=tmp_path
        )
        assert resumed.returncode == 0 and json.loads(resumed.stdout)["estimate"] == 60
        again = veil(
            "collect", "--task", "tasks/ages.collector.toml", "--start", format_time(t),
            cwd=tmp_path,
        )  # fmt: skip
        assert again.returncode == 1 and "FAILED_PRECONDITION" in again.stderr
        assert "collected at most once" in again.stderr
    finally:
        for s in servers:
            s.stop()


def test_server_refuses_plaintext_off_loopback(tmp_path: Path) -> None:
    (tmp_path / "leader.toml").write_text('listen = "0.0.0.0:0"\nstorage = "l.db"\n')
    r = veil("leader", "--config", "leader.toml", cwd=tmp_path)
    assert r.returncode == 2 and "without TLS" in r.stderr


def test_server_config_errors_are_reported(tmp_path: Path) -> None:
    (tmp_path / "helper.toml").write_text(
        'listen = "127.0.0.1:0"\nstorage = "h.db"\nlisten_port = 1\n'
    )
    r = veil("helper", "--config", "helper.toml", cwd=tmp_path)
    assert r.returncode == 2 and "unknown setting 'listen_port'" in r.stderr
    (tmp_path / "helper.toml").write_text(
        'listen = "127.0.0.1:0"\nstorage = "h.db"\ntasks = ["x.toml"]\n'
    )
    r = veil("helper", "--config", "helper.toml", cwd=tmp_path)
    assert r.returncode == 2 and "x.toml" in r.stderr
