"""The `veil` command run as its own process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_veil(
    *args: str | Path,
    cwd: Path | None = None,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`veil ARGS...` through this interpreter; `env` adds to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "veil.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


def veil(
    *args: str | Path, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`veil ARGS...` with only errors logged: the warning about plaintext on
    loopback silenced as a user would silence it."""
    return run_veil(*args, cwd=cwd, timeout=timeout, env={"VEIL_LOG_LEVEL": "error"})
