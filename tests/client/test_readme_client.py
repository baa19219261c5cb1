"""The README's "Client library" section, run as written against a real
leader and helper: every Python and shell block, in order, from a folder
holding tasks/ages.client.toml."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.deployment import start_deployment
from veil.client import Outbox
from veil.task import DpSpec, VdafSpec

ROOT = Path(__file__).resolve().parents[2]


def section_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Client library\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(python|sh)\n(.*?)```", section, re.S)


def test_client_library_section_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = section_blocks()
    assert [kind for kind, _ in blocks].count("python") >= 4
    tasks = {"ages": (VdafSpec("sum", max_measurement=100), DpSpec("none"), {"min_batch_size": 1})}
    dep = start_deployment(tmp_path / "servers", tasks)
    try:
        work = tmp_path / "app"
        (work / "tasks").mkdir(parents=True)
        shutil.copy(dep.local.root / "ages.client.toml", work / "tasks" / "ages.client.toml")
        monkeypatch.chdir(work)
        env = dict(
            os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
        )
        for kind, code in blocks:
            if kind == "python":
                exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
            elif "gen_api_docs" in code:
                continue  # built by tests/test_api_docs.py
            else:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", code],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert done.returncode == 0, done.stderr
        # Blocking 1 + 3, asyncio 1 + 3, outbox 1, shell 2, prepared 1: each once.
        assert dep.stored_reports("ages") == 12
        with Outbox(work / "ages.outbox") as box:
            (status,) = box.status()
        assert (status.pending, status.delivered) == (0, 3)
    finally:
        dep.stop()
