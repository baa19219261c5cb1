"""docs/CLIENT.md run as written: the "Uploading" section's Python and shell
blocks in order against a real leader and helper, from a folder holding
tasks/ages.client.toml; the "Collecting from Python" block after `veil
collect` has spent one collection of the task's budget, as a reader who
followed docs/DEPLOYING.md has done; and the Prio3 core's snippet."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment import start_deployment
from tests.support.docs import section_blocks
from veil.client import Client, Outbox
from veil.collector import Collector
from veil.task import CollectorTask, DpSpec, VdafSpec, load_task
from veil.vdaf import Prio3Histogram

DOC = "docs/CLIENT.md"


def run_python(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__doc__"}
    exec(compile(code, DOC, "exec"), namespace)
    return namespace


def test_uploading_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = section_blocks(DOC, "Uploading")
    assert [b.lang for b in blocks].count("python") >= 5
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
        for block in blocks:
            if block.lang == "python":
                run_python(block.code)
            else:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", block.code],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert done.returncode == 0, done.stderr
        # Blocking 1 + 3, asyncio 1 + 3, settings 3, outbox 1, shell 2, prepared 1: each once.
        assert dep.stored_reports("ages") == 15
        with Outbox(work / "ages.outbox") as box:
            (status,) = box.status()
        assert (status.pending, status.delivered) == (0, 3)
    finally:
        dep.stop()


def test_the_deploying_task_has_a_budget_for_both_collections() -> None:
    (task_new,) = [
        b.code
        for b in section_blocks("docs/DEPLOYING.md", "Running the servers by hand", "sh")
        if "task new" in b.code
    ]
    # One collection by `veil collect`, one by the "Collecting from Python" block.
    assert "--epsilon 1 --budget 2" in task_new


@pytest.mark.slow
def test_collecting_from_python_collects_what_it_uploaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The task is docs/DEPLOYING.md's (`--budget 2`) with a time precision of
    2 s, so that the block's wait for its interval to end is short. The block's
    uploads name their report time, so that all four land in the interval it
    collects even when the clock crosses into the next one between them."""
    (block,) = section_blocks(DOC, "Collecting from Python", "python")
    dp = DpSpec("geometric", epsilon="1", budget="2")
    vdaf = VdafSpec("sum", max_measurement=100)
    tasks = {"ages": (vdaf, dp, {"min_batch_size": 3, "time_precision": 2})}
    dep = start_deployment(tmp_path / "servers", tasks)
    try:
        work = tmp_path / "app"
        (work / "tasks").mkdir(parents=True)
        for role in ("client", "collector"):
            shutil.copy(dep.local.root / f"ages.{role}.toml", work / "tasks" / f"ages.{role}.toml")
        collector_task = load_task(work / "tasks" / "ages.collector.toml", CollectorTask)
        # What `veil collect` did before: one collection, spending half the budget.
        first = int(time.time()) // 2 * 2
        with Client(load_task(work / "tasks" / "ages.client.toml")) as client:
            client.upload_batch([34, 27, 51], first)
        time.sleep(max(0, first + 2 + 1 - time.time()))
        with Collector(collector_task) as collector:
            collector.collect(start=first - 2, duration=4)
        monkeypatch.chdir(work)
        run_python(block.code)
        printed = capsys.readouterr().out
        # The 4 reports it uploaded, and what was spent, as people read numbers.
        assert re.fullmatch(r"-?\d+ in \[-?\d+, -?\d+\], 4 reports, epsilon 1\n", printed), printed
    finally:
        dep.stop()


def test_the_prio3_core_runs_as_written() -> None:
    (block,) = section_blocks(DOC, "The Prio3 core", "python")
    namespace = run_python(block.code)
    vdaf, public_share, input_shares = (
        namespace[k] for k in ("vdaf", "public_share", "input_shares")
    )
    # What the snippet made is a report of that VDAF: its shares verify and
    # aggregate to the measurement it sharded (bucket 7 of 10).
    assert isinstance(vdaf, Prio3Histogram) and len(input_shares) == 2
    ctx, nonce = namespace["ctx"], namespace["nonce"]
    verify_key = bytes(vdaf.VERIFY_KEY_SIZE)
    states, shares = zip(
        *(
            vdaf.verify_init(verify_key, ctx, j, None, nonce, public_share, s)
            for j, s in enumerate(input_shares)
        ),
        strict=True,
    )
    message = vdaf.verifier_shares_to_message(ctx, None, list(shares))
    outs = [vdaf.verify_next(ctx, s, message) for s in states]
    agg = [vdaf.agg_update(None, vdaf.agg_init(None), out) for out in outs]
    assert vdaf.unshard(None, agg, 1) == [int(i == 7) for i in range(10)]
