"""Prio3L1BoundSum (draft-ietf-ppm-l1-bound-sum-02): the official vector on
the draft-shaped and the batched path (vectorised and lifted), honest
measurements accepted, dishonest ones refused by the encoder, the circuit
and both aggregators' verification."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.vdaf import prio3_round_trip
from veil.vdaf import Field128, Prio3L1BoundSum, VerifyError
from veil.vdaf.batch.circuits import L1BoundSumBatch, batch_circuit
from veil.vdaf.batch.prio3 import BatchPrio3
from veil.vdaf.spec.circuits import L1BoundSum, encode_range_checked_int
from veil.vdaf.spec.flp import FlpBBCGGI19
from veil.vdaf.spec.prio3 import prio3_with_circuit

CTX = b"veil tests"
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
    assert type(batch_circuit(vdaf.flp.valid)) is L1BoundSumBatch


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


@pytest.mark.parametrize("lifted", [False, True], ids=["vectorised", "lifted"])
def test_l1_bound_sum_vector_batched(vdaf_vectors: Path, lifted: bool) -> None:
    """The vector's reports as one batch, byte for byte."""
    tv, vdaf = _vector(vdaf_vectors)
    batch = BatchPrio3(vdaf, lifted=lifted)
    ctx = bytes.fromhex(tv["ctx"])
    key = bytes.fromhex(tv["verify_key"])
    reports = tv["reports"]
    nonces = [bytes.fromhex(r["nonce"]) for r in reports]
    sharded = batch.shard_batch(
        ctx,
        [r["measurement"] for r in reports],
        nonces,
        [bytes.fromhex(r["rand"]) for r in reports],
    )
    assert [p.hex() for p in sharded.public_shares] == [r["public_share"] for r in reports]
    for j in range(vdaf.SHARES):
        assert [s.hex() for s in sharded.input_shares[j]] == [r["input_shares"][j] for r in reports]
    publics = [bytes.fromhex(r["public_share"]) for r in reports]
    inits = [
        batch.verify_init_batch(
            key, ctx, j, nonces, publics, [bytes.fromhex(r["input_shares"][j]) for r in reports]
        )
        for j in range(vdaf.SHARES)
    ]
    for j, init in enumerate(inits):
        assert init.errors == [None] * len(reports)
        assert [s.hex() for s in init.verifier_shares if s is not None] == [
            r["verifier_shares"][0][j] for r in reports
        ]
    msgs = batch.verifier_shares_to_message_batch(ctx, [init.verifier_shares for init in inits])
    assert msgs.errors == [None] * len(reports)
    assert [m.hex() for m in msgs.messages if m is not None] == [
        r["verifier_messages"][0] for r in reports
    ]
    for j, init in enumerate(inits):
        out = batch.verify_next_batch(ctx, init.state, msgs.messages)
        assert out.errors == [None] * len(reports)
        for i, r in enumerate(reports):
            assert vdaf.encode_out_share(out.out_share(i)).hex() == r["out_shares"][j]
        assert vdaf.encode_agg_share(batch.aggregate_batch(out)).hex() == tv["agg_shares"][j]


def test_l1_bound_sum_round_trip() -> None:
    vdaf = Prio3L1BoundSum(2, 4, 100, 5)
    answers = [[100, 0, 0, 0], [25, 25, 25, 25], [0, 0, 0, 0], [1, 2, 3, 94], [0, 0, 0, 7]]
    assert prio3_round_trip(vdaf, answers) == [126, 27, 28, 126]
    # max_value 1: a histogram that also takes the all-zero answer.
    assert prio3_round_trip(Prio3L1BoundSum(2, 3, 1, 2), [[0, 1, 0], [0, 0, 0]]) == [0, 1, 0]


@pytest.mark.parametrize(
    ("measurement", "message"),
    [
        ([60, 60, 0, 1], "sums to 121; at most max_value=120"),
        ([120, 120, 120, 120], "sums to 480"),
        ([0, 121, 0, 0], r"\[1\] must be in \[0, 120\]"),
        ([0, 0, -1, 1], r"\[2\] must be in \[0, 120\]"),
        ([0, 0, 0, 2**127], r"\[3\] must be in \[0, 120\]"),
        ([1, True, 0, 0], "must be an int"),
        ([1, 2.0, 0, 0], "must be an int"),
        ([1, 2, 3], "exactly 4 entries, got 3"),
        ([1, 2, 3, 4, 5], "exactly 4 entries, got 5"),
        ([], "exactly 4 entries, got 0"),
        ("1234", "sequence"),
        (7, "sequence"),
    ],
)
def test_l1_bound_sum_bad_measurements_refused(measurement: Any, message: str) -> None:
    """Refused when sharded on either path, the batched one naming the report."""
    vdaf = Prio3L1BoundSum(2, 4, 120, 3)
    with pytest.raises(ValueError, match=message):
        vdaf.shard(CTX, measurement, bytes(16), bytes(vdaf.RAND_SIZE))
    with pytest.raises(ValueError, match=f"measurement 1: .*{message}"):
        BatchPrio3(vdaf).shard_batch(
            CTX, [[1, 2, 3, 4], measurement], [bytes(16)] * 2, [bytes(vdaf.RAND_SIZE)] * 2
        )


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


def _bits(values: Sequence[int], max_value: int) -> list[int]:
    return [b for v in values for b in encode_range_checked_int(Field128, v, max_value)]


P = Field128.MODULUS
# What a dishonest client could send for length 3 and max_value 6 (3 bits a
# value, weights 1, 2, 3): the entries' bits then the claimed sum's.
LIES = {
    "sum over the bound, claimed within it": _bits([6, 6, 0], 6) + _bits([6], 6),
    "claimed sum below the entries'": _bits([1, 2, 0], 6) + _bits([2], 6),
    "claimed sum above the entries'": _bits([1, 2, 0], 6) + _bits([4], 6),
    "a negative entry (a bit p - 1) offsetting another": (
        [P - 1, 0, 0, *_bits([6, 0], 6), *_bits([5], 6)]
    ),
    "an entry's bit 2 (the entry 2, sum as claimed)": [2, 0, 0, *_bits([0, 0], 6), *_bits([2], 6)],
    "claimed sum with a bit 2": [*_bits([2, 0, 0], 6), 2, 0, 0],
}


def test_l1_bound_sum_circuit_accepts_honest_encodings() -> None:
    valid = L1BoundSum(Field128, 3, 6, 4)
    for m in ([0, 0, 0], [6, 0, 0], [1, 2, 3], [0, 5, 1], [2, 2, 2]):
        assert valid.eval_direct(valid.encode(m), [5, 7, 11]) == [0, 0], m


@pytest.mark.parametrize("lie", list(LIES))
def test_l1_bound_sum_circuit_rejects_lies(lie: str) -> None:
    valid = L1BoundSum(Field128, 3, 6, 4)
    assert len(LIES[lie]) == valid.MEAS_LEN
    assert valid.eval_direct(LIES[lie], [5, 7, 11]) != [0, 0]


class _LyingClient(L1BoundSum):
    """A client that sends a chosen encoding, whatever it is asked."""

    def __init__(self, encoded: list[int]) -> None:
        super().__init__(Field128, 3, 6, 4)
        self.encoded = encoded

    def encode(self, measurement: Sequence[int]) -> list[int]:
        return list(self.encoded)


@pytest.mark.parametrize("lie", list(LIES))
def test_l1_bound_sum_aggregators_refuse_lies(lie: str) -> None:
    """A report of a lying client passes neither aggregator pair's check, on
    the draft-shaped path or the batched one, beside an honest report."""
    honest = Prio3L1BoundSum(2, 3, 6, 4)
    liar = prio3_with_circuit(honest.ID, 2, _LyingClient(LIES[lie]))
    key = secrets.token_bytes(32)
    nonces = [secrets.token_bytes(16) for _ in range(2)]
    reports = [
        honest.shard(CTX, [1, 2, 3], nonces[0], secrets.token_bytes(honest.RAND_SIZE)),
        liar.shard(CTX, [0, 0, 0], nonces[1], secrets.token_bytes(honest.RAND_SIZE)),
    ]
    encoded = [
        (honest.encode_public_share(pub), [honest.encode_input_share(s) for s in shares])
        for pub, shares in reports
    ]
    for i, (pub, shares) in enumerate(encoded):
        states, vshares = [], []
        for j in range(2):
            state, share = honest.verify_init(
                key,
                CTX,
                j,
                None,
                nonces[i],
                honest.decode_public_share(pub),
                honest.decode_input_share(j, shares[j]),
            )
            states.append(state)
            vshares.append(share)
        if i == 0:
            honest.verifier_shares_to_message(CTX, None, vshares)
        else:
            with pytest.raises(VerifyError):
                honest.verifier_shares_to_message(CTX, None, vshares)
    batch = BatchPrio3(honest)
    inits = [
        batch.verify_init_batch(
            key, CTX, j, nonces, [e[0] for e in encoded], [e[1][j] for e in encoded]
        )
        for j in range(2)
    ]
    msgs = batch.verifier_shares_to_message_batch(CTX, [init.verifier_shares for init in inits])
    assert msgs.errors[0] is None
    assert isinstance(msgs.errors[1], VerifyError)


@pytest.mark.parametrize("lie", list(LIES))
def test_l1_bound_sum_flp_rejects_lies(lie: str) -> None:
    """The proof system alone (one share, no secret sharing) rejects each lie."""
    flp = FlpBBCGGI19(L1BoundSum(Field128, 3, 6, 4))
    joint_rand = [3] * flp.JOINT_RAND_LEN
    proof = flp.prove(LIES[lie], [5] * flp.PROVE_RAND_LEN, joint_rand)
    verifier = flp.query(LIES[lie], proof, [9] * flp.QUERY_RAND_LEN, joint_rand, 1)
    assert not flp.decide(verifier)
