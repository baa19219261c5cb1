"""One strict reader for every TOML file veil reads.

Task files, server configurations, survey files and deployment files all go
through `Table`: each table names the settings it knows, and anything else
is refused with ``file:line: unknown setting 'x' in [table]; expected one of
...``, so that a misspelt key (``min_batch_sise``, ``clientca``) stops the
program instead of silently leaving a default in force. A value of the wrong
type is reported in the same form.

tomllib reports no positions for valid TOML, so the line of a setting is
found by scanning the text: the table's header (``[tls]``, the n-th
``[[question]]``), then the first ``key =`` line inside it. That finds every
setting written in the usual one-key-per-line style; a key written in an
inline table or as a dotted key is reported at the line of its table's
header (or its parent's), which is still the right place to look.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final

# Where a table sits in its document: table names, and the index of an
# element in an array of tables (("question", 2) is the third [[question]]).
TablePath = tuple[str | int, ...]


class SettingsError(ValueError):
    """A file holds an unknown, missing or mistyped setting; the message starts
    with ``file:line:`` where the line is known."""


class _Missing:
    pass


MISSING: Final = _Missing()

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")


def _split_dotted(name: str) -> tuple[str, ...]:
    parts = re.findall(r'"[^"]*"|\'[^\']*\'|[^.\s]+', name)
    return tuple(p.strip("\"'") for p in parts)


class Source:
    """A document's name and text, for locating settings in error messages."""

    def __init__(self, name: str, text: str | None = None) -> None:
        self.name = name
        self.lines = text.splitlines() if text is not None else []
        # (table path, first line index, end line index) of each header.
        self._sections: list[tuple[TablePath, int, int]] = []
        counts: dict[tuple[str, ...], int] = {}
        starts: list[tuple[TablePath, int]] = []
        for i, line in enumerate(self.lines):
            m = _HEADER.match(line)
            if m is None:
                continue
            names = _split_dotted(m.group(2))
            if m.group(1) == "[[":
                n = counts.get(names, 0)
                counts[names] = n + 1
                starts.append(((*names, n), i))
            else:
                starts.append((names, i))
        for k, (path, i) in enumerate(starts):
            end = starts[k + 1][1] if k + 1 < len(starts) else len(self.lines)
            self._sections.append((path, i, end))

    def _section(self, path: TablePath) -> tuple[int, int] | None:
        if not path:
            end = self._sections[0][1] if self._sections else len(self.lines)
            return (-1, end)
        for p, start, end in self._sections:
            if p == path:
                return (start, end)
        return None

    def line_of(self, path: TablePath, key: str | None = None) -> int | None:
        """1-based line of `key` in the table at `path` (of the table itself
        without a key, or when the key is not written one per line)."""
        if not self.lines:
            return None
        section = self._section(path)
        if section is None:
            # An inline or dotted table: look for its name in the parent.
            if not path:
                return None
            last = path[-1]
            return self.line_of(path[:-1], last if isinstance(last, str) else None)
        start, end = section
        if key is not None:
            pattern = re.compile(rf"""^\s*(["']?){re.escape(key)}\1\s*[=.]""")
            for i in range(start + 1, end):
                if pattern.match(self.lines[i]):
                    return i + 1
            # A sub-table written with its own header ([key] or [[key]]).
            for p, sub_start, _ in self._sections:
                if p[: len(path) + 1] == (*path, key):
                    return sub_start + 1
        return start + 1 if start >= 0 else None

    def where(self, path: TablePath, key: str | None = None) -> str:
        line = self.line_of(path, key)
        return self.name if line is None else f"{self.name}:{line}"


def table_name(path: TablePath) -> str:
    if not path:
        return "the top level"
    names = [p for p in path if isinstance(p, str)]
    if isinstance(path[-1], int):
        return f"[[{'.'.join(names)}]] #{path[-1] + 1}"
    return f"[{'.'.join(names)}]"


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class Table:
    """One table of a TOML document whose settings are all known in advance.

    Construction refuses any key outside `allowed`; the accessors check each
    value's type and report mistakes at the setting's line.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        source: Source,
        allowed: Collection[str],
        path: TablePath = (),
    ) -> None:
        self.data = data
        self.source = source
        self.path = path
        self.allowed = allowed
        for key in data:
            if key not in allowed:
                raise self.error(
                    key,
                    f"unknown setting {key!r} in {self.name}; expected one of "
                    + ", ".join(sorted(allowed)),
                )

    @property
    def name(self) -> str:
        return table_name(self.path)

    def error(self, key: str | None, message: str) -> SettingsError:
        return SettingsError(f"{self.source.where(self.path, key)}: {message}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def _value(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if isinstance(default, _Missing):
            raise self.error(None, f"{self.name} lacks the required setting {key!r}")
        return default

    def _wrong(self, key: str, expected: str, value: Any) -> SettingsError:
        return self.error(
            key,
            f"setting {key!r} in {self.name} must be {expected}, got {value!r} "
            f"({_type_name(value)})",
        )

    def _below(self, key: str, minimum: float) -> SettingsError:
        bound = "must not be negative" if minimum == 0 else f"must be at least {minimum:g}"
        return self.error(key, f"setting {key!r} in {self.name} {bound}")

    def text(self, key: str, default: str | _Missing = MISSING) -> str:
        value = self._value(key, default)
        if not isinstance(value, str):
            raise self._wrong(key, "a string", value)
        return value

    def optional_text(self, key: str) -> str | None:
        return None if key not in self.data else self.text(key)

    def _numeric(
        self,
        key: str,
        default: float | _Missing,
        integral: bool,
        minimum: float | None,
    ) -> int | float:
        value = self._value(key, default)
        # TOML booleans are not numbers here, though Python's bool is an int.
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (integral and not isinstance(value, int))
        ):
            raise self._wrong(key, "an integer" if integral else "a number", value)
        if isinstance(value, float) and not math.isfinite(value):
            raise self._wrong(key, "a finite number", value)
        if minimum is not None and value < minimum:
            raise self._below(key, minimum)
        return value

    def integer(
        self, key: str, default: int | _Missing = MISSING, *, minimum: int | None = None
    ) -> int:
        return int(self._numeric(key, default, True, minimum))

    def optional_integer(self, key: str, *, minimum: int | None = None) -> int | None:
        return None if key not in self.data else self.integer(key, minimum=minimum)

    def number(
        self, key: str, default: float | _Missing = MISSING, *, minimum: float | None = None
    ) -> float:
        return float(self._numeric(key, default, False, minimum))

    def flag(self, key: str, default: bool | _Missing = MISSING) -> bool:
        value = self._value(key, default)
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false", value)
        return value

    def rational(self, key: str) -> str | None:
        """A number that may be written as an integer, a decimal or a string
        such as "1/2" (ε, ρ, budgets), as its text; None when absent."""
        if key not in self.data:
            return None
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self._wrong(key, 'a number or a string such as "1/2"', value)
        if isinstance(value, float) and not math.isfinite(value):
            raise self._wrong(key, "a finite number", value)
        return str(value)

    def texts(self, key: str, default: list[str] | _Missing = MISSING) -> list[str]:
        value = self._value(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._wrong(key, "a list of strings", value)
        return list(value)

    def raw(self, key: str, default: Any = MISSING) -> Any:
        """The value as TOML gave it, for settings that take several forms."""
        return self._value(key, default)

    def table(self, key: str, allowed: Collection[str], *, required: bool = False) -> Table:
        """The sub-table `key` (an empty one when absent and not required)."""
        value = self._value(key, MISSING if required else {})
        if not isinstance(value, dict):
            raise self._wrong(key, "a table", value)
        return Table(value, self.source, allowed, (*self.path, key))

    def optional_table(self, key: str, allowed: Collection[str]) -> Table | None:
        return None if key not in self.data else self.table(key, allowed)

    def tables(self, key: str, allowed: Collection[str]) -> list[Table]:
        """The array of tables `key` ([[key]] ...); empty when absent."""
        value = self._value(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self._wrong(key, "an array of tables ([[" + key + "]])", value)
        return [Table(v, self.source, allowed, (*self.path, key, i)) for i, v in enumerate(value)]


def parse_toml(text: str, name: str, allowed: Collection[str]) -> Table:
    """The top-level table of TOML `text` read from `name`; raises SettingsError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{name}: not valid TOML: {e}") from e
    return Table(data, Source(name, text), allowed)


def read_toml(path: str | os.PathLike[str], allowed: Collection[str]) -> Table:
    """The top-level table of the TOML file at `path`; raises SettingsError only."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SettingsError(f"cannot read {path}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise SettingsError(f"{path}: not UTF-8 text: {e}") from e
    return parse_toml(text, str(path), allowed)


def from_mapping(
    data: Mapping[str, Any], name: str, allowed: Collection[str], path: TablePath = ()
) -> Table:
    """A table already parsed (no text, so errors carry no line)."""
    if not isinstance(data, Mapping):
        raise SettingsError(f"{name}: {table_name(path)} must be a table, got {data!r}")
    return Table(data, Source(name), allowed, path)
