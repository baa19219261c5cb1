"""The test commands: the README's, which is what CI runs, and the quick
subset docs/DEVELOPMENT.md gives for day-to-day work.

`pytest -m` with a marker nobody declared selects silently (strict markers
check only the marks on tests), so a misspelt or retired name in the quick
subset would quietly change what it leaves out.
"""

from __future__ import annotations

import re
import tomllib

from tests.support.docs import ROOT, section_blocks


def declared_markers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":", 1)[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}


def test_quick_subset_names_declared_markers_only() -> None:
    blocks = [b.code for b in section_blocks("docs/DEVELOPMENT.md", "Tests", "sh")]
    (expr,) = re.findall(r'^pytest -m "([^"]+)"$', "".join(blocks), re.M)
    names = set(re.findall(r"\b(?!not\b|and\b|or\b)\w+", expr))
    assert names, expr
    assert names <= declared_markers(), names - declared_markers()
    # Day-to-day work needs no PostgreSQL and no browser.
    assert {"slow", "postgres", "browser"} <= names


def test_readme_test_command_is_what_ci_runs() -> None:
    command = (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest\n"
    )
    assert [b.code for b in section_blocks("README.md", "Quick start", "sh")][1] == command
    # docs/DEVELOPMENT.md repeats it, the same.
    assert section_blocks("docs/DEVELOPMENT.md", "Tests", "sh")[0].code == command
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -e '.[test]'" in ci
    # CI runs the whole suite, as the README says: no marker filter.
    runs = [line for line in ci.splitlines() if line.strip().startswith("python -m pytest")]
    assert runs and not any(" -m " in line.split("pytest", 1)[1] for line in runs), runs
    # And the checks docs/DEVELOPMENT.md says it runs.
    (checks,) = section_blocks("docs/DEVELOPMENT.md", "Checks", "sh")
    assert checks.code == "ruff check && mypy\n"
    assert "\nruff check\nmypy\n" in ci
    (js,) = [b for b in section_blocks("docs/DEVELOPMENT.md", "Tests", "sh") if "npm" in b.code]
    assert js.code == "cd js && npm ci && npm test\n"
    assert "(cd js && npm ci --no-audit --no-fund && npm test)" in ci
