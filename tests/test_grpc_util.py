"""Channels to veil servers (veil.grpc_util)."""

from __future__ import annotations

import subprocess
import sys


def test_plaintext_warning_once_per_process() -> None:
    # A survey respondent opened a channel per question and aggregator, and
    # each said "plaintext gRPC to ..." again.
    script = (
        "import logging\n"
        "from veil.grpc_util import open_aio_channel, open_channel\n"
        "logging.basicConfig(level=getattr(logging, sys.argv[1]))\n"
        "for port in (7101, 7102, 7101, 7103):\n"
        "    open_channel(f'127.0.0.1:{port}').close()\n"
        "open_aio_channel('[::1]:7104')\n"
    )
    script = "import sys\n" + script
    done = subprocess.run(
        [sys.executable, "-c", script, "INFO"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line for line in done.stderr.splitlines() if "plaintext" in line]
    assert len(lines) == 1, done.stderr
    assert "plaintext gRPC to 127.0.0.1:7101" in lines[0] and "said once" in lines[0]
    # A command line logs at warning by default: on loopback it says nothing
    # (issue 41: every CLI call said it).
    quiet = subprocess.run(
        [sys.executable, "-c", script, "WARNING"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "plaintext" not in quiet.stderr, quiet.stderr


def test_veil_quiets_the_grpc_core_unless_told() -> None:
    """gRPC's C core logged "Got goaway" at INFO on loopback; veil sets
    GRPC_VERBOSITY=ERROR before the core starts, unless it is set."""
    import os

    script = (
        "import os, sys\n"
        "from veil.cli import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(os.environ.get('GRPC_VERBOSITY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.splitlines()[-1] == "ERROR", done
    told = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "GRPC_VERBOSITY": "DEBUG"},
    )
    assert told.stdout.splitlines()[-1] == "DEBUG", told
