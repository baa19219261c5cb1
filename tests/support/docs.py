"""The repository's documents as the tests read them: each document's
sections and fenced blocks, found by heading and language, so that every
command and snippet a reader is shown can be run as written.

A block is runnable when its fence names `sh`, `python` or `toml`; a block
fenced without a language (or as `text`) is an example of output or a
listing, and nothing runs it. `tests/docs/test_doc_blocks.py` checks that
every runnable block of every document is claimed by a test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = ("sh", "python", "toml")

_FENCE = re.compile(r"^(`{3,})(\S*)\s*$")
_HEADING = re.compile(r"^(#{1,6}) +(.+?) *$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its document, the heading it sits under (the nearest,
    any level), its language and its text (ending with a newline)."""

    doc: str
    section: str
    lang: str
    code: str
    line: int


@dataclass(frozen=True)
class Section:
    heading: str
    level: int
    text: str
    blocks: tuple[Block, ...]


def documents() -> list[str]:
    """README.md and every Markdown file under docs/, as paths from the root."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p.relative_to(ROOT).as_posix() for p in found]


def read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


def _parse(doc: str) -> tuple[list[tuple[int, int, str]], list[Block]]:
    """The headings (line, level, title) outside fences, and every block."""
    headings: list[tuple[int, int, str]] = []
    blocks: list[Block] = []
    lines = read(doc).splitlines()
    current = ""
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            ticks, lang = fence.groups()
            end = i + 1
            while end < len(lines) and lines[end].rstrip() != ticks:
                end += 1
            if end == len(lines):
                raise AssertionError(f"{doc}:{i + 1}: a fence that is never closed")
            code = "".join(line + "\n" for line in lines[i + 1 : end])
            blocks.append(Block(doc, current, lang, code, i + 1))
            i = end + 1
            continue
        heading = _HEADING.match(lines[i])
        if heading:
            current = heading.group(2)
            headings.append((i, len(heading.group(1)), current))
        i += 1
    return headings, blocks


def blocks(doc: str, lang: str | tuple[str, ...] = RUNNABLE) -> list[Block]:
    """Every block of a document in a language (or one of several), in order."""
    langs = (lang,) if isinstance(lang, str) else lang
    return [b for b in _parse(doc)[1] if b.lang in langs]


def section(doc: str, heading: str) -> Section:
    """The section under the one heading titled `heading` (any level), up to the
    next heading of the same or a higher level, with its blocks (those of its
    subsections included)."""
    headings, all_blocks = _parse(doc)
    found = [(n, h) for n, h in enumerate(headings) if h[2] == heading]
    if len(found) != 1:
        raise AssertionError(f"{doc}: {len(found)} headings titled {heading!r}, expected one")
    n, (line, level, _) = found[0]
    end = next((h[0] for h in headings[n + 1 :] if h[1] <= level), None)
    lines = read(doc).splitlines()
    text = "\n".join(lines[line : end if end is not None else len(lines)]) + "\n"
    last = end if end is not None else len(lines)
    inside = tuple(b for b in all_blocks if line < b.line <= last)
    return Section(heading, level, text, inside)


def section_blocks(doc: str, heading: str, lang: str | tuple[str, ...] = RUNNABLE) -> list[Block]:
    langs = (lang,) if isinstance(lang, str) else lang
    return [b for b in section(doc, heading).blocks if b.lang in langs]


def anchors(doc: str) -> set[str]:
    """The anchors GitHub gives the document's headings: lower case, spaces to
    hyphens, punctuation other than hyphens and underscores dropped, a repeated
    anchor suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for _, _, title in _parse(doc)[0]:
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", plain.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out
