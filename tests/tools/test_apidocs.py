"""The API reference builds without a warning, covers the public modules,
and the client library's public names all carry a docstring."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from tools.apidocs import PUBLIC_MODULES, build


def test_reference_builds_without_warnings(tmp_path: Path) -> None:
    assert build(tmp_path) == []
    for module in PUBLIC_MODULES:
        assert (tmp_path / (module.replace(".", "/") + ".html")).is_file()
    client = (tmp_path / "veil/client.html").read_text()
    for name in ("AsyncClient", "Outbox", "prepare_report", "RetryPolicy", "UploadResult"):
        assert f'id="{name}"' in client


def test_script_without_pdoc_says_what_to_install(tmp_path: Path) -> None:
    # With only `pip install -e .` (the quick start) it was a traceback.
    script = Path(__file__).resolve().parents[2] / "scripts" / "gen_api_docs.py"
    hide_pdoc = (
        "import runpy, sys; sys.modules['pdoc'] = None; "
        f"sys.argv = ['gen_api_docs.py', '--out', {str(tmp_path / 'api')!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", hide_pdoc], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "gen_api_docs: pdoc is not installed; install the test extra: pip install -e '.[test]'\n"
    )
    assert not (tmp_path / "api").exists()


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
