"""The systemd units under deploy/systemd: each passes `systemd-analyze verify`
with no warning (an unknown or misspelt setting is only a warning there), and
each ExecStart is a command line the veil of this checkout accepts."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from veil.cli import build_parser

UNITS = Path(__file__).resolve().parents[1] / "deploy" / "systemd"
INSTALLED = "/usr/local/bin/veil"


def units() -> list[Path]:
    found = sorted(UNITS.glob("*.service"))
    assert {u.name for u in found} >= {
        "veil-leader.service",
        "veil-helper.service",
        "veil-upload@.service",
        "veil-worker@.service",
        "veil-survey-page.service",
    }
    return found


def exec_start(unit: Path) -> list[str]:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart=").replace("%i", "1"))


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("CI"):
            pytest.fail("systemd-analyze is missing (.ci/run installs systemd)")
        pytest.skip("systemd-analyze is not installed")
    # verify checks that ExecStart's program exists: this checkout's veil
    # stands in for the installed one.
    veil = Path(sys.executable).parent / "veil"
    assert veil.exists()
    names = []
    for unit in units():
        text = unit.read_text()
        assert INSTALLED in text
        (tmp_path / unit.name).write_text(text.replace(INSTALLED, str(veil)))
        names.append(unit.name.replace("@.", "@1."))
    done = subprocess.run(
        [analyze, "verify", "--man=no", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    # It does fail on a misspelt setting (as a warning), which the check above catches.
    (tmp_path / "typo.service").write_text(
        (tmp_path / "veil-leader.service").read_text().replace("Restart=", "Restrat=")
    )
    typo = subprocess.run(
        [analyze, "verify", "--man=no", "typo.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Unknown key 'Restrat'" in typo.stderr


def test_exec_start_is_a_veil_command_line() -> None:
    parser = build_parser()
    for unit in units():
        argv = exec_start(unit)
        assert argv[0] == INSTALLED, unit.name
        args = parser.parse_args(argv[1:])
        assert callable(args.func), unit.name
