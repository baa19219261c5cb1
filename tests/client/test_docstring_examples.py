"""The client library's own examples (the `Client` and `AsyncClient`
docstrings, which the API reference shows) run as written against a real
leader and helper, from a folder holding client/task.toml."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from tests.support.deployment import start_deployment
from veil.client import AsyncClient, Client
from veil.task import DpSpec, VdafSpec


def example(cls: type) -> str:
    doc = cls.__doc__ or ""
    block = doc.split("Example::\n", 1)[1]
    return textwrap.dedent(block)


def test_client_and_async_client_examples_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `load_task("client/task.toml")` failed with AttributeError: 'str' object
    # has no attribute 'read_text'; the asynchronous example was not a program.
    tasks = {"task": (VdafSpec("count"), DpSpec("none"), {"min_batch_size": 1})}
    dep = start_deployment(tmp_path / "servers", tasks)
    try:
        work = tmp_path / "app"
        (work / "client").mkdir(parents=True)
        shutil.copy(dep.local.root / "task.client.toml", work / "client" / "task.toml")
        monkeypatch.chdir(work)
        for cls in (Client, AsyncClient):
            code = example(cls)
            assert 'load_task("client/task.toml")' in code
            exec(compile(code, f"{cls.__name__} docstring", "exec"), {"__name__": "__example__"})
        # Each example uploads 1 + 3 reports.
        assert dep.stored_reports("task") == 8
    finally:
        dep.stop()
