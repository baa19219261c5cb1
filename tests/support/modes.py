"""How the suite runs: CI (fail rather than skip) and the long mode."""

from __future__ import annotations

import os

# VEIL_TEST_LONG=1 runs the long mode of the fault, fuzz and load suites
# (hundreds of thousands of cases, minutes of load); CI runs the short mode.
LONG = os.environ.get("VEIL_TEST_LONG") == "1"
