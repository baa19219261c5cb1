"""How the suite runs: CI (fail rather than skip) and the long mode."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# VEIL_TEST_LONG=1 runs the long mode of the fault, fuzz and load suites
# (hundreds of thousands of cases, minutes of load); CI runs the short mode.
LONG = os.environ.get("VEIL_TEST_LONG") == "1"


def unavailable(reason: str) -> NoReturn:
    """A tool or dependency a test needs is missing: the test skips, saying
    `reason`, except under CI, where it fails, so CI never passes without it."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)
