"""Every public function that takes a file or directory takes it as a str or
any os.PathLike (the client's own docstring passed a str where only a Path
worked: AttributeError: 'str' object has no attribute 'read_text')."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
from pathlib import Path

from veil.task import DpSpec, VdafSpec, load_task, new_task, write_toml

MODULES = (
    "veil.client",
    "veil.collector",
    "veil.collector.survey",
    "veil.survey",
    "veil.task",
    "veil.deploy",
    "veil.settings",
)
PATH_NAMES = {"path", "directory", "out", "config_path", "root", "outbox"}


def test_public_path_parameters_take_str_and_pathlike() -> None:
    checked = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.startswith("_"):
                continue
            functions = [value] if inspect.isfunction(value) else []
            # (Dataclasses are values a function returns: their paths are Paths.)
            if inspect.isclass(value) and not dataclasses.is_dataclass(value):
                functions = [value.__init__]  # type: ignore[misc]
            for f in functions:
                public = getattr(module, "__all__", None)
                own = getattr(f, "__module__", "") == name
                if not (attr in public if public is not None else own):
                    continue
                for p in inspect.signature(f).parameters.values():
                    if p.name in PATH_NAMES and re.search(r"\bPath(Like)?\b", str(p.annotation)):
                        checked.append(f"{name}.{attr}({p.name})")
                        assert re.search(r"\bstr\b", str(p.annotation)), (
                            f"{name}.{attr}: {p.name}: {p.annotation}"
                        )
    assert len(checked) >= 8, checked


def test_a_task_file_by_str(tmp_path: Path) -> None:
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none")
    )
    path = os.path.join(str(tmp_path), "task.toml")
    write_toml(path, files.client.to_dict(), secret=False)
    assert load_task(path).task_id == files.client.task_id


def test_a_server_config_by_str(tmp_path: Path) -> None:
    from veil.aggregator.run.config import load_config

    path = tmp_path / "helper.toml"
    path.write_text('listen = "127.0.0.1:1"\nstorage = "h.db"\n')
    assert load_config(str(path)).listen == "127.0.0.1:1"
