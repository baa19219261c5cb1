"""The math core stays pure: importing every module of veil.vdaf and veil.dp
in a fresh interpreter loads no database or gRPC library and no other
part of veil (dependencies point one way: vdaf <- dp <- the rest). No two
packages or modules of veil import each other, directly or around a cycle;
each package imports only the layers below it, as docs/ARCHITECTURE.md draws
them (one table here, checked against the doc's picture); and only the
message conversion, the services and the clients import the generated
protocol code."""

from __future__ import annotations

import ast
import json
import re
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


# The layers of veil, bottom first, as docs/ARCHITECTURE.md draws them ("The
# rule: dependencies point one way"): a package or top-level module imports
# only what is in a layer below its own, never its own layer's others.
PLUMBING = (
    "settings",
    "files",
    "trust",
    "grpc_util",
    "times",
    "logs",
    "metrics",
    "tuning",
    "observations",
)
LAYERS: tuple[tuple[str, ...], ...] = (
    ("vdaf", "protocol", *PLUMBING),
    ("dp", "messages"),
    ("hpke", "invite"),
    ("dap",),
    ("task",),
    ("survey",),
    ("render",),
    ("client", "aggregator", "collector", "deploy", "reschedule"),
    ("web", "local"),
    ("cli",),
)
LAYER = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

# The modules that import the generated protocol code (veil.protocol.v1): the
# one conversion between message values and protobuf (and the aggregators'
# own rejection codes and interval), the gRPC services and the server that
# registers them, and the clients (the client library, the leader's client of
# the helper, the collector).
PROTOCOL_USERS = (
    "veil.messages.wire",
    "veil.aggregator.wire",
    "veil.aggregator.run.service",
    "veil.aggregator.run.server",
    "veil.client.*",
    "veil.aggregator.leader.helper_client",
    "veil.collector.collector",
)


def _unit(module: str) -> str:
    return module.split(".")[1]


def _layer_violations(graph: dict[str, set[str]], layer: dict[str, int]) -> list[str]:
    """Each import of `graph` (module to modules) that does not point to a
    layer below the importer's, as 'importer -> imported (layer a -> b)'."""
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = _unit(name), _unit(target)
            if a != b and not layer[b] < layer[a]:
                found.append(f"{name} -> {target} (layer {layer[a]} -> {layer[b]})")
    return found


def test_each_package_imports_only_the_layers_below_it() -> None:
    graph = _import_graph(99)
    units = {_unit(m) for m in graph} | {_unit(m) for t in graph.values() for m in t}
    top = {
        p.stem if p.suffix == ".py" else p.name
        for p in (SRC / "veil").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    assert {"vdaf", "aggregator", "cli"} <= units <= top  # the walk works
    assert sorted(top - LAYER.keys()) == [], "place these in LAYERS (and the doc's picture)"
    violations = _layer_violations(graph, LAYER)
    assert violations == [], "imports against the layers:\n" + "\n".join(violations)


def test_the_layer_check_sees_an_upward_or_sideways_import() -> None:
    # Control: an import up a layer or across one is found, one down is not.
    layer = {"low": 0, "mid": 1, "side": 1, "top": 2}
    graph = {"veil.mid.a": {"veil.low.b", "veil.top.c", "veil.side.d", "veil.mid.e"}}
    assert _layer_violations(graph, layer) == [
        "veil.mid.a -> veil.side.d (layer 1 -> 1)",
        "veil.mid.a -> veil.top.c (layer 1 -> 2)",
    ]


def _doc_chains() -> list[list[list[str]]]:
    """The picture of docs/ARCHITECTURE.md's rule: each line a chain of
    groups (a name, or names in braces), lowest first."""
    doc = (SRC.parent / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"## The rule[^\n]*\n+```\n(.*?)```", doc, re.S)
    assert block is not None, "docs/ARCHITECTURE.md has no picture under 'The rule'"
    return [
        [[n.strip() for n in group.strip(" {}").split(",")] for group in line.split("<-")]
        for line in block.group(1).splitlines()
    ]


def test_the_layers_are_the_ones_the_architecture_doc_draws() -> None:
    chains = _doc_chains()
    drawn = {name for chain in chains for group in chain for name in group}
    assert sorted(drawn - LAYER.keys()) == [], "the doc draws a package the table lacks"
    assert sorted(LAYER.keys() - drawn - set(PLUMBING)) == [], "the doc does not draw these"
    for chain in chains:
        layers = [sorted({LAYER[name] for name in group}) for group in chain]
        assert all(len(ls) == 1 for ls in layers), f"a group of {chain} spans layers: {layers}"
        assert [ls[0] for ls in layers] == sorted({ls[0] for ls in layers}), (
            f"the doc's {chain} climbs otherwise than LAYERS: {layers}"
        )


def _protocol_users(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        name
        for name, targets in graph.items()
        if _unit(name) != "protocol" and any(_unit(t) == "protocol" for t in targets)
    )


def test_only_the_services_and_clients_import_the_generated_protocol_code() -> None:
    users = _protocol_users(_import_graph(99))
    assert "veil.aggregator.run.service" in users  # the walk works
    allowed = [
        name
        for name in users
        if name in PROTOCOL_USERS or f"{name.rpartition('.')[0]}.*" in PROTOCOL_USERS
    ]
    assert users == allowed, f"import veil.protocol: {sorted(set(users) - set(allowed))}"


def _imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def test_the_benchmarks_import_nothing_from_the_tests() -> None:
    # What a benchmark needs (a throwaway PostgreSQL, a leader in this
    # process) lives in bench/, which the tests may import, not the reverse.
    root = SRC.parent
    paths = sorted([*root.glob("scripts/*.py"), *root.glob("bench/*.py")])
    assert len(paths) > 20
    found = {
        p.relative_to(root).as_posix(): sorted(
            n for n in _imports_of(p) if n == "tests" or n.startswith("tests.")
        )
        for p in paths
    }
    assert {p: names for p, names in found.items() if names} == {}
