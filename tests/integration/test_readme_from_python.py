"""The README's "From Python" block ("Running the servers by hand"), run as
written against a real leader and helper, after `veil collect` has already
spent one collection of the task's budget, as a reader following the README
has done. The task is the README's (`--budget 2`) but with a time precision
of 2 s, so that the block's wait for its interval to end is short.

Before the fix the block collected "the last complete interval", which was
either empty or already collected by `veil collect` (and the task's budget
allowed one collection only): it raised CollectionError as written. Its
uploads also name their report time, so that all four land in the interval
it collects even when the clock crosses into the next one between them.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from tests.integration.deployment import start_deployment
from veil.collector import Collector
from veil.task import CollectorTask, DpSpec, VdafSpec, load_task

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def from_python_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n### From Python\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)[:1]
    return code


def test_readme_task_has_a_budget_for_both_collections() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Running the servers by hand\n", 1)[1].split("\n## ", 1)[0]
    (task_new,) = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if "task new" in b]
    # One collection by `veil collect`, one by the "From Python" block.
    assert "--epsilon 1 --budget 2" in task_new


def test_readme_from_python_collects_what_it_uploaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
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
        from veil.client import Client

        # The reports name their time: an upload slower than the 2 s precision
        # (a loaded machine) must not move them out of the interval collected.
        first = int(time.time()) // 2 * 2
        with Client(load_task(work / "tasks" / "ages.client.toml")) as client:
            client.upload_batch([34, 27, 51], first)
        time.sleep(max(0, first + 2 + 1 - time.time()))
        with Collector(collector_task) as collector:
            collector.collect(start=first - 2, duration=4)
        monkeypatch.chdir(work)
        exec(compile(from_python_block(), "README.md", "exec"), {"__name__": "__readme__"})
        printed = capsys.readouterr().out
        # The 4 reports it uploaded, and what was spent, as people read numbers.
        assert re.fullmatch(r"-?\d+ in \[-?\d+, -?\d+\], 4 reports, epsilon 1\n", printed), printed
    finally:
        dep.stop()
