"""The batched Prio3 path against the official vectors and the scalar path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.vectors import make_vdaf, vector_files
from veil.aggregator.core import CHECKSUM_SIZE, job_deltas, report_checksum, xor
from veil.aggregator.store.records import BatchAggregate
from veil.vdaf import (
    CodecError,
    Field64,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3MultihotCountVec,
    Prio3Sum,
    Prio3SumVec,
    Prio3SumVecWithMultiproof,
    VdafError,
    VerifyError,
)
from veil.vdaf.batch.prio3 import BatchPrio3
from veil.vdaf.engine import OutShares, Prio3Engine
from veil.vdaf.spec.prio3 import Prio3

CTX = b"some application"


def _run_vector(tv: dict[str, Any], vdaf: Prio3[Any, Any], lifted: bool) -> int:
    """Every operation of a vector through the batched path, all reports of
    the vector in one batch; returns the number of expected failures seen."""
    batch = BatchPrio3(vdaf, lifted=lifted)
    ctx = bytes.fromhex(tv["ctx"])
    verify_key = bytes.fromhex(tv["verify_key"])
    reports = tv["reports"]
    ops = tv["operations"]
    nonces = [bytes.fromhex(r["nonce"]) for r in reports]
    failures = 0

    def expect(kind: str, agg_id: int | None = None) -> dict[int, bool]:
        return {
            op.get("report_index", 0): op["success"]
            for op in ops
            if op["operation"] == kind and (agg_id is None or op.get("aggregator_id") == agg_id)
        }

    sharded = expect("shard")
    if sharded:
        result = batch.shard_batch(
            ctx,
            [r["measurement"] for r in reports],
            nonces,
            [bytes.fromhex(r["rand"]) for r in reports],
        )
        for i, r in enumerate(reports):
            assert result.public_shares[i].hex() == r["public_share"]
            assert [s[i].hex() for s in result.input_shares] == r["input_shares"]

    states = {}
    for agg_id in range(vdaf.SHARES):
        wanted = expect("verify_init", agg_id)
        if not wanted:
            continue
        init = batch.verify_init_batch(
            verify_key,
            ctx,
            agg_id,
            nonces,
            [bytes.fromhex(r["public_share"]) for r in reports],
            [bytes.fromhex(r["input_shares"][agg_id]) for r in reports],
        )
        for i, r in enumerate(reports):
            assert init.errors[i] is None
            expected = r["verifier_shares"][0]
            if agg_id < len(expected):
                share = init.verifier_shares[i]
                assert share is not None and share.hex() == expected[agg_id]
        states[agg_id] = init.state

    wanted = expect("verifier_shares_to_message")
    if wanted:
        msgs = batch.verifier_shares_to_message_batch(
            ctx,
            [
                [bytes.fromhex(r["verifier_shares"][0][j]) for r in reports]
                for j in range(vdaf.SHARES)
            ],
        )
        for i, success in wanted.items():
            if success:
                assert msgs.errors[i] is None
                message = msgs.messages[i]
                assert message is not None
                assert message.hex() == reports[i]["verifier_messages"][0]
            else:
                failures += 1
                assert isinstance(msgs.errors[i], VerifyError)
                assert msgs.messages[i] is None

    outs = {}
    for agg_id, state in states.items():
        wanted = expect("verify_next", agg_id)
        if not wanted:
            continue
        out = batch.verify_next_batch(
            ctx, state, [bytes.fromhex(r["verifier_messages"][0]) for r in reports]
        )
        for i, success in wanted.items():
            if success:
                assert out.errors[i] is None
                enc = vdaf.encode_out_share(out.out_share(i))
                assert enc.hex() == reports[i]["out_shares"][agg_id]
            else:
                failures += 1
                assert isinstance(out.errors[i], VerifyError)
        outs[agg_id] = out

    for agg_id in range(vdaf.SHARES):
        if expect("aggregate", agg_id) or any(
            op["operation"] == "aggregate" and op.get("aggregator_id") == agg_id for op in ops
        ):
            share = batch.aggregate_batch(outs[agg_id])
            assert vdaf.encode_agg_share(share).hex() == tv["agg_shares"][agg_id]
    return failures


@pytest.mark.parametrize("lifted", [False, True], ids=["vectorised", "lifted"])
@pytest.mark.parametrize("name", vector_files("Prio3"))
def test_vector_batched(vdaf_vectors: Path, name: str, lifted: bool) -> None:
    tv = json.loads((vdaf_vectors / name).read_text())
    vdaf = make_vdaf(name.removesuffix(".json"), tv)
    failures = _run_vector(tv, vdaf, lifted)
    assert failures == sum(1 for op in tv["operations"] if not op["success"])


# -- mixed batches against the scalar path, report by report ---------------

_VDAFS: dict[str, tuple[Prio3[Any, Any], Any]] = {
    "count": (Prio3Count(2), st.integers(0, 1)),
    "sum": (Prio3Sum(2, 1000), st.integers(0, 1000)),
    "sumvec": (Prio3SumVec(2, 5, 3, 4), st.lists(st.integers(0, 3), min_size=5, max_size=5)),
    "histogram": (Prio3Histogram(2, 7, 3), st.integers(0, 6)),
    "multihot": (
        Prio3MultihotCountVec(2, 6, 3, 2),
        st.lists(st.booleans(), min_size=6, max_size=6).filter(lambda b: sum(b) <= 3),
    ),
    "multiproof": (
        Prio3SumVecWithMultiproof(2, Field64, 2, 3, 2, 2),
        st.lists(st.integers(0, 2), min_size=3, max_size=3),
    ),
    "count3": (Prio3Count(3), st.integers(0, 1)),
    "l1boundsum": (
        Prio3L1BoundSum(2, 5, 6, 4),
        st.lists(st.integers(0, 6), min_size=5, max_size=5).filter(lambda v: sum(v) <= 6),
    ),
}

# How a report is spoiled before verification.
_TAMPERS = ["none", "leader_byte", "helper_seed", "public_share", "unreduced", "truncated"]


def _tamper(
    vdaf: Prio3[Any, Any], how: str, public: bytes, shares: list[bytes], pos: int
) -> tuple[bytes, list[bytes]]:
    shares = list(shares)
    if how == "leader_byte":
        leader = bytearray(shares[0])
        leader[pos % len(leader)] ^= 1 << (pos % 8)
        shares[0] = bytes(leader)
    elif how == "helper_seed":
        helper = bytearray(shares[1])
        helper[pos % 32] ^= 0x80
        shares[1] = bytes(helper)
    elif how == "public_share" and public:
        flipped = bytearray(public)
        flipped[pos % len(flipped)] ^= 1
        public = bytes(flipped)
    elif how == "unreduced":
        size = vdaf.field.ENCODED_SIZE
        leader = bytearray(shares[0])
        leader[:size] = b"\xff" * size
        shares[0] = bytes(leader)
    elif how == "truncated":
        shares[0] = shares[0][:-1]
    return public, shares


def _scalar_outcome(
    vdaf: Prio3[Any, Any], key: bytes, nonce: bytes, public: bytes, shares: list[bytes]
) -> tuple[type[Exception] | None, list[bytes | None], bytes | None, list[list[int]] | None]:
    """(error class or None, encoded verifier shares, encoded verifier
    message, every aggregator's output share)."""
    states, vshares = [], []
    try:
        pub = vdaf.decode_public_share(public)
        for j in range(vdaf.SHARES):
            state, share = vdaf.verify_init(
                key, CTX, j, None, nonce, pub, vdaf.decode_input_share(j, shares[j])
            )
            states.append(state)
            vshares.append(share)
    except VdafError as e:
        return type(e), [], None, None
    encoded: list[bytes | None] = [vdaf.encode_verifier_share(s) for s in vshares]
    try:
        msg = vdaf.verifier_shares_to_message(CTX, None, vshares)
        outs = [vdaf.verify_next(CTX, s, msg) for s in states]
    except VdafError as e:
        return type(e), encoded, None, None
    return None, encoded, vdaf.encode_verifier_message(msg), outs


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), which=st.sampled_from(sorted(_VDAFS)))
def test_mixed_batch_matches_scalar(data: st.DataObject, which: str) -> None:
    vdaf, meas_strategy = _VDAFS[which]
    batch = BatchPrio3(vdaf)
    size = data.draw(st.integers(1, 8), label="batch size")
    measurements = [data.draw(meas_strategy, label="measurement") for _ in range(size)]
    nonces = [data.draw(st.binary(min_size=16, max_size=16)) for _ in range(size)]
    rands = [
        data.draw(st.binary(min_size=vdaf.RAND_SIZE, max_size=vdaf.RAND_SIZE)) for _ in range(size)
    ]
    key = data.draw(st.binary(min_size=32, max_size=32), label="verify key")
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    publics, inputs = [], []
    for i in range(size):
        public, shares = vdaf.shard(CTX, measurements[i], nonces[i], rands[i])
        assert sharded.public_shares[i] == vdaf.encode_public_share(public)
        expected = [vdaf.encode_input_share(s) for s in shares]
        assert [s[i] for s in sharded.input_shares] == expected
        how = data.draw(st.sampled_from(_TAMPERS), label="tamper")
        pos = data.draw(st.integers(0, 10_000), label="position")
        public_b, shares_b = _tamper(vdaf, how, sharded.public_shares[i], expected, pos)
        publics.append(public_b)
        inputs.append(shares_b)

    inits = [
        batch.verify_init_batch(key, CTX, j, nonces, publics, [s[j] for s in inputs])
        for j in range(vdaf.SHARES)
    ]
    msgs = batch.verifier_shares_to_message_batch(CTX, [init.verifier_shares for init in inits])
    outs = [batch.verify_next_batch(CTX, init.state, msgs.messages) for init in inits]
    accepted = []
    for i in range(size):
        error, vshares, message, out_shares = _scalar_outcome(
            vdaf, key, nonces[i], publics[i], inputs[i]
        )
        batch_errors = [init.errors[i] for init in inits] + [msgs.errors[i], outs[0].errors[i]]
        first = next((e for e in batch_errors if e is not None), None)
        if error is None:
            assert first is None
            assert [init.verifier_shares[i] for init in inits] == vshares
            assert msgs.messages[i] == message
            assert [out.out_share(i) for out in outs] == out_shares
            accepted.append(i)
        else:
            assert first is not None
            # Decoding failures are codec errors in both paths.
            assert isinstance(first, CodecError) == issubclass(error, CodecError)
        if vshares and error is not None and not issubclass(error, CodecError):
            assert [init.verifier_shares[i] for init in inits] == vshares
    for j, out in enumerate(outs):
        expected_agg = vdaf.agg_init(None)
        for i in accepted:
            expected_agg = vdaf.agg_update(None, expected_agg, out.out_share(i))
        assert batch.aggregate_batch(out) == expected_agg
        # Any accepted rows (one time bucket's), summed in the batch field.
        rows = (
            data.draw(st.lists(st.sampled_from(accepted), unique=True), label="rows")
            if accepted
            else []
        )
        expected_rows = vdaf.agg_init(None)
        for i in rows:
            expected_rows = vdaf.agg_update(None, expected_rows, out.out_share(i))
        assert batch.aggregate_rows(out, rows) == expected_rows
        # A job's deltas per bucket are what the scalar path makes of its out shares.
        buckets = [3600 * data.draw(st.integers(0, 2), label="bucket") for _ in accepted]
        triples = list(zip(buckets, [nonces[i] for i in accepted], accepted, strict=True))
        scalar = [(b, rid, out.out_share(i)) for b, rid, i in triples]
        engine, shares = Prio3Engine(batch), OutShares(out.errors, out)
        assert job_deltas(engine, shares, triples) == _scalar_deltas(vdaf, scalar)
        assert out.ok.tolist() == [i in accepted for i in range(size)], j
    failed = [i for i in range(size) if i not in accepted]
    if failed:
        with pytest.raises(ValueError, match="failed verification"):
            batch.aggregate_rows(outs[0], failed[:1])


def _scalar_deltas(
    vdaf: Prio3[Any, Any], accepted: list[tuple[int, bytes, list[int]]]
) -> list[BatchAggregate]:
    """A job's delta to each bucket by the scalar path: agg_update report by report."""
    shares: dict[int, list[int]] = {}
    counts: dict[int, int] = {}
    sums: dict[int, bytes] = {}
    for bucket, report_id, out_share in accepted:
        shares[bucket] = vdaf.agg_update(None, shares.get(bucket, vdaf.agg_init(None)), out_share)
        counts[bucket] = counts.get(bucket, 0) + 1
        sums[bucket] = xor(sums.get(bucket, bytes(CHECKSUM_SIZE)), report_checksum(report_id))
    return [BatchAggregate(b, vdaf.encode_agg_share(shares[b]), counts[b], sums[b]) for b in shares]


@pytest.mark.parametrize(
    "which,good,bad",
    [
        ("count", 1, 2),
        ("count", 0, True),
        ("sum", 1000, 1001),
        ("sum", 0, -1),
        ("sumvec", [0, 1, 2, 3, 0], [0, 1, 4, 3, 0]),
        ("sumvec", [0, 1, 2, 3, 0], [0, 1, 2]),
        ("sumvec", [0, 1, 2, 3, 0], [0, 1, False, 3, 0]),
        ("histogram", 6, 7),
        ("histogram", 0, 1.0),
        ("multihot", [True] * 3 + [False] * 3, [True] * 4 + [False] * 2),
        ("l1boundsum", [0, 1, 2, 3, 0], [0, 1, 2, 3, 1]),
        ("l1boundsum", [0, 1, 2, 3, 0], [0, 1, 2]),
    ],
)
def test_bad_measurement_names_the_report(which: str, good: Any, bad: Any) -> None:
    """The batched encoders reject what the scalar ones reject, naming the
    report; a good measurement beside it does not matter."""
    vdaf, _ = _VDAFS[which]
    with pytest.raises(ValueError):
        vdaf.shard(CTX, bad, bytes(16), bytes(vdaf.RAND_SIZE))
    batch = BatchPrio3(vdaf)
    with pytest.raises(ValueError, match="measurement 1"):
        batch.shard_batch(CTX, [good, bad], [bytes(16)] * 2, [bytes(vdaf.RAND_SIZE)] * 2)


def test_empty_batch() -> None:
    vdaf = Prio3Histogram(2, 4, 2)
    batch = BatchPrio3(vdaf)
    sharded = batch.shard_batch(CTX, [], [], [])
    assert sharded.public_shares == []
    init = batch.verify_init_batch(bytes(32), CTX, 0, [], [], [])
    out = batch.verify_next_batch(CTX, init.state, [])
    assert batch.aggregate_batch(out) == [0] * 4
