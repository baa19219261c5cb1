"""docs/SURVEYS.md's "Run a survey" walk-through, run as written: each shell
block in order, in an empty directory, with the `veil` of this checkout. Only
the window differs: the document's is three minutes on a time precision of
a minute, waited out with `sleep 180`; the test's is an hour on a second,
closed as soon as the respondents are done, as the document's "Closing a
survey early" says (tests/support/window.py), and collected without the
sleep. The ports are free ones, and the servers the document starts in the
background are started and stopped by the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import section_blocks
from tests.support.window import LONG_WINDOW, close_survey
from veil.local.launcher import ServerProcess, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def walkthrough_blocks() -> list[str]:
    return [b.code for b in section_blocks("docs/SURVEYS.md", "Run a survey", "sh")]


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_a_survey_as_written(tmp_path: Path) -> None:
    write, deploy, servers, respond, status, collect = walkthrough_blocks()
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    ports = {"127.0.0.1:7101": leader, "127.0.0.1:7102": helper}

    def adapt(block: str) -> str:
        for old, new in ports.items():
            block = block.replace(old, new)
        return block

    # The window: an hour from now on a time precision of a second (closed
    # below), instead of the next three minutes on one of a minute.
    assert "time_precision = 60" in write and "-d '+3 min' +%Y-%m-%dT%H:%M:00Z" in write
    long = write.replace("time_precision = 60", "time_precision = 1").replace(
        "-d '+3 min' +%Y-%m-%dT%H:%M:00Z", f"-d '+{LONG_WINDOW} sec' +%Y-%m-%dT%H:%M:%SZ"
    )
    done = bash(long, tmp_path)
    assert done.returncode == 0, done.stderr
    # The plan at the expected 4 and at 1,000 respondents, as the document says.
    assert "expected accuracy at 4 respondents" in done.stdout
    assert "expected accuracy at 1,000 respondents" in done.stdout
    assert "will be marked indicative only" in done.stdout
    done = bash(adapt(deploy), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "expected accuracy at 4 respondents" in done.stdout
    assert "remote, team, tools cannot reach the target accuracy" in done.stderr
    assert "wrote the deployment of 'Team check-in'" in done.stdout

    assert "veil helper --config deployment/helper/helper.toml" in servers
    assert "veil leader --config deployment/leader/leader.toml" in servers
    dep = tmp_path / "deployment"
    processes = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in processes:
            server.start()
        done = bash(adapt(respond), tmp_path)
        assert done.returncode == 0, done.stderr
        assert "sent 12 answers of 4 respondents" in done.stdout
        done = bash(adapt(status), tmp_path)
        assert done.returncode == 0, done.stderr
        assert "remote" in done.stdout and " 4 " in done.stdout

        assert "sleep 180" in collect
        close_survey(dep, processes)
        done = bash(adapt(collect.replace("sleep 180", "true")), tmp_path)
        assert done.returncode == 0, done.stderr
    finally:
        for server in processes:
            server.stop()
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    assert [q["question"] for q in results] == ["remote", "team", "tools"]
    assert [r["label"] for r in results[1]["rows"]] == ["engineering", "design", "sales"]
    assert all(q["n"] == 4 for q in results)
    assert (tmp_path / "results" / "report.html").stat().st_size > 0
    assert (tmp_path / "results" / "results.csv").read_text().startswith("question,kind,n,")
