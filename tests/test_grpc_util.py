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
        "logging.basicConfig(level=logging.WARNING)\n"
        "for port in (7101, 7102, 7101, 7103):\n"
        "    open_channel(f'127.0.0.1:{port}').close()\n"
        "open_aio_channel('[::1]:7104')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [line for line in done.stderr.splitlines() if "plaintext" in line]
    assert len(lines) == 1, done.stderr
    assert "plaintext gRPC to 127.0.0.1:7101" in lines[0] and "said once" in lines[0]
