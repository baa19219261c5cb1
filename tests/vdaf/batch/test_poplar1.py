"""The batched Poplar1 path (veil.vdaf.batch.poplar1) against the scalar
path, report for report and byte for byte: sharding, both rounds of
verification at every kind of level (first, inner, leaf; from the root and
from the previous level's cache), aggregation, the official vectors, and
malformed or cheating reports inside an otherwise good batch."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.vdaf import CheatingClient, poplar1_vectors_through_the_batch
from veil.vdaf import CodecError, VerifyError
from veil.vdaf.batch.idpf import IdpfCache
from veil.vdaf.batch.poplar1 import BatchPoplar1, Poplar1OutShareBatch, VerifyRoundBatch
from veil.vdaf.errors import AggParamError, AggParamSequenceError
from veil.vdaf.spec.poplar1 import FieldVec, Poplar1, Poplar1AggParam

CTX = b"veil batch poplar1"
KEY = bytes(range(32, 64))

Prefix = tuple[bool, ...]


def _inputs(vdaf: Poplar1, measurements: Sequence[Prefix], seed: int) -> tuple[Any, ...]:
    rng = random.Random(seed)
    nonces = [rng.randbytes(16) for _ in measurements]
    rands = [rng.randbytes(vdaf.RAND_SIZE) for _ in measurements]
    return nonces, rands


def _scalar_round_trip(
    vdaf: Poplar1,
    agg_param: Poplar1AggParam,
    nonce: bytes,
    public: bytes,
    shares: Sequence[bytes],
) -> tuple[list[bytes], list[bytes], list[bytes]] | None:
    """The scalar path's encoded messages for one report (None if it rejects)."""
    ps = vdaf.decode_public_share(public)
    inits = [
        vdaf.verify_init(KEY, CTX, j, agg_param, nonce, ps, vdaf.decode_input_share(j, shares[j]))
        for j in (0, 1)
    ]
    first = [vdaf.encode_verifier_share(s) for _, s in inits]
    message = vdaf.verifier_shares_to_message(CTX, agg_param, [s for _, s in inits])
    seconds = [vdaf.verify_next(CTX, st, message) for st, _ in inits]
    pairs = [s for s in seconds if isinstance(s, tuple)]
    second = [vdaf.encode_verifier_share(s) for _, s in pairs]
    try:
        final = vdaf.verifier_shares_to_message(CTX, agg_param, [s for _, s in pairs])
    except VerifyError:
        return None
    outs = [vdaf.verify_next(CTX, st, final) for st, _ in pairs]
    return first, second, [vdaf.encode_out_share(o) for o in outs if isinstance(o, FieldVec)]


def _batch_round_trip(
    batch: BatchPoplar1,
    agg_param: Poplar1AggParam,
    nonces: Sequence[bytes],
    publics: Sequence[bytes | None],
    shares: Sequence[Sequence[bytes | None]],
    caches: Sequence[IdpfCache | None] = (None, None),
) -> tuple[list[VerifyRoundBatch], list[VerifyRoundBatch], list[Poplar1OutShareBatch]]:
    inits = [
        batch.verify_init_batch(KEY, CTX, j, agg_param, nonces, publics, shares[j], caches[j])
        for j in (0, 1)
    ]
    msgs = batch.verifier_shares_to_message_batch(
        CTX, agg_param, [i.verifier_shares for i in inits]
    )
    seconds = [batch.verify_next_batch(CTX, i.state, msgs) for i in inits]
    assert all(isinstance(s, VerifyRoundBatch) for s in seconds)
    rounds = [s for s in seconds if isinstance(s, VerifyRoundBatch)]
    finals = batch.verifier_shares_to_message_batch(
        CTX, agg_param, [s.verifier_shares for s in rounds]
    )
    outs = [batch.verify_next_batch(CTX, s.state, finals) for s in rounds]
    assert all(isinstance(o, Poplar1OutShareBatch) for o in outs)
    return inits, rounds, [o for o in outs if isinstance(o, Poplar1OutShareBatch)]


@pytest.mark.parametrize("bits", [1, 2, 5, 16, 128])
def test_shard_batch_equals_the_scalar_shard(bits: int) -> None:
    vdaf = Poplar1(bits)
    rng = random.Random(bits)
    measurements = [tuple(rng.random() < 0.5 for _ in range(bits)) for _ in range(12)]
    nonces, rands = _inputs(vdaf, measurements, bits)
    sharded = BatchPoplar1(vdaf).shard_batch(CTX, measurements, nonces, rands)
    for i, (m, n, r) in enumerate(zip(measurements, nonces, rands, strict=True)):
        public, shares = vdaf.shard(CTX, m, n, r)
        assert sharded.public_shares[i] == vdaf.encode_public_share(public)
        assert [s[i] for s in sharded.input_shares] == [vdaf.encode_input_share(x) for x in shares]


def test_shard_batch_refuses_bad_inputs() -> None:
    batch = BatchPoplar1(Poplar1(4))
    good = [(True,) * 4]
    with pytest.raises(ValueError, match="report 0: a Poplar1"):
        batch.shard_batch(CTX, [(True,) * 3], [bytes(16)], [bytes(128)])
    with pytest.raises(ValueError, match="report 0: nonce"):
        batch.shard_batch(CTX, good, [bytes(15)], [bytes(128)])
    with pytest.raises(ValueError, match="report 0: rand"):
        batch.shard_batch(CTX, good, [bytes(16)], [bytes(127)])
    with pytest.raises(ValueError, match="same length"):
        batch.shard_batch(CTX, good, [], [])
    assert batch.shard_batch(CTX, [], [], []).public_shares == []


@pytest.mark.parametrize(
    ("bits", "chunk_nodes", "cache_nodes"),
    [(3, 1 << 18, 1 << 12), (12, 1 << 18, 1 << 12), (128, 1 << 18, 1 << 12), (12, 7, 3)],
    ids=["3", "12", "128", "12-small-chunks-and-cache"],
)
def test_a_sweep_of_levels_equals_the_scalar_path_report_for_report(
    bits: int, chunk_nodes: int, cache_nodes: int
) -> None:
    """Heavy hitters level by level, the batch keeping its IDPF cache from
    one level to the next (and jumping levels), every message compared;
    also with sub-batches of a few reports and a cache of a few nodes (kept
    above the level when the level has more)."""
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    batch.walk.chunk_nodes, batch.walk.cache_nodes = chunk_nodes, cache_nodes
    rng = random.Random(bits * 7)
    words = [tuple(rng.random() < 0.5 for _ in range(bits)) for _ in range(4)]
    measurements = [rng.choice(words) for _ in range(9)] + [
        tuple(rng.random() < 0.5 for _ in range(bits))
    ]
    nonces, rands = _inputs(vdaf, measurements, bits)
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    levels = sorted({0, 1, bits // 2, bits - 2, bits - 1} & set(range(bits)))
    caches: list[IdpfCache | None] = [None, None]
    previous: list[Poplar1AggParam] = []
    kept: list[bool] = []  # whether the cache kept nodes above the level
    for level in levels:
        wanted = {w[: level + 1] for w in words} | {(True,) * (level + 1)}
        if previous:
            known = set(previous[-1].prefixes)
            wanted = {p for p in wanted if p[: previous[-1].level + 1] in known}
        agg_param = Poplar1AggParam(level, tuple(sorted(wanted)))
        assert vdaf.is_valid(agg_param, previous)
        inits, rounds, outs = _batch_round_trip(
            batch, agg_param, nonces, sharded.public_shares, sharded.input_shares, caches
        )
        caches = [i.cache for i in inits]
        kept.append(inits[0].cache.node_level < level if inits[0].cache else False)
        for i in range(len(measurements)):
            expected = _scalar_round_trip(
                vdaf,
                agg_param,
                nonces[i],
                sharded.public_shares[i],
                [s[i] for s in sharded.input_shares],
            )
            assert expected is not None
            first, second, out = expected
            assert [init.verifier_shares[i] for init in inits] == first
            assert [r.verifier_shares[i] for r in rounds] == second
            assert [vdaf.encode_out_share(_row(vdaf, o, i)) for o in outs] == out
        counts = vdaf.unshard(agg_param, [batch.aggregate_batch(o) for o in outs], 10)
        truth = Counter(m[: level + 1] for m in measurements)
        assert counts == [truth[p] for p in agg_param.prefixes]
        previous.append(agg_param)
    assert any(kept) == (cache_nodes < 4)


def _row(vdaf: Poplar1, out: Poplar1OutShareBatch, i: int) -> FieldVec:
    field = vdaf.idpf.current_field(out.level)
    return FieldVec(field, [int(v) for v in out.out_shares[i]])


def test_official_vectors_through_the_batch(vdaf_vectors: Path) -> None:
    poplar1_vectors_through_the_batch(vdaf_vectors)


def test_bad_reports_fail_alone() -> None:
    """Malformed, unreduced and cheating reports in a batch: each gets its
    own error, the others are counted."""
    bits = 7  # 14 control bits: two padding bits in the second byte
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(21)
    measurements = [tuple(rng.random() < 0.5 for _ in range(bits)) for _ in range(8)]
    nonces, rands = _inputs(vdaf, measurements, 21)
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    publics: list[bytes | None] = list(sharded.public_shares)
    shares: list[list[bytes | None]] = [list(s) for s in sharded.input_shares]
    publics[1] = publics[1][:-1]  # truncated
    publics[2] = publics[2][:-32] + b"\xff" * 32  # leaf payload unreduced
    shares[1][3] = None  # missing
    shares[0][4] = shares[0][4][:48] + b"\xff" * 8 + shares[0][4][56:]  # corr unreduced
    publics[5] = bytes([publics[5][0], publics[5][1] | 0x80]) + publics[5][2:]  # padding bit
    cheat = CheatingClient(bits, 2, 2)
    public, cheat_shares = cheat.shard(CTX, measurements[6], nonces[6], rands[6])
    publics[6] = cheat.encode_public_share(public)
    for j in (0, 1):
        shares[j][6] = cheat.encode_input_share(cheat_shares[j])
    agg_param = Poplar1AggParam(2, tuple(sorted({m[:3] for m in measurements})))
    _, _, outs = _batch_round_trip(batch, agg_param, nonces, publics, shares)
    errors = outs[0].errors
    assert [type(e) for e in errors] == [
        type(None),
        CodecError,
        CodecError,
        VerifyError,  # the helper's share was missing: the leader sees no message
        CodecError,
        CodecError,
        VerifyError,
        type(None),
    ]
    assert isinstance(outs[1].errors[3], CodecError)
    assert "missing" in str(errors[3])
    assert "not one-hot" in str(errors[6])
    counts = vdaf.unshard(agg_param, [batch.aggregate_batch(o) for o in outs], 2)
    truth = Counter(measurements[i][:3] for i in (0, 7))
    assert counts == [truth[p] for p in agg_param.prefixes]


def test_a_cache_is_only_good_for_its_reports_and_the_next_levels() -> None:
    vdaf = Poplar1(6)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(31)
    measurements = [tuple(rng.random() < 0.5 for _ in range(6)) for _ in range(3)]
    nonces, rands = _inputs(vdaf, measurements, 31)
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    first = Poplar1AggParam(1, ((False, True), (True, False)))
    init = batch.verify_init_batch(
        KEY, CTX, 0, first, nonces, sharded.public_shares, sharded.input_shares[0]
    )
    assert init.cache is not None

    def again(agg_param: Poplar1AggParam, agg_id: int = 0, order: slice = slice(None)) -> None:
        batch.verify_init_batch(
            KEY,
            CTX,
            agg_id,
            agg_param,
            nonces[order],
            sharded.public_shares[order],
            sharded.input_shares[agg_id][order],
            init.cache,
        )

    with pytest.raises(AggParamSequenceError, match="levels must increase"):
        again(Poplar1AggParam(1, ((False, True),)))
    with pytest.raises(AggParamSequenceError, match="does not extend"):
        again(Poplar1AggParam(2, ((False, False, True),)))
    with pytest.raises(ValueError, match="other reports or another aggregator"):
        again(Poplar1AggParam(2, ((False, True, True),)), order=slice(None, None, -1))
    with pytest.raises(ValueError, match="other reports or another aggregator"):
        again(Poplar1AggParam(2, ((False, True, True),)), agg_id=1)
    with pytest.raises(AggParamError, match="increasing order"):
        again(Poplar1AggParam(2, ((True, False, True), (False, True, True))))
    again(Poplar1AggParam(4, ((False, True, True, False, False),)))


@pytest.mark.parametrize("bits", [32, 64, 128])
def test_a_batch_of_one_report_walks_every_kind_of_level(bits: int) -> None:
    """A job of one report: its correction words, read from the public
    share's bytes, are a read-only view that is already contiguous (the
    8-byte words fall aligned where ``bits`` is a multiple of 32), which the
    compiled walk refused with a TypeError until it was copied like a wider
    batch's; first, inner and leaf levels, from the root and from a cache."""
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(bits)
    measurement = tuple(rng.random() < 0.5 for _ in range(bits))
    nonces, rands = _inputs(vdaf, [measurement], bits)
    sharded = batch.shard_batch(CTX, [measurement], nonces, rands)
    caches: list[IdpfCache | None] = [None, None]
    previous: list[Poplar1AggParam] = []
    for level in (0, 1, bits // 2, bits - 1):
        prefixes = tuple(sorted({measurement[: level + 1], (True,) * (level + 1)}))
        if previous:
            known = set(previous[-1].prefixes)
            prefixes = tuple(p for p in prefixes if p[: previous[-1].level + 1] in known)
        agg_param = Poplar1AggParam(level, prefixes)
        for from_cache in (False, True):
            inits, rounds, outs = _batch_round_trip(
                batch,
                agg_param,
                nonces,
                sharded.public_shares,
                sharded.input_shares,
                caches if from_cache else (None, None),
            )
            expected = _scalar_round_trip(
                vdaf,
                agg_param,
                nonces[0],
                sharded.public_shares[0],
                [s[0] for s in sharded.input_shares],
            )
            assert expected == (
                [i.verifier_shares[0] for i in inits],
                [r.verifier_shares[0] for r in rounds],
                [vdaf.encode_out_share(_row(vdaf, o, 0)) for o in outs],
            )
        caches = [i.cache for i in inits]
        previous.append(agg_param)


@pytest.mark.parametrize("bits", [1, 2, 6])
def test_an_empty_candidate_set_is_accepted_as_the_scalar_path_accepts_it(bits: int) -> None:
    """A parameter with no candidate prefix is valid (the draft's rule asks
    nothing of an empty set): at the leaf the batch raised a reshape
    ValueError for the whole batch where the scalar path (and the draft's
    reference) accepts it. At the first level, an inner level and the leaf,
    from the root and from the cache of a previous level (with candidates,
    or itself empty), every message is the scalar path's and the aggregate
    is empty."""
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(41 + bits)
    measurements = [tuple(rng.random() < 0.5 for _ in range(bits)) for _ in range(3)]
    nonces, rands = _inputs(vdaf, measurements, 41 + bits)
    sharded = batch.shard_batch(CTX, measurements, nonces, rands)
    empty = [Poplar1AggParam(level, ()) for level in sorted({0, bits // 2, bits - 1})]
    some = [Poplar1AggParam(level, (measurements[0][: level + 1],)) for level in range(bits - 1)]
    sequences = [[p] for p in empty] + [empty] + [[p, empty[-1]] for p in some]
    for sequence in sequences:
        caches: list[IdpfCache | None] = [None, None]
        for i, agg_param in enumerate(sequence):
            assert vdaf.is_valid(agg_param, sequence[:i])
            inits, rounds, outs = _batch_round_trip(
                batch, agg_param, nonces, sharded.public_shares, sharded.input_shares, caches
            )
            caches = [init.cache for init in inits]
            for r in range(len(measurements)):
                expected = _scalar_round_trip(
                    vdaf,
                    agg_param,
                    nonces[r],
                    sharded.public_shares[r],
                    [s[r] for s in sharded.input_shares],
                )
                assert expected == (
                    [init.verifier_shares[r] for init in inits],
                    [round_.verifier_shares[r] for round_ in rounds],
                    [vdaf.encode_out_share(_row(vdaf, o, r)) for o in outs],
                )
            aggregates = [batch.aggregate_batch(o) for o in outs]
            expected_counts = [
                Counter(m[: agg_param.level + 1] for m in measurements)[p]
                for p in agg_param.prefixes
            ]
            assert vdaf.unshard(agg_param, aggregates, len(measurements)) == expected_counts


@pytest.mark.parametrize("bits", [1, 3])
def test_a_batch_of_no_report(bits: int) -> None:
    """No report at the first, an inner and the leaf level, with candidates
    and without: nothing to verify, an aggregate share of zeros (the leaf
    and the decoders' checks had failed to reshape arrays of no row)."""
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    for level in range(bits):
        for prefixes in ((), ((True,) * (level + 1),)):
            agg_param = Poplar1AggParam(level, prefixes)
            inits, rounds, outs = _batch_round_trip(batch, agg_param, [], [], [[], []])
            assert [i.verifier_shares for i in inits + rounds] == [[]] * 4
            assert [batch.aggregate_batch(o) for o in outs] == [vdaf.agg_init(agg_param)] * 2
