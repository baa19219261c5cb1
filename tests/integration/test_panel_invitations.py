"""A panel answering a survey with invitations from one command (issue 41,
item 6): `veil survey respond --answers panel.jsonl --invitations codes.txt`
pairs the n-th respondent with the n-th code. Every line is checked before
anything is sent (a bad line named by its number, a count mismatch refused,
the codes left unused); a run answers every respondent; the same command
again sends nothing twice. Real servers and a real issuer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import veil
from tests.support.survey_toml import remote, team
from tests.support.window import LONG_WINDOW
from veil.local.launcher import ServerProcess, free_port
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
N = 3
SURVEY = (
    """
[survey]
name = "Panel"
epsilon = 2
min_batch_size = {n}
invitations = true
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

"""
    + remote()
    + "\n"
    + team(("engineering", "design"))
)


def test_a_panel_answers_with_its_invitations_line_by_line(tmp_path: Path) -> None:
    # Open for an hour: nine commands run inside the window however busy the
    # machine (tests/support/window.py); nothing is collected.
    opens = int(time.time()) // TP * TP
    survey = tmp_path / "survey.toml"
    survey.write_text(
        SURVEY.format(n=N, tp=TP, opens=format_time(opens), closes=format_time(opens + LONG_WINDOW))
    )
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = tmp_path / "dep"
    out = veil(
        "survey", "deploy", "--survey", survey, "--out", dep,
        "--leader", leader, "--helper", helper, "--no-tls",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    codes = tmp_path / "codes.txt"
    minted = veil("survey", "invite", dep, "--count", str(N), "--out", codes)
    assert minted.returncode == 0, minted.stderr
    lines = codes.read_text().split()
    assert len(lines) == N

    panel = tmp_path / "panel.jsonl"
    answers = [
        {"remote": "yes", "team": "design"},
        {"remote": "no", "team": "engineering"},
        {"remote": True},
    ]
    panel.write_text("".join(json.dumps(a) + "\n" for a in answers))

    servers = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    issuer_port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(dep),
         "--listen", f"127.0.0.1:{issuer_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        for s in servers:
            s.start()
        assert issuer.stdout is not None
        assert "issuing on" in issuer.stdout.readline()
        url = f"http://127.0.0.1:{issuer_port}/invitation"

        def respond(answers_file: Path, codes_file: Path) -> subprocess.CompletedProcess[str]:
            return veil(
                "survey", "respond", "--survey-dir", dep / "client", "--answers", answers_file,
                "--invitations", codes_file, "--issuer", url, "--no-progress",
            )  # fmt: skip

        # Refused before anything is sent, each naming what to fix.
        bad = tmp_path / "bad.jsonl"
        bad.write_text(panel.read_text().replace('"no"', '"maybe"'))
        refused = respond(bad, codes)
        assert refused.returncode == 2
        assert f"{bad}:2:" in refused.stderr and "nothing was sent" in refused.stderr
        bad.write_text(panel.read_text() + "{not json\n")
        refused = respond(bad, codes)
        assert refused.returncode == 2 and f"{bad}:4: not a JSON object" in refused.stderr
        fewer = tmp_path / "fewer.txt"
        fewer.write_text("\n".join(lines[:2]) + "\n")
        refused = respond(panel, fewer)
        assert refused.returncode == 2
        assert f"{panel} has 3 respondents and {fewer} 2 invitation codes" in refused.stderr
        odd = tmp_path / "odd.txt"
        odd.write_text(f"{lines[0]}\n\n{lines[1]} {lines[2]}\n")
        refused = respond(panel, odd)
        assert refused.returncode == 2 and f"{odd}:3: not an invitation code" in refused.stderr
        twice = tmp_path / "twice.txt"
        twice.write_text(f"{lines[0]}\n{lines[1]}\n{lines[0]}\n")
        refused = respond(panel, twice)
        assert refused.returncode == 2
        assert f"{twice}:3: the same invitation code as line 1" in refused.stderr

        # The panel, every code unused by the refusals above.
        done = respond(panel, codes)
        assert done.returncode == 0, done.stderr
        assert f"answered {N} of {N} invited respondents to 'Panel'" in done.stdout
        assert "(remote: 3, team: 2)" in done.stdout
        # Run again: every invitation is used, nothing is sent twice.
        again = respond(panel, codes)
        assert again.returncode == 0, again.stderr
        assert f"answered 0 of {N} invited respondents" in again.stdout
        assert f"{N} invitations were already used" in again.stdout
        assert f"{codes}:1, {codes}:2, {codes}:3" in again.stdout
        status = veil("survey", "status", "--survey-dir", dep / "collector", "--json")
        assert status.returncode == 0, status.stderr
        counts = {q["id"]: q["reports"] for q in json.loads(status.stdout)["questions"]}
        assert counts == {"remote": 3, "team": 2}
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
        for s in servers:
            s.stop()
