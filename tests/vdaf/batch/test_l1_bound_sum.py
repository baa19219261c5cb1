"""Prio3L1BoundSum (draft-ietf-ppm-l1-bound-sum-02) on the batched path
against the official vector (vectorised and lifted) and against the
draft-shaped path: bad measurements refused by both encoders, a dishonest
client's report refused by both paths' aggregators beside an honest one."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.vdaf import L1_BOUND_SUM_LIES as LIES
from veil.vdaf import Field128, Prio3L1BoundSum, VerifyError
from veil.vdaf.batch.circuits import L1BoundSumBatch, batch_circuit
from veil.vdaf.batch.prio3 import BatchPrio3
from veil.vdaf.spec.circuits import L1BoundSum
from veil.vdaf.spec.prio3 import prio3_with_circuit

CTX = b"veil tests"
VECTOR = "Prio3L1BoundSum_0.json"


def _vector(vdaf_vectors: Path) -> tuple[dict[str, Any], Prio3L1BoundSum]:
    tv = json.loads((vdaf_vectors / VECTOR).read_text())
    vdaf = Prio3L1BoundSum(tv["shares"], tv["length"], tv["max_value"], tv["chunk_length"])
    return tv, vdaf


def test_l1_bound_sum_batch_circuit() -> None:
    vdaf = Prio3L1BoundSum(2, 10, 240, 9)
    assert type(batch_circuit(vdaf.flp.valid)) is L1BoundSumBatch


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
