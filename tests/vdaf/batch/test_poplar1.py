"""The batched Poplar1 path (veil.vdaf.batch.poplar1) against the scalar
path, report for report and byte for byte: sharding, both rounds of
verification at every kind of level (first, inner, leaf; from the root and
from the previous level's cache), aggregation, the official vectors,
malformed or cheating reports inside an otherwise good batch, empty
candidate sets and batches; and a property test: random reports and
random sequences of aggregation parameters, the draft's rule deciding which
run, message for message against the spec class."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

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


# -- the batch against the spec class, on random parameters and reports -------


def _every_prefix(level: int) -> list[Prefix]:
    return [tuple(bool(v >> (level - i) & 1) for i in range(level + 1)) for v in range(2 << level)]


@st.composite
def _agg_param(
    draw: st.DrawFn, bits: int, measurements: Sequence[Prefix], last: Poplar1AggParam | None
) -> Poplar1AggParam:
    """A parameter to try after ``last`` (the last one run), valid or not:
    its level most often above the last's; its prefixes none, every one,
    some of the reports', some extending the last level's, or any (prefixes
    that no report has); now and then out of order or repeated."""
    low = 0 if last is None or last.level + 1 >= bits else last.level + 1
    level = draw(st.one_of(st.integers(low, bits - 1), st.integers(0, bits - 1)), label="level")
    every = _every_prefix(level)
    held = sorted({m[: level + 1] for m in measurements})
    extending = [p for p in every if last is None or p[: last.level + 1] in last.prefixes]
    kind = draw(st.sampled_from(["held", "extending", "any", "every", "none"]), label="prefixes")
    pool = {"none": [], "every": every, "held": held, "extending": extending, "any": every}[kind]
    if kind in ("held", "extending", "any") and pool:
        prefixes = sorted(draw(st.sets(st.sampled_from(pool), min_size=1, max_size=len(pool))))
    else:
        prefixes = list(pool)
    if len(prefixes) > 1 and draw(st.integers(0, 9), label="malformed") == 0:
        prefixes = prefixes[::-1] if draw(st.booleans()) else [*prefixes, prefixes[-1]]
    return Poplar1AggParam(level, tuple(prefixes))


def _refusal(call: Any, *args: Any) -> tuple[type[Exception], str] | None:
    """The class and text of the ``AggParamError`` that ``call(*args)``
    raises, or None."""
    try:
        call(*args)
    except AggParamError as e:
        return type(e), str(e)
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), bits=st.integers(1, 5))
def test_the_batch_gives_the_spec_classes_messages_on_random_parameters(
    data: st.DataObject, bits: int
) -> None:
    """BatchPoplar1 and Poplar1 on the same reports (random measurements
    and randomness, now and then a client that cheats at one level) and
    the same sequence of aggregation parameters (valid and not: the
    draft's ``check_valid`` decides which are run, and the batch, given the
    last level's cache, refuses the others with the same error): every
    verifier share and message of both rounds, every refusal, every output
    share and both aggregate shares are the spec class's, report for
    report; the counts are the measurements'. Sub-batches and the cache
    are drawn small at times, and the walk starts from the root or from
    the cache."""
    vdaf = Poplar1(bits)
    batch = BatchPoplar1(vdaf)
    batch.walk.chunk_nodes = data.draw(st.sampled_from([1 << 18, 3]), label="chunk_nodes")
    batch.walk.cache_nodes = data.draw(st.sampled_from([1 << 12, 1, 2]), label="cache_nodes")
    ctx = data.draw(st.binary(max_size=8), label="ctx")
    key = data.draw(st.binary(min_size=32, max_size=32), label="verify key")
    count = data.draw(st.one_of(st.integers(1, 5), st.just(0)), label="reports")
    measurements = [
        data.draw(st.tuples(*[st.booleans()] * bits), label="measurement") for _ in range(count)
    ]
    nonces = [data.draw(st.binary(min_size=16, max_size=16), label="nonce") for _ in measurements]
    rands = [
        data.draw(st.binary(min_size=vdaf.RAND_SIZE, max_size=vdaf.RAND_SIZE), label="rand")
        for _ in measurements
    ]
    sharded = batch.shard_batch(ctx, measurements, nonces, rands)
    publics, shares = list(sharded.public_shares), [list(s) for s in sharded.input_shares]
    cheats: dict[int, int] = {}  # report -> the level it cheats at
    for r in range(count):
        client = vdaf
        if data.draw(st.integers(0, 4), label="cheats") == 0:
            cheats[r] = data.draw(st.integers(0, bits - 1), label="cheat level")
            client = CheatingClient(
                bits, cheats[r], data.draw(st.sampled_from([0, 2]), label="count")
            )
        public, input_shares = client.shard(ctx, measurements[r], nonces[r], rands[r])
        assert publics[r] == vdaf.encode_public_share(public) or r in cheats
        publics[r] = vdaf.encode_public_share(public)
        for j in (0, 1):
            assert shares[j][r] == vdaf.encode_input_share(input_shares[j]) or r in cheats
            shares[j][r] = vdaf.encode_input_share(input_shares[j])

    used: list[Poplar1AggParam] = []
    caches: list[IdpfCache | None] = [None, None]
    for _ in range(data.draw(st.integers(1, 4), label="parameters")):
        agg_param = data.draw(_agg_param(bits, measurements, used[-1] if used else None))
        expected = _refusal(vdaf.check_valid, agg_param, used)
        assert (expected is None) == vdaf.is_valid(agg_param, used)
        if expected is not None:
            event("refused: " + expected[0].__name__)
            # (Without a previous level, the batch has no cache and the rule
            # no previous parameter: only a malformed one is refused.)
            for j in (0, 1):
                args = (key, ctx, j, agg_param, nonces, publics, shares[j], caches[j])
                assert _refusal(batch.verify_init_batch, *args) == expected
            continue
        where = "leaf" if agg_param.level == bits - 1 else "inner"
        many = {0: "no prefix", 1: "one prefix"}.get(len(agg_param.prefixes), "prefixes")
        event(f"run: {where} level, {many}")
        if not data.draw(st.booleans(), label="from the cache"):
            caches = [None, None]
        inits = [
            batch.verify_init_batch(key, ctx, j, agg_param, nonces, publics, shares[j], caches[j])
            for j in (0, 1)
        ]
        caches = [init.cache for init in inits]
        first = batch.verifier_shares_to_message_batch(
            ctx, agg_param, [init.verifier_shares for init in inits]
        )
        rounds = [batch.verify_next_batch(ctx, init.state, first) for init in inits]
        assert all(isinstance(r, VerifyRoundBatch) for r in rounds)
        seconds = [r for r in rounds if isinstance(r, VerifyRoundBatch)]
        second = batch.verifier_shares_to_message_batch(
            ctx, agg_param, [s.verifier_shares for s in seconds]
        )
        finals = [batch.verify_next_batch(ctx, s.state, second) for s in seconds]
        outs = [o for o in finals if isinstance(o, Poplar1OutShareBatch)]
        assert len(outs) == 2

        agg_shares = [vdaf.agg_init(agg_param), vdaf.agg_init(agg_param)]
        for r in range(count):
            public = vdaf.decode_public_share(publics[r])
            states, vshares = [], []
            for j in (0, 1):
                input_share = vdaf.decode_input_share(j, shares[j][r])
                state, vshare = vdaf.verify_init(
                    key, ctx, j, agg_param, nonces[r], public, input_share
                )
                states.append(state)
                vshares.append(vshare)
            assert [i.verifier_shares[r] for i in inits] == [
                vdaf.encode_verifier_share(v) for v in vshares
            ]
            message = vdaf.verifier_shares_to_message(ctx, agg_param, vshares)
            assert first.messages[r] == vdaf.encode_verifier_message(message)
            assert first.errors[r] is None
            nexts = [vdaf.verify_next(ctx, s, message) for s in states]
            pairs = [n for n in nexts if isinstance(n, tuple)]
            assert [s.verifier_shares[r] for s in seconds] == [
                vdaf.encode_verifier_share(v) for _, v in pairs
            ]
            try:
                final = vdaf.verifier_shares_to_message(ctx, agg_param, [v for _, v in pairs])
            except VerifyError as e:
                assert cheats.get(r) == agg_param.level and agg_param.prefixes
                assert second.messages[r] is None
                assert [type(second.errors[r]), str(second.errors[r])] == [VerifyError, str(e)]
                assert [o.errors[r] for o in outs] == [second.errors[r]] * 2
                continue
            assert second.messages[r] == vdaf.encode_verifier_message(final) == b""
            assert [o.errors[r] for o in outs] == [None, None]
            for j, (state, _) in enumerate(pairs):
                out_share = vdaf.verify_next(ctx, state, final)
                assert isinstance(out_share, FieldVec)
                assert vdaf.encode_out_share(_row(vdaf, outs[j], r)) == vdaf.encode_out_share(
                    out_share
                )
                agg_shares[j] = vdaf.agg_update(agg_param, agg_shares[j], out_share)
        aggregates = [batch.aggregate_batch(o) for o in outs]
        assert [vdaf.encode_agg_share(a) for a in aggregates] == [
            vdaf.encode_agg_share(a) for a in agg_shares
        ]
        counted = Counter(
            m[: agg_param.level + 1]
            for r, m in enumerate(measurements)
            if cheats.get(r) != agg_param.level or not agg_param.prefixes
        )
        assert vdaf.unshard(agg_param, aggregates, count) == [
            counted[p] for p in agg_param.prefixes
        ]
        used.append(agg_param)
