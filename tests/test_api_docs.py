"""The API reference builds without a warning, covers the public modules,
and the client library's public names all carry a docstring."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

from veil.apidocs import PUBLIC_MODULES, build


def test_reference_builds_without_warnings(tmp_path: Path) -> None:
    assert build(tmp_path) == []
    for module in PUBLIC_MODULES:
        assert (tmp_path / (module.replace(".", "/") + ".html")).is_file()
    client = (tmp_path / "veil/client.html").read_text()
    for name in ("AsyncClient", "Outbox", "prepare_report", "RetryPolicy", "UploadResult"):
        assert f'id="{name}"' in client


@pytest.mark.parametrize(
    "module",
    [
        "veil.client",
        "veil.messages",
        "veil.messages.wire",
        "veil.collector",
        "veil.vdaf",
        "veil.dp",
        "veil.survey",
    ],
)
def test_public_names_have_docstrings(module: str) -> None:
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or [
        n
        for n, v in vars(mod).items()
        if not n.startswith("_") and getattr(v, "__module__", "") == module
    ]
    missing = []
    for name in names:
        obj = getattr(mod, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not obj.__doc__:
            missing.append(name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                fn = (
                    value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                )
                if not attr.startswith("_") and inspect.isfunction(fn) and not fn.__doc__:
                    missing.append(f"{name}.{attr}")
    assert missing == []
