"""The observation inventory: what each party can observe, and why that is allowed.

The data is veil/data/observations.toml, one observation a line: a party, what
it observes (an id such as ``rpc:veil.protocol.v1.TaskInfo.reports`` or
``json:survey-status.questions[].reports``), its class and why. Classes:

- ``dp``: protected by differential privacy; ``budget`` names what pays.
- ``public``: public by the privacy statement (the statement says so, or it
  tells nothing about any respondent).
- ``not_observable``: the party cannot observe it (withheld, sealed, or not sent).

An observation may carry ``add_remove``: its class under add_remove neighbouring
where it differs. docs/OBSERVATIONS.md is written from the data
(`python scripts/gen_observations.py`), and tests/test_observations.py walks the
protobuf descriptors, DAP's message dataclasses (``dap:ReportMetadata.time``)
and the output formats a collector sees, and fails on any field the data does
not classify.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

__all__ = [
    "CLASSES",
    "Inventory",
    "InventoryError",
    "Observation",
    "dap_message_fields",
    "json_paths",
    "load_inventory",
    "message_fields",
    "render_markdown",
    "unclassified",
]

CLASSES = ("dp", "public", "not_observable")
# Where the generated part of docs/OBSERVATIONS.md starts and ends.
BEGIN = "<!-- generated from src/veil/data/observations.toml: do not edit below -->"
END = "<!-- end of generated part -->"


class InventoryError(ValueError):
    """The inventory data is malformed (an unknown party or class, a duplicate)."""


@dataclass(frozen=True)
class Observation:
    party: str
    what: str
    cls: str
    why: str
    budget: str | None = None
    add_remove: str | None = None

    def class_under(self, neighbouring: str) -> str:
        if neighbouring == "add_remove" and self.add_remove is not None:
            return self.add_remove
        return self.cls


@dataclass(frozen=True)
class Inventory:
    parties: dict[str, str]
    classes: dict[str, str]
    # method full name -> who can call it ("anyone", "collector", "leader", ...)
    callers: dict[str, tuple[str, ...]]
    observations: tuple[Observation, ...]

    def of(self, party: str) -> dict[str, Observation]:
        return {o.what: o for o in self.observations if o.party == party}

    def callable_by(self, party: str) -> list[str]:
        """The RPC methods `party`'s credentials can call (``anyone``'s included)."""
        return [m for m, who in self.callers.items() if party in who or "anyone" in who]


def _text(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip():
        raise InventoryError(f"{where}: `{key}` must be a non-empty string")
    return value


def parse_inventory(doc: Mapping[str, Any]) -> Inventory:
    """The inventory from the TOML document; InventoryError on anything malformed."""
    parties = {str(k): str(v) for k, v in doc.get("parties", {}).items()}
    classes = {str(k): str(v) for k, v in doc.get("classes", {}).items()}
    if tuple(classes) != CLASSES:
        raise InventoryError(f"[classes] must define exactly {', '.join(CLASSES)}")
    callers: dict[str, tuple[str, ...]] = {}
    for i, entry in enumerate(doc.get("rpcs", [])):
        where = f"rpcs[{i}]"
        method = _text(entry, "method", where)
        who = entry.get("callers")
        if not isinstance(who, list) or not who:
            raise InventoryError(f"{where}: `callers` must be a non-empty list")
        callers[method] = tuple(str(w) for w in who)
    observations = []
    seen: set[tuple[str, str]] = set()
    for i, entry in enumerate(doc.get("observations", [])):
        where = f"observations[{i}]"
        unknown = set(entry) - {"party", "what", "class", "why", "budget", "add_remove"}
        if unknown:
            raise InventoryError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        o = Observation(
            _text(entry, "party", where),
            _text(entry, "what", where),
            _text(entry, "class", where),
            _text(entry, "why", where),
            entry.get("budget"),
            entry.get("add_remove"),
        )
        where = f"{where} ({o.party} {o.what})"
        if o.party not in parties:
            raise InventoryError(f"{where}: unknown party (the parties are {', '.join(parties)})")
        for cls in (o.cls, o.add_remove):
            if cls is not None and cls not in CLASSES:
                raise InventoryError(f"{where}: unknown class {cls!r}")
        if "dp" in (o.cls, o.add_remove) and not o.budget:
            raise InventoryError(f"{where}: a dp observation names its `budget`")
        if (o.party, o.what) in seen:
            raise InventoryError(f"{where}: listed twice")
        seen.add((o.party, o.what))
        observations.append(o)
    return Inventory(parties, classes, callers, tuple(observations))


def load_inventory(path: Path | None = None) -> Inventory:
    """The inventory shipped with veil (or the one at `path`)."""
    if path is None:
        text = resources.files("veil").joinpath("data/observations.toml").read_text("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    return parse_inventory(tomllib.loads(text))


def message_fields(message: Descriptor, seen: set[str] | None = None) -> Iterator[str]:
    """Every field a `message` answer can carry, nested messages included, each
    by its full name (``veil.protocol.v1.TaskInfo.reports``), once."""
    seen = set() if seen is None else seen
    if message.full_name in seen:
        return
    seen.add(message.full_name)
    for f in message.fields:
        yield f.full_name
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            yield from message_fields(f.message_type, seen)


def dap_message_fields(message: type, seen: set[type] | None = None) -> Iterator[str]:
    """Every field a DAP `message` (a dataclass of veil.dap, or one it holds
    such as veil's Ciphertext) can carry, nested messages included, each by
    its class and field name (``ReportMetadata.time``), once: the dataclass
    counterpart of `message_fields`."""
    seen = set() if seen is None else seen
    if message in seen:
        return
    seen.add(message)
    hints = typing.get_type_hints(message)
    for f in dataclasses.fields(message):
        yield f"{message.__name__}.{f.name}"
        for inner in _dataclasses_in(hints[f.name]):
            yield from dap_message_fields(inner, seen)


def _dataclasses_in(hint: Any) -> Iterator[type]:
    """The dataclasses a field's type names: itself, or inside a tuple, a
    union or an Optional."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        yield hint
    for arg in typing.get_args(hint):
        yield from _dataclasses_in(arg)


def response_fields(services: Iterable[ServiceDescriptor], methods: Iterable[str]) -> list[str]:
    """The response fields of the named methods of `services`, sorted."""
    wanted = set(methods)
    out: set[str] = set()
    for service in services:
        for m in service.methods:
            if m.full_name in wanted:
                out.update(message_fields(m.output_type))
    return sorted(out)


def json_paths(value: Any, prefix: str) -> Iterator[str]:
    """Every key path of a JSON value: ``prefix.key``, ``prefix.list[].key``."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            path = f"{prefix}.{k}"
            yield path
            yield from json_paths(v, path)
    elif isinstance(value, list):
        for v in value:
            yield from json_paths(v, f"{prefix}[]")


def unclassified(inventory: Inventory, party: str, observed: Iterable[str]) -> list[str]:
    """What `party` observes that the inventory does not classify for it, sorted.
    An entry ending in ``.*`` classifies everything under it (a JSON object
    whose keys vary, such as a task's ``[dp]`` table)."""
    known = inventory.of(party)
    prefixes = tuple(w[:-1] for w in known if w.endswith(".*"))
    return sorted({w for w in observed if w not in known and not w.startswith(prefixes)})


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(inventory: Inventory) -> str:
    """The generated part of docs/OBSERVATIONS.md: one table per party."""
    counts = {p: sum(1 for o in inventory.observations if o.party == p) for p in inventory.parties}
    out = [
        BEGIN,
        "",
        f"{len(inventory.observations)} observations over {len(inventory.parties)} parties"
        " (" + ", ".join(f"{p} {n}" for p, n in counts.items()) + ").",
        "",
    ]
    for party, description in inventory.parties.items():
        out += [f"### {party}", "", description, ""]
        out += ["| observed | class | add_remove | why |", "|---|---|---|---|"]
        for o in inventory.observations:
            if o.party != party:
                continue
            cls = o.cls + (f" ({o.budget})" if o.cls == "dp" else "")
            under = ""
            if o.add_remove is not None:
                under = o.add_remove + (f" ({o.budget})" if o.add_remove == "dp" else "")
            out.append(f"| `{_cell(o.what)}` | {cls} | {under} | {_cell(o.why)} |")
        out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def replace_generated(document: str, inventory: Inventory) -> str:
    """`document` with its generated part written anew from `inventory`."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise InventoryError("the document has no generated part (its markers are missing)")
    return document[:start] + render_markdown(inventory) + document[end + len(END) + 1 :]
