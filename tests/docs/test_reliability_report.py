"""docs/reports/RELIABILITY.md stays a report of what holds today: within
30,000 characters (the history is in git), every file and test it names
there to run, every section another document sends a reader to still a
heading of it, and every commit it dates a figure by one of this repository."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.docs import ROOT, documents, read

DOC = "docs/reports/RELIABILITY.md"
LIMIT = 30_000

_PATH = re.compile(r"(?<![\w/.-])((?:tests|scripts|src/veil)/[\w./-]*\w)")
_TEST = re.compile(r"`((?:tests/[\w/]+\.py)?)::(\w+)`")
# A short commit id: seven hex digits with at least one letter and one digit.
_COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7}\b")
# `[...](...RELIABILITY.md), "Section"` in another document.
_CITED = re.compile(r"RELIABILITY\.md\)\s*,\s*\"([^\"]+)\"")


def test_the_reliability_report_stays_a_report() -> None:
    text = read(DOC)
    assert len(text) <= LIMIT, (
        f"{DOC} has {len(text):,} characters, over {LIMIT:,}: keep what holds today and"
        " the figures that show it, and leave the history to git"
    )
    assert f"git log -p --follow {DOC}" in text


def test_every_file_and_test_the_report_names_is_there() -> None:
    text = read(DOC)
    paths = set(_PATH.findall(text))
    assert len(paths) >= 30, paths
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"{DOC} names files that are not in the repository: {gone}"
    tests = _TEST.findall(text)
    assert len(tests) >= 20, tests
    defined = {
        path.relative_to(ROOT).as_posix(): set(re.findall(r"^def (\w+)", path.read_text(), re.M))
        for path in (ROOT / "tests").rglob("test_*.py")
    }
    missing = [
        f"{path}::{name}"
        for path, name in tests
        if not (name in defined.get(path, ()) if path else any(name in d for d in defined.values()))
    ]
    assert not missing, f"{DOC} names tests that are not there: {missing}"


def test_the_sections_other_documents_cite_are_there() -> None:
    headings = set(re.findall(r"^#+ +(.+?) *$", read(DOC), re.M))
    cited = {
        (doc, title) for doc in documents() for title in _CITED.findall(" ".join(read(doc).split()))
    }
    assert cited, "no document cites a section of the report: the pattern is stale"
    stale = sorted((doc, title) for doc, title in cited if title not in headings)
    assert not stale, f"sections of {DOC} that documents cite and it lacks: {stale}"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_every_commit_a_figure_names_is_in_the_history() -> None:
    shallow = _git("rev-parse", "--is-shallow-repository") if shutil.which("git") else None
    if shallow is None or shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("needs git and the repository's whole history (not a checkout, or shallow)")
    commits = set(_COMMIT.findall(read(DOC)))
    assert len(commits) >= 20, commits
    unknown = sorted(c for c in commits if _git("cat-file", "-e", f"{c}^{{commit}}").returncode)
    assert not unknown, f"{DOC} dates figures by commits this repository lacks: {unknown}"
