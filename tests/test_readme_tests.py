"""The README's test commands: the one CI runs, and the quick subset's markers.

`pytest -m` with a marker nobody declared selects silently (strict markers
check only the marks on tests), so a misspelt or retired name in the README's
subset would quietly change what it leaves out.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def declared_markers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":", 1)[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}


def test_quick_subset_names_declared_markers_only() -> None:
    text = (ROOT / "README.md").read_text()
    (expr,) = re.findall(r'^pytest -m "([^"]+)"$', text, re.M)
    names = set(re.findall(r"\b(?!not\b|and\b|or\b)\w+", expr))
    assert names, expr
    assert names <= declared_markers(), names - declared_markers()
    # Day-to-day work needs no PostgreSQL and no browser.
    assert {"slow", "postgres", "browser"} <= names


def test_readme_test_command_is_what_ci_runs() -> None:
    text = (ROOT / "README.md").read_text()
    assert "pip install -e '.[test]' && pytest\n" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -e '.[test]'" in ci
    # CI runs the whole suite, as the README says: no marker filter.
    runs = [line for line in ci.splitlines() if line.strip().startswith("python -m pytest")]
    assert runs and not any(" -m " in line.split("pytest", 1)[1] for line in runs), runs
