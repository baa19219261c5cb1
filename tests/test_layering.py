"""The math core stays pure: importing every module of veil.vdaf and veil.dp
in a fresh interpreter loads no database or gRPC library and no other
part of veil (dependencies point one way: vdaf <- dp <- the rest)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

IO_MODULES = ("sqlite3", "_sqlite3", "psycopg", "psycopg_pool", "grpc")

_PROBE = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = [package.__name__] + [
    m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
]
for name in names:
    importlib.import_module(name)
print(json.dumps({"walked": names, "loaded": sorted(sys.modules)}))
"""


def _imports(package: str) -> tuple[list[str], list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, package], capture_output=True, text=True, check=True
    ).stdout
    found = json.loads(out)
    return found["walked"], found["loaded"]


@pytest.mark.parametrize(
    ("package", "may_use"), [("veil.vdaf", ("veil.vdaf",)), ("veil.dp", ("veil.vdaf", "veil.dp"))]
)
def test_math_core_imports_no_io_and_nothing_above_it(
    package: str, may_use: tuple[str, ...]
) -> None:
    walked, loaded = _imports(package)
    assert len(walked) > 5  # the walk found the package's modules
    io = [m for m in loaded if m.split(".")[0] in IO_MODULES]
    assert io == [], f"{package} loads I/O modules: {io}"
    above = [
        m
        for m in loaded
        if m.startswith("veil.")
        and not m.startswith(tuple(p + "." for p in may_use))
        and m not in may_use
    ]
    assert above == [], f"{package} imports other parts of veil: {above}"


def test_the_probe_sees_an_io_import() -> None:
    # Control: a package that does I/O is caught by the same walk.
    _, loaded = _imports("veil.aggregator.store")
    assert "sqlite3" in loaded
