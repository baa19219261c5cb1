"""Shared test configuration: where the official VDAF test vectors live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# VEIL_TEST_LONG=1 runs the long mode of the fault, fuzz and load suites
# (hundreds of thousands of cases, minutes of load); CI runs the short mode.
LONG = os.environ.get("VEIL_TEST_LONG") == "1"

# The vectors are not ours to commit: they come from $VEIL_VDAF_VECTORS or
# from ../shared/vdaf-test-vectors beside the checkout.
_DEFAULT_VECTORS = Path(__file__).resolve().parents[1].parent / "shared" / "vdaf-test-vectors"


def vectors_dir() -> Path | None:
    configured = os.environ.get("VEIL_VDAF_VECTORS")
    path = Path(configured) if configured else _DEFAULT_VECTORS
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def vdaf_vectors() -> Path:
    path = vectors_dir()
    if path is None:
        pytest.skip(
            "official VDAF test vectors not found: set VEIL_VDAF_VECTORS or place "
            "test_vec/vdaf of github.com/cfrg/draft-irtf-cfrg-vdaf at ../shared/vdaf-test-vectors"
        )
    return path
