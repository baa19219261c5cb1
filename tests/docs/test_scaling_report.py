"""docs/reports/SCALING.md stays a report: the current figures, the command
behind each and what was not kept, within 40,000 characters (the history is
in git), and every benchmark command it shows is one its script accepts."""

from __future__ import annotations

import re

from tests.support.docs import ROOT, read

DOC = "docs/reports/SCALING.md"
LIMIT = 40_000

# `python scripts/NAME.py ARGS` in inline code, which may wrap onto the next line.
_COMMAND = re.compile(r"`python3?\s+(scripts/\w+\.py)([^`]*)`")
_OPTION = re.compile(r"add_argument\(\s*\"(--[\w-]+)\"")


def unknown_options(script: str, args: str) -> list[str]:
    """The `--options` of a command that its script's parser does not add
    (spelled in full: a reader should not rely on argparse's abbreviations)."""
    options = set(_OPTION.findall((ROOT / script).read_text(encoding="utf-8")))
    return [word for word in args.split() if word.startswith("--") and word not in options]


def test_the_scaling_report_stays_a_report() -> None:
    text = read(DOC)
    assert len(text) <= LIMIT, (
        f"{DOC} has {len(text):,} characters, over {LIMIT:,}: keep the current figures,"
        " a line for what was not kept, and leave the history to git"
    )
    assert f"git log -p {DOC}" in text


def test_every_command_the_report_shows_is_accepted_by_its_script() -> None:
    commands = _COMMAND.findall(read(DOC))
    assert len(commands) >= 20, commands
    for script, args in commands:
        assert (ROOT / script).is_file(), script
        assert not unknown_options(script, args), f"{DOC}: `python {script}{args}`"


def test_an_option_a_script_lacks_is_found() -> None:
    assert unknown_options("scripts/bench_workers.py", " --ratios --runs 5 --scale 0.5") == []
    assert unknown_options("scripts/bench_workers.py", " --ratios --rat --rounds 5") == [
        "--rat",
        "--rounds",
    ]
