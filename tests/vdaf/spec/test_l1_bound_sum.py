"""Prio3L1BoundSum (draft-ietf-ppm-l1-bound-sum-02) on the draft-shaped
path: the official vector, honest measurements accepted, parameters out of
range refused, and what a dishonest client could send rejected by the
circuit and by the proof system. The batched path is in
tests/vdaf/batch/test_l1_bound_sum.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.vdaf import L1_BOUND_SUM_LIES as LIES
from tests.support.vdaf import prio3_round_trip
from veil.vdaf import Field128, Prio3L1BoundSum
from veil.vdaf.spec.circuits import L1BoundSum
from veil.vdaf.spec.flp import FlpBBCGGI19

VECTOR = "Prio3L1BoundSum_0.json"


def _vector(vdaf_vectors: Path) -> tuple[dict[str, Any], Prio3L1BoundSum]:
    tv = json.loads((vdaf_vectors / VECTOR).read_text())
    vdaf = Prio3L1BoundSum(tv["shares"], tv["length"], tv["max_value"], tv["chunk_length"])
    return tv, vdaf


def test_l1_bound_sum_constants() -> None:
    vdaf = Prio3L1BoundSum(2, 10, 240, 9)
    assert (vdaf.ID, vdaf.SHARES, vdaf.PROOFS, vdaf.field) == (7, 2, 1, Field128)
    # Eight bits for each of the ten entries and for their sum.
    assert (vdaf.flp.MEAS_LEN, vdaf.flp.OUTPUT_LEN, vdaf.flp.JOINT_RAND_LEN) == (88, 10, 10)


def test_l1_bound_sum_vector_spec(vdaf_vectors: Path) -> None:
    """Every message of every report, byte for byte, one report at a time."""
    tv, vdaf = _vector(vdaf_vectors)
    assert all(op["success"] for op in tv["operations"])
    ctx = bytes.fromhex(tv["ctx"])
    key = bytes.fromhex(tv["verify_key"])
    agg = [vdaf.agg_init(None) for _ in range(vdaf.SHARES)]
    for r in tv["reports"]:
        nonce = bytes.fromhex(r["nonce"])
        public, inputs = vdaf.shard(ctx, r["measurement"], nonce, bytes.fromhex(r["rand"]))
        assert vdaf.encode_public_share(public).hex() == r["public_share"]
        assert [vdaf.encode_input_share(s).hex() for s in inputs] == r["input_shares"]
        states, shares = [], []
        for j in range(vdaf.SHARES):
            state, share = vdaf.verify_init(
                key,
                ctx,
                j,
                None,
                nonce,
                vdaf.decode_public_share(bytes.fromhex(r["public_share"])),
                vdaf.decode_input_share(j, bytes.fromhex(r["input_shares"][j])),
            )
            assert vdaf.encode_verifier_share(share).hex() == r["verifier_shares"][0][j]
            states.append(state)
            shares.append(share)
        message = vdaf.verifier_shares_to_message(ctx, None, shares)
        assert vdaf.encode_verifier_message(message).hex() == r["verifier_messages"][0]
        for j, state in enumerate(states):
            out = vdaf.verify_next(ctx, state, message)
            assert vdaf.encode_out_share(out).hex() == r["out_shares"][j]
            agg[j] = vdaf.agg_update(None, agg[j], out)
    assert [vdaf.encode_agg_share(a).hex() for a in agg] == tv["agg_shares"]
    decoded = [vdaf.decode_agg_share(None, bytes.fromhex(h)) for h in tv["agg_shares"]]
    assert vdaf.unshard(None, decoded, len(tv["reports"])) == tv["agg_result"]


def test_l1_bound_sum_round_trip() -> None:
    vdaf = Prio3L1BoundSum(2, 4, 100, 5)
    answers = [[100, 0, 0, 0], [25, 25, 25, 25], [0, 0, 0, 0], [1, 2, 3, 94], [0, 0, 0, 7]]
    assert prio3_round_trip(vdaf, answers) == [126, 27, 28, 126]
    # max_value 1: a histogram that also takes the all-zero answer.
    assert prio3_round_trip(Prio3L1BoundSum(2, 3, 1, 2), [[0, 1, 0], [0, 0, 0]]) == [0, 1, 0]


def test_l1_bound_sum_bad_parameters_refused() -> None:
    for args, message in [
        ((0, 5, 2), "length"),
        ((3, 0, 2), "max_value"),
        ((3, 5, 0), "chunk_length"),
        ((3, True, 2), "max_value must be an int"),
        ((2**70, 2**60, 2), "too large for the field"),
    ]:
        with pytest.raises(ValueError, match=message):
            Prio3L1BoundSum(2, *args)


def test_l1_bound_sum_circuit_accepts_honest_encodings() -> None:
    valid = L1BoundSum(Field128, 3, 6, 4)
    for m in ([0, 0, 0], [6, 0, 0], [1, 2, 3], [0, 5, 1], [2, 2, 2]):
        assert valid.eval_direct(valid.encode(m), [5, 7, 11]) == [0, 0], m


@pytest.mark.parametrize("lie", list(LIES))
def test_l1_bound_sum_circuit_rejects_lies(lie: str) -> None:
    valid = L1BoundSum(Field128, 3, 6, 4)
    assert len(LIES[lie]) == valid.MEAS_LEN
    assert valid.eval_direct(LIES[lie], [5, 7, 11]) != [0, 0]


@pytest.mark.parametrize("lie", list(LIES))
def test_l1_bound_sum_flp_rejects_lies(lie: str) -> None:
    """The proof system alone (one share, no secret sharing) rejects each lie."""
    flp = FlpBBCGGI19(L1BoundSum(Field128, 3, 6, 4))
    joint_rand = [3] * flp.JOINT_RAND_LEN
    proof = flp.prove(LIES[lie], [5] * flp.PROVE_RAND_LEN, joint_rand)
    verifier = flp.query(LIES[lie], proof, [9] * flp.QUERY_RAND_LEN, joint_rand, 1)
    assert not flp.decide(verifier)
