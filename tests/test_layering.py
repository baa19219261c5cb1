"""The math core stays pure: importing every module of veil.vdaf and veil.dp
in a fresh interpreter loads no database or gRPC library and no other
part of veil (dependencies point one way: vdaf <- dp <- the rest). And no
two packages or modules of veil import each other, directly or around a
cycle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

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


SRC = Path(__file__).resolve().parents[1] / "src"


def _import_graph(depth: int) -> dict[str, set[str]]:
    """Which part of veil imports which, read from the source (every import
    statement, at module level or inside a function), each module named by
    its first `depth` dotted parts (2: the package, veil.aggregator)."""
    modules = {}
    for path in (SRC / "veil").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    a, b = (".".join(m.split(".")[:depth]) for m in (name, target))
                    if a != b:
                        graph.setdefault(a, set()).add(b)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (its nodes in order), or [] if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


@pytest.mark.parametrize("depth", [2, 99], ids=["packages", "modules"])
def test_no_import_cycle(depth: int) -> None:
    graph = _import_graph(depth)
    assert "veil.aggregator" in graph.get("veil.cli", set()) or depth != 2  # the walk works
    assert _cycle(graph) == [], f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_check_sees_a_cycle() -> None:
    # Control: a cycle is found, whatever the order of the walk.
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) in (
        ["a", "b", "c", "a"],
        ["b", "c", "a", "b"],
        ["c", "a", "b", "c"],
    )
    assert _cycle({"a": {"b"}, "b": {"c"}}) == []
