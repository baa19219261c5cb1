"""Every document as a whole: each runnable block of README.md and docs/ is
claimed by a test (or says why the suite does not run it), every `veil`
command a document shows is one the CLI accepts, every relative link
resolves, and the README stays a first page."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import ROOT, Block, anchors, blocks, documents, read, section_blocks
from veil.cli import build_parser

README_LIMIT = 8_000

# The runnable blocks of each document, by the heading they sit under and
# their language, and the test that runs them as written (with free ports,
# shorter waits, and the servers a walk-through starts in the background
# started by the test).
RUN = {
    ("README.md", "A survey in ten lines", "sh"): "tests/docs/test_doc_blocks.py",
    ("docs/SURVEYS.md", "Before deploying: `veil simulate`", "sh"): (
        "tests/docs/test_doc_blocks.py"  # the sweep; the other line is test_demo's simulate
    ),
    ("docs/SURVEYS.md", "Run a survey", "sh"): "tests/docs/test_surveys_walkthrough.py",
    ("docs/SURVEYS.md", "Text questions", "sh"): "tests/docs/test_doc_blocks.py",
    ("docs/SURVEYS.md", "Breakdowns: a question's answers in each group", "toml"): (
        "tests/survey/test_breakdown.py"
    ),
    ("docs/DEPLOYING.md", "Deploying a survey across two organisations", "sh"): (
        "tests/docs/test_deploying_tls_trial.py"  # the trial; the other block is parsed
    ),
    ("docs/DEPLOYING.md", "Running the servers by hand", "sh"): (
        "tests/docs/test_deploying_by_hand.py"
    ),
    ("docs/DEPLOYING.md", "Scaling out on PostgreSQL", "toml"): (
        "tests/docs/test_deploying_by_hand.py"
    ),
    ("docs/OPERATING.md", "HPKE key rotation", "sh"): "tests/docs/test_deploying_by_hand.py",
    ("docs/CONFIGURATION.md", "Server configuration", "toml"): (
        "tests/docs/test_deploying_by_hand.py"
    ),
    ("docs/CLIENT.md", "Blocking", "python"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "asyncio", "python"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "Settings", "python"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "Durable outbox", "python"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "Durable outbox", "sh"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "Building reports without the network", "python"): (
        "tests/docs/test_client_doc.py"
    ),
    ("docs/CLIENT.md", "Collecting from Python", "python"): "tests/docs/test_client_doc.py",
    ("docs/CLIENT.md", "The Prio3 core", "python"): "tests/docs/test_client_doc.py",
    (
        "docs/CLIENT.md",
        "The wire format and the API reference",
        "sh",
    ): "tests/tools/test_apidocs.py",
    ("docs/POSTGRESQL.md", "1. A role and a database", "sh"): (
        "tests/docs/test_postgresql_walkthrough.py"
    ),
    ("docs/POSTGRESQL.md", "2. The DSN, without the password in the config", "sh"): (
        "tests/docs/test_postgresql_walkthrough.py"
    ),
    ("docs/POSTGRESQL.md", "3. What runs at start", "sh"): (
        "tests/docs/test_postgresql_walkthrough.py"
    ),
    ("docs/POSTGRESQL.md", "4. Backups", "sh"): "tests/docs/test_postgresql_walkthrough.py",
    ("docs/OBSERVATIONS.md", "Kept true by a test", "sh"): "tests/test_observations.py",
}

# The blocks the suite does not run as written: why, and what checks them.
# (Every `veil` command in them is still parsed by the CLI, below.)
NOT_RUN = {
    ("README.md", "Quick start", "sh"): (
        "a fresh virtual environment and pip install: .ci/run runs the test command"
        " (tests/docs/test_development_commands.py), tests/local/test_demo.py runs `veil demo`"
    ),
    ("docs/DEVELOPMENT.md", "Tests", "sh"): (
        "the suite itself, the JavaScript tests and the README's command: run by .ci/run"
        " (tests/docs/test_development_commands.py checks they are the same)"
    ),
    ("docs/DEVELOPMENT.md", "Checks", "sh"): "ruff and mypy: run by .ci/run",
    ("docs/reports/RELIABILITY.md", "Running the suites", "sh"): "the reliability suites",
    ("docs/PERFORMANCE.md", "Sharding and verifying: the batched path", "sh"): (
        "benchmarks take minutes and assert nothing; the scripts named exist (below)"
    ),
    ("docs/PERFORMANCE.md", "Text answers (Poplar1) end to end", "sh"): (
        "a benchmark takes minutes and asserts nothing; the script named exists (below)"
    ),
    ("docs/PRIVACY.md", "Privacy: three guarantees", "sh"): (
        "`veil simulate` with servers, as tests/local/test_demo.py runs it; its options are parsed"
    ),
    ("docs/SURVEYS.md", "Closing a survey early, or extending it", "sh"): (
        "its times are examples: tests/integration/test_survey_lifecycle.py runs the commands"
        " on a deployment with servers; the commands are parsed"
    ),
    ("docs/SURVEYS.md", "One answer per respondent: invitations", "sh"): (
        "the issuer is a long-running server: tests/integration/test_invitations_journey.py"
        " runs the journey, tests/integration/test_panel_invitations.py the panel; the"
        " commands are parsed"
    ),
    ("docs/DEPLOYING.md", "The survey page: respondents in a browser", "sh"): (
        "a long-running server: tests/web/test_serve.py serves the page; the command is parsed"
    ),
    ("docs/DAP.md", "A survey over DAP", "sh"): (
        "long-running servers: tests/integration/test_dap_survey.py runs the commands with free"
        " ports and SIGHUP to the servers' processes; the commands are parsed"
    ),
    ("docs/DEPLOYING.md", "Scaling out on PostgreSQL", "sh"): (
        "long-running servers on PostgreSQL: tests/integration/test_scale_out.py runs them;"
        " the commands are parsed"
    ),
}


def runnable_blocks() -> list[Block]:
    return [b for doc in documents() for b in blocks(doc)]


def test_every_runnable_block_is_claimed() -> None:
    found = {(b.doc, b.section, b.lang) for b in runnable_blocks()}
    claimed = set(RUN) | set(NOT_RUN)
    assert not set(RUN) & set(NOT_RUN)
    unclaimed = sorted(found - claimed)
    assert not unclaimed, (
        f"blocks no test runs: {unclaimed}; run them in a test under tests/docs and name it in RUN"
    )
    stale = sorted(claimed - found)
    assert not stale, f"claims of blocks that are gone (or moved): {stale}"
    # The tests the reasons name are there.
    for reason in NOT_RUN.values():
        for test in re.findall(r"tests/[\w/]+\.py", reason):
            assert (ROOT / test).is_file(), test


@pytest.mark.parametrize(("doc", "heading", "lang"), sorted(RUN))
def test_the_claiming_test_reads_its_document(doc: str, heading: str, lang: str) -> None:
    test = ROOT / RUN[doc, heading, lang]
    assert test.is_file(), test
    # A documentation test names the document it runs (the others, such as
    # tests/tools/test_apidocs.py, run what the block runs through its function).
    if test.parent == ROOT / "tests" / "docs":
        assert doc in test.read_text(), f"{test} does not read {doc}"


def command_lines(code: str) -> list[str]:
    """The `veil ...` commands of a shell block: continuation lines joined,
    heredoc bodies skipped, each command cut at its `&&`, `;`, `|`,
    redirection, background `&` or comment."""
    lines: list[str] = []
    heredoc: str | None = None
    pending = ""
    for raw in code.splitlines():
        if heredoc is not None:
            if raw.strip() == heredoc:
                heredoc = None
            continue
        line = pending + raw
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        marker = re.search(r"<<-?\s*'?(\w+)'?", line)
        if marker:
            heredoc = marker.group(1)
        lines.append(line)
    commands = []
    for line in lines:
        for part in re.split(r"&&|;|\|", line):
            words = shlex.split(part, comments=True)
            if words[:1] != ["veil"]:
                continue
            cut = next(
                (i for i, w in enumerate(words) if w in ("&", ">", "2>&1") or w.startswith(">")),
                len(words),
            )
            commands.append(shlex.join(words[1:cut]))
    return commands


def test_every_veil_command_shown_is_accepted_by_the_cli() -> None:
    seen = 0
    for block in runnable_blocks():
        if block.lang != "sh":
            continue
        for command in command_lines(block.code):
            seen += 1
            try:
                build_parser().parse_args(shlex.split(command))
            except SystemExit:
                pytest.fail(f"{block.doc}:{block.line}: `veil {command}` is refused by the CLI")
    assert seen >= 30, seen


def test_every_script_shown_exists() -> None:
    for block in runnable_blocks():
        for script in re.findall(r"python3? (scripts/\S+\.py)", block.code):
            assert (ROOT / script).is_file(), f"{block.doc}:{block.line}: {script}"


def test_the_readme_is_a_first_page() -> None:
    text = read("README.md")
    assert len(text) <= README_LIMIT, (
        f"README.md has {len(text):,} characters, over {README_LIMIT:,}: move the detail to docs/"
    )
    # The two commands a newcomer types.
    first, tests = (b.code for b in section_blocks("README.md", "Quick start", "sh"))
    assert first.endswith("pip install -e . && veil demo\n")
    assert tests.endswith("pip install -e '.[test]' && pytest\n")


_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(doc: str) -> str:
    """The document without its fenced blocks and inline code."""
    text = re.sub(r"^(`{3,}).*?^\1\s*$", "", read(doc), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("doc", documents())
def test_every_relative_link_resolves(doc: str) -> None:
    base = (ROOT / doc).parent
    broken = []
    for target in _LINK.findall(prose(doc)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: ...
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else ROOT / doc
        if not file.exists() or (
            anchor
            and file.suffix == ".md"
            and anchor not in anchors(file.relative_to(ROOT).as_posix())
        ):
            broken.append(target)
    assert not broken, f"{doc}: links that lead nowhere: {broken}"


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_readme_survey_in_ten_lines_runs_as_written(tmp_path: Path) -> None:
    (block,) = section_blocks("README.md", "A survey in ten lines", "sh")
    assert len(block.code.splitlines()) <= 16
    done = bash(block.code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Team check-in: expected accuracy at 1,000 respondents" in done.stdout
    rows = [line.split()[0] for line in done.stdout.splitlines()[3:5]]
    assert rows == ["remote", "team"], done.stdout


def test_the_simulate_sweep_runs_as_written(tmp_path: Path) -> None:
    """The sweep runs no servers; the other line (servers, 10,000 respondents)
    is tests/local/test_demo.py's simulate with fewer."""
    (block,) = section_blocks("docs/SURVEYS.md", "Before deploying: `veil simulate`", "sh")
    (sweep,) = [line for line in block.code.splitlines() if "--sweep-epsilon" in line]
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "survey.toml").write_text(read("examples/survey.toml"))
    done = bash(sweep, tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_text_question_plan_runs_as_written(tmp_path: Path) -> None:
    from veil.survey import load_survey

    block, _ = section_blocks("docs/SURVEYS.md", "Text questions", "sh")
    done = bash(block.code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "editor (text): an answer is found with 95% probability when at least 125" in (
        done.stdout
    )
    assert "probability at most 1.6e-05" in done.stdout
    # The prose says this is the example text question `veil demo` runs.
    doc = load_survey(tmp_path / "editors.toml")
    example = load_survey(ROOT / "examples" / "text_survey.toml")
    assert (doc.rho, doc.questions) == (example.rho, example.questions)


def test_the_mechanism_trade_off_is_the_plans(tmp_path: Path) -> None:
    """The prose's figures for a text question's mechanism (issue 41, item 4) are
    the plan's, and `veil survey plan` shows both choices side by side."""
    from veil.survey import load_survey
    from veil.survey.plan import plan_survey, variant_plans

    _, block = section_blocks("docs/SURVEYS.md", "Text questions", "sh")
    done = bash(block.code, tmp_path)
    assert done.returncode == 0, done.stderr
    survey = load_survey(tmp_path / "mixed.toml")
    n = survey.expected_respondents
    assert n is not None
    now = {p.question: p for p in plan_survey(survey, n)}
    variant = variant_plans(survey, n)
    assert variant is not None
    then = {p.question: p for p in variant[1]}
    a, b = now["remote"].raw_half_width, then["remote"].raw_half_width
    floors = now["editor"].detection_floor, then["editor"].detection_floor
    assert None not in floors
    prose = " ".join(read("docs/SURVEYS.md").split())
    assert (
        f"at {n} respondents the yes/no question's 95% interval goes from ±{a:.0f} to"
        f" ±{b:.0f} ({b / a:.2g} times wider) when the text question is gaussian" in prose
    )
    assert f"falls from {floors[0]:,} to {floors[1]:,}" in prose
    row = re.search(r"^remote +±(\d+) +±(\d+) \(([\d.]+)x wider\)$", done.stdout, re.M)
    assert row is not None and row.groups() == (f"{a:.0f}", f"{b:.0f}", f"{b / a:.2g}")
    assert re.search(
        rf"^editor +found from {floors[0]:,} +found from {floors[1]:,}$", done.stdout, re.M
    )


def resolves(dotted: str) -> bool:
    """`veil.a.b.C`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("doc", [d for d in documents() if not d.startswith("docs/reports/")])
def test_every_veil_name_a_document_gives_exists(doc: str) -> None:
    """Modules move (issue 31): a name the manual gives must still be there.
    The reports are dated measurements and keep the names of their day."""
    names = set(re.findall(r"`(veil(?:\.\w+)+)", read(doc)))
    gone = sorted(n for n in names if not resolves(n))
    assert not gone, f"{doc} names what veil no longer has: {gone}"


_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:src/veil|tests|scripts|bench|tools|protos|deploy|js|examples|docs)"
    r"/[\w./@-]*[\w/])"
)


@pytest.mark.parametrize("doc", [d for d in documents() if not d.startswith("docs/reports/")])
def test_every_repository_path_a_document_gives_exists(doc: str) -> None:
    """Files move (issue 31): a path the manual gives must still be there. The
    reports keep the paths of their day."""
    paths = set(_REPO_PATH.findall(read(doc)))
    # What the reader's own commands create: not in the repository.
    made = ("docs/api", "js/node_modules")
    gone = sorted(p for p in paths if not (ROOT / p).exists() and not p.startswith(made))
    assert not gone, f"{doc} gives paths that are not in the repository: {gone}"
