"""The official VDAF test vectors: where they are, which Prio3 files they
hold, and the Prio3 instance each file describes.

The vectors are not ours to commit: they come from $VEIL_VDAF_VECTORS or from
../shared/vdaf-test-vectors beside the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from veil.vdaf import (
    Field64,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
)
from veil.vdaf.spec.circuits import GadgetCall, Valid
from veil.vdaf.spec.gadgets import PolyEval
from veil.vdaf.spec.prio3 import Prio3, prio3_with_circuit

_DEFAULT_VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vdaf-test-vectors"


def vectors_dir() -> Path | None:
    configured = os.environ.get("VEIL_VDAF_VECTORS")
    path = Path(configured) if configured else _DEFAULT_VECTORS
    return path if path.is_dir() else None


def vector_files(family: str) -> list[str]:
    """The names of the vector files of a family ("Prio3", "Poplar1"), or a
    placeholder when the vectors are missing (the test that takes it then
    skips through the vdaf_vectors fixture)."""
    path = vectors_dir()
    if path is None:
        return ["(vectors missing)"]
    return sorted(p.name for p in path.glob(f"{family}*.json"))


class HigherDegree(Valid[int, int]):
    """The draft's test-only circuit with a degree-3 gadget x(x-1)(x-2)."""

    field = Field64
    MEAS_LEN = 1
    JOINT_RAND_LEN = 0
    OUTPUT_LEN = 1
    EVAL_OUTPUT_LEN = 1

    def __init__(self) -> None:
        self.GADGETS = [PolyEval([0, 2, -3, 1])]
        self.GADGET_CALLS = [1]

    def encode(self, measurement: int) -> list[int]:
        return [measurement]

    def eval(self, meas, joint_rand, num_shares, gadgets: list[GadgetCall]) -> list[int]:  # type: ignore[no-untyped-def]
        return [gadgets[0]([meas[0]])]

    def truncate(self, meas):  # type: ignore[no-untyped-def]
        return list(meas)

    def decode(self, output, num_measurements):  # type: ignore[no-untyped-def]
        return output[0]


def make_vdaf(name: str, tv: dict[str, Any]) -> Prio3[Any, Any]:
    kind = name.rsplit("_", 1)[0] if not name.count("_bad_") else name.split("_bad_")[0]
    shares = tv["shares"]
    if kind == "Prio3Count":
        return Prio3Count(shares)
    if kind == "Prio3Sum":
        return Prio3Sum(shares, tv["max_measurement"])
    if kind == "Prio3SumVec":
        return Prio3SumVec(shares, tv["length"], tv["max_measurement"], tv["chunk_length"])
    if kind == "Prio3Histogram":
        return Prio3Histogram(shares, tv["length"], tv["chunk_length"])
    if kind == "Prio3MultihotCountVec":
        return Prio3MultihotCountVec(shares, tv["length"], tv["max_weight"], tv["chunk_length"])
    if kind == "Prio3L1BoundSum":
        return Prio3L1BoundSum(shares, tv["length"], tv["max_value"], tv["chunk_length"])
    if kind == "Prio3SumVecWithMultiproof":
        # Field and proof count are fixed by the draft's generator, not the JSON.
        return Prio3SumVecWithMultiproof(
            shares, Field64, 3, tv["length"], tv["max_measurement"], tv["chunk_length"]
        )
    if kind == "Prio3HigherDegree":
        return prio3_with_circuit(0xFFFFFFFF, shares, HigherDegree())
    raise AssertionError(f"unknown vector family {kind}")


_DEFAULT_RFC9474 = Path(__file__).resolve().parents[2].parent / "shared" / "rfc9474-test-vectors"


def rfc9474_vectors_file() -> Path | None:
    """RFC 9474's Appendix A as JSON (rfc9474.json: the four variants, one
    RSA-4096 key), from $VEIL_RFC9474_VECTORS (the directory) or
    ../shared/rfc9474-test-vectors beside the checkout."""
    configured = os.environ.get("VEIL_RFC9474_VECTORS")
    path = (Path(configured) if configured else _DEFAULT_RFC9474) / "rfc9474.json"
    return path if path.is_file() else None


_DEFAULT_RFC9578 = Path(__file__).resolve().parents[2].parent / "shared" / "rfc9578-test-vectors"


def rfc9578_vectors_dir() -> Path | None:
    """The folder of RFC 9578's Appendix A vectors as JSON, from
    $VEIL_RFC9578_VECTORS or ../shared/rfc9578-test-vectors beside the
    checkout; None where neither exists (they are not shipped there)."""
    configured = os.environ.get("VEIL_RFC9578_VECTORS")
    path = Path(configured) if configured else _DEFAULT_RFC9578
    return path if path.is_dir() else None
