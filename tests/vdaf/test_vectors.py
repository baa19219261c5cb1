"""Known-answer tests against the official draft-irtf-cfrg-vdaf vectors.

Each Prio3 file lists the operations to run in order and whether each
succeeds; every intermediate message is compared byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import vectors_dir
from veil.vdaf import (
    Field64,
    Field128,
    Prio3Count,
    Prio3Histogram,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
    VerifyError,
    XofFixedKeyAes128,
    XofTurboShake128,
)
from veil.vdaf.spec.circuits import GadgetCall, Valid
from veil.vdaf.spec.gadgets import PolyEval
from veil.vdaf.spec.prio3 import Prio3, VerifierShare, VerifyState, prio3_with_circuit


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
    if kind == "Prio3SumVecWithMultiproof":
        # Field and proof count are fixed by the draft's generator, not the JSON.
        return Prio3SumVecWithMultiproof(
            shares, Field64, 3, tv["length"], tv["max_measurement"], tv["chunk_length"]
        )
    if kind == "Prio3HigherDegree":
        return prio3_with_circuit(0xFFFFFFFF, shares, HigherDegree())
    raise AssertionError(f"unknown vector family {kind}")


def _prio3_files() -> list[str]:
    path = vectors_dir()
    if path is None:
        return ["(vectors missing)"]
    return sorted(p.name for p in path.glob("Prio3*.json"))


@pytest.mark.parametrize("name", _prio3_files())
def test_prio3_vector(vdaf_vectors: Path, name: str) -> None:
    tv = json.loads((vdaf_vectors / name).read_text())
    vdaf = make_vdaf(name.removesuffix(".json"), tv)
    ctx = bytes.fromhex(tv["ctx"])
    verify_key = bytes.fromhex(tv["verify_key"])
    reports = tv["reports"]
    states: dict[tuple[int, int], VerifyState] = {}
    out_shares: dict[tuple[int, int], list[int]] = {}
    messages: dict[int, bytes | None] = {}
    agg_shares: dict[int, list[int]] = {}

    def run(op: dict[str, Any]) -> None:
        kind = op["operation"]
        index = op.get("report_index", 0)
        report = reports[index] if reports else {}
        agg_id = op.get("aggregator_id", 0)
        nonce = bytes.fromhex(report.get("nonce", ""))
        if kind == "shard":
            public_share, input_shares = vdaf.shard(
                ctx, report["measurement"], nonce, bytes.fromhex(report["rand"])
            )
            assert vdaf.encode_public_share(public_share).hex() == report["public_share"]
            assert [vdaf.encode_input_share(s).hex() for s in input_shares] == report[
                "input_shares"
            ]
        elif kind == "verify_init":
            public_share = vdaf.decode_public_share(bytes.fromhex(report["public_share"]))
            input_share = vdaf.decode_input_share(
                agg_id, bytes.fromhex(report["input_shares"][agg_id])
            )
            state, share = vdaf.verify_init(
                verify_key, ctx, agg_id, None, nonce, public_share, input_share
            )
            states[index, agg_id] = state
            expected = report["verifier_shares"][0]
            if agg_id < len(expected):
                assert vdaf.encode_verifier_share(share).hex() == expected[agg_id]
        elif kind == "verifier_shares_to_message":
            shares: list[VerifierShare] = [
                vdaf.decode_verifier_share(states[index, j], bytes.fromhex(h))
                for j, h in enumerate(report["verifier_shares"][0])
            ]
            message = vdaf.verifier_shares_to_message(ctx, None, shares)
            messages[index] = message
            assert vdaf.encode_verifier_message(message).hex() == report["verifier_messages"][0]
        elif kind == "verify_next":
            message = vdaf.decode_verifier_message(
                states[index, agg_id], bytes.fromhex(report["verifier_messages"][0])
            )
            out = vdaf.verify_next(ctx, states[index, agg_id], message)
            out_shares[index, agg_id] = out
            assert vdaf.encode_out_share(out).hex() == report["out_shares"][agg_id]
        elif kind == "aggregate":
            share = vdaf.agg_init(None)
            for i in range(len(reports)):
                share = vdaf.agg_update(None, share, out_shares[i, agg_id])
            agg_shares[agg_id] = share
            assert vdaf.encode_agg_share(share).hex() == tv["agg_shares"][agg_id]
        elif kind == "unshard":
            decoded = [vdaf.decode_agg_share(None, bytes.fromhex(h)) for h in tv["agg_shares"]]
            assert vdaf.unshard(None, decoded, len(reports)) == tv["agg_result"]
        else:
            raise AssertionError(f"unknown operation {kind}")

    failures = 0
    for op in tv["operations"]:
        if op["success"]:
            run(op)
        else:
            failures += 1
            with pytest.raises(VerifyError):
                run(op)
    assert failures == sum(1 for op in tv["operations"] if not op["success"])
    if "_bad_" in name:
        assert failures == 1, "a negative vector must exercise its failing operation"


@pytest.mark.parametrize("xof", [XofTurboShake128, XofFixedKeyAes128])
def test_xof_vector(vdaf_vectors: Path, xof: type[XofTurboShake128]) -> None:
    tv = json.loads((vdaf_vectors / f"{xof.__name__}.json").read_text())
    seed, dst, binder = (bytes.fromhex(tv[k]) for k in ("seed", "dst", "binder"))
    assert xof.derive_seed(seed, dst, binder).hex() == tv["derived_seed"]
    vec = xof.expand_into_vec(Field128, seed, dst, binder, tv["length"])
    assert Field128.encode_vec(vec).hex() == tv["expanded_vec_field128"]
