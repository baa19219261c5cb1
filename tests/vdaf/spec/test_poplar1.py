"""Poplar1 (veil.vdaf.spec.poplar1): heavy hitters found level by level,
clients that cheat, aggregation parameters that break the draft's rules,
and every decoder against malformed bytes. The official vectors are in
test_vectors.py."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.vdaf import CheatingClient
from veil.vdaf import CodecError, VerifyError
from veil.vdaf.errors import AggParamError, AggParamSequenceError, TooManyPrefixes
from veil.vdaf.spec.idpf import CorrectionWord, PublicShare
from veil.vdaf.spec.poplar1 import (
    FieldVec,
    Poplar1,
    Poplar1AggParam,
    Poplar1InputShare,
)

CTX = b"veil poplar1 test"
KEY = bytes(range(32))

Prefix = tuple[bool, ...]
Report = tuple[bytes, PublicShare, list[Poplar1InputShare]]


def shard(vdaf: Poplar1, measurement: Prefix, rng: random.Random) -> Report:
    nonce = rng.randbytes(vdaf.NONCE_SIZE)
    public_share, input_shares = vdaf.shard(CTX, measurement, nonce, rng.randbytes(vdaf.RAND_SIZE))
    return nonce, public_share, input_shares


def verify(vdaf: Poplar1, agg_param: Poplar1AggParam, report: Report) -> list[FieldVec]:
    """Both aggregators' two rounds; the output shares, or VerifyError."""
    nonce, public_share, input_shares = report
    inits = [
        vdaf.verify_init(KEY, CTX, j, agg_param, nonce, public_share, input_shares[j])
        for j in (0, 1)
    ]
    message = vdaf.verifier_shares_to_message(CTX, agg_param, [share for _, share in inits])
    seconds = [vdaf.verify_next(CTX, state, message) for state, _ in inits]
    assert all(isinstance(s, tuple) for s in seconds)
    pairs = [s for s in seconds if isinstance(s, tuple)]
    final = vdaf.verifier_shares_to_message(CTX, agg_param, [share for _, share in pairs])
    outs = [vdaf.verify_next(CTX, state, final) for state, _ in pairs]
    return [o for o in outs if isinstance(o, FieldVec)]


def counts(vdaf: Poplar1, agg_param: Poplar1AggParam, reports: Sequence[Report]) -> list[int]:
    agg = [vdaf.agg_init(agg_param) for _ in (0, 1)]
    for report in reports:
        for j, out in enumerate(verify(vdaf, agg_param, report)):
            agg[j] = vdaf.agg_update(agg_param, agg[j], out)
    encoded = [vdaf.encode_agg_share(a) for a in agg]
    decoded = [vdaf.decode_agg_share(agg_param, e) for e in encoded]
    return vdaf.unshard(agg_param, decoded, len(reports))


def test_heavy_hitters_level_by_level() -> None:
    """The draft's protocol: extend each prefix counted at least T times."""
    rng = random.Random(3)
    vdaf = Poplar1(8)
    strings = [b"a"] * 5 + [b"q"] * 4 + [b"z"] * 2 + [bytes([i]) for i in range(3)]
    reports = [shard(vdaf, vdaf.measurement_from_bytes(s), rng) for s in strings]
    threshold = 3
    previous: list[Poplar1AggParam] = []
    candidates: list[Prefix] = [(False,), (True,)]
    for level in range(8):
        agg_param = Poplar1AggParam(level, tuple(sorted(candidates)))
        assert vdaf.is_valid(agg_param, previous)
        result = counts(vdaf, agg_param, reports)
        truth = Counter(vdaf.measurement_from_bytes(s)[: level + 1] for s in strings)
        assert result == [truth[p] for p in agg_param.prefixes]
        previous.append(agg_param)
        survivors = [p for p, c in zip(agg_param.prefixes, result, strict=True) if c >= threshold]
        candidates = [(*p, b) for p in survivors for b in (False, True)]
    heavy = [vdaf.prefix_to_bytes(p) for p, c in zip(agg_param.prefixes, result, strict=True)]
    assert sorted(h for h, c in zip(heavy, result, strict=True) if c >= threshold) == [b"a", b"q"]


# -- clients that cheat ------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "count"),
    [(1, 2), (0, 0), (2, 5), (2, -1), (3, 2), (3, 0)],
    ids=["count2", "count0", "count5", "count-1", "leaf-count2", "leaf-count0"],
)
def test_a_client_not_one_hot_at_a_level_is_rejected_there(level: int, count: int) -> None:
    rng = random.Random(level * 100 + count)
    honest = Poplar1(4)
    cheat = CheatingClient(4, level, count)
    measurement = (True, False, True, True)
    report = shard(cheat, measurement, rng)
    # Every level but the one it cheats at verifies.
    for other in range(4):
        agg_param = Poplar1AggParam(other, tuple(sorted({measurement[: other + 1]})))
        if other == level:
            with pytest.raises(VerifyError, match="not one-hot"):
                verify(honest, agg_param, report)
        else:
            assert [sum(o) for o in zip(*verify(honest, agg_param, report), strict=True)]


@given(
    seed=st.integers(0, 2**32),
    level=st.integers(0, 3),
    word=st.integers(0, 3),
    part=st.sampled_from(["seed", "ctrl", "payload"]),
    flip=st.integers(0, 255),
)
def test_a_tampered_public_share_is_caught_or_harmless(
    seed: int, level: int, word: int, part: str, flip: int
) -> None:
    """Whatever a correction word is changed to, a level's counts over all
    its nodes either verify as a vector of 0s with at most one 1, or the
    sketch rejects the report."""
    rng = random.Random(seed)
    vdaf = Poplar1(4)
    measurement = tuple(rng.random() < 0.5 for _ in range(4))
    nonce, public_share, input_shares = shard(vdaf, measurement, rng)
    cw = public_share[word]
    if part == "seed":
        cw = cw._replace(seed=bytes([cw.seed[0] ^ (flip | 1)]) + cw.seed[1:])
    elif part == "ctrl":
        cw = cw._replace(ctrl=(not cw.ctrl[0], cw.ctrl[1]) if flip & 1 else (cw.ctrl[0], True))
    else:
        field = vdaf.idpf.current_field(word)
        cw = CorrectionWord(cw.seed, cw.ctrl, [(cw.payload[0] + flip + 1) % field.MODULUS, 0])
    tampered = [*public_share[:word], cw, *public_share[word + 1 :]]
    agg_param = Poplar1AggParam(level, tuple(product((False, True), repeat=level + 1)))
    try:
        outs = verify(vdaf, agg_param, (nonce, tampered, input_shares))
    except VerifyError:
        return
    total = vdaf.merge(agg_param, outs)
    assert sorted(total)[:-1] == [0] * (len(total) - 1) and total[-1] in (0, 1)


def test_verify_next_refuses_a_message_that_does_not_fit_the_step() -> None:
    rng = random.Random(5)
    vdaf = Poplar1(4)
    nonce, public_share, input_shares = shard(vdaf, (True,) * 4, rng)
    agg_param = Poplar1AggParam(1, ((True, True),))
    state, share = vdaf.verify_init(KEY, CTX, 0, agg_param, nonce, public_share, input_shares[0])
    with pytest.raises(VerifyError, match="3-element sketch"):
        vdaf.verify_next(CTX, state, None)
    with pytest.raises(VerifyError, match="3-element sketch"):
        vdaf.verify_next(CTX, state, FieldVec(vdaf.idpf.field_inner, [1, 2]))
    second = vdaf.verify_next(CTX, state, share)
    assert isinstance(second, tuple)
    with pytest.raises(VerifyError, match="empty"):
        vdaf.verify_next(CTX, second[0], second[1])
    with pytest.raises(VerifyError, match="different rounds"):
        vdaf.verifier_shares_to_message(CTX, agg_param, [share, second[1]])
    with pytest.raises(VerifyError, match="step"):
        vdaf.verify_next(CTX, state._replace(step=b"other"), share)


def test_shard_refuses_bad_measurements_and_sizes() -> None:
    vdaf = Poplar1(8)
    nonce, rand = bytes(16), bytes(vdaf.RAND_SIZE)
    for bad in [(True,) * 7, (True,) * 9, (1,) * 8, "abcdefgh"]:
        with pytest.raises(ValueError, match="8 bools"):
            vdaf.shard(CTX, bad, nonce, rand)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nonce"):
        vdaf.shard(CTX, (True,) * 8, bytes(15), rand)
    with pytest.raises(ValueError, match="rand"):
        vdaf.shard(CTX, (True,) * 8, nonce, rand[1:])
    with pytest.raises(ValueError, match="Poplar1\\(8\\) measurement is 8 bits"):
        vdaf.measurement_from_bytes(b"ab")


# -- aggregation parameters ----------------------------------------------


def _prefixes(strings: Sequence[str]) -> tuple[Prefix, ...]:
    return tuple(tuple(c == "1" for c in s) for s in strings)


def test_agg_param_codec_matches_the_drafts_layout() -> None:
    vdaf = Poplar1(16)
    agg_param = Poplar1AggParam(9, _prefixes(["0000000001", "1100000000"]))
    encoded = vdaf.encode_agg_param(agg_param)
    assert encoded.hex() == "0009" + "00000002" + "0040" + "c000"
    assert vdaf.decode_agg_param(encoded) == agg_param


@given(
    bits=st.integers(1, 24),
    data=st.data(),
)
def test_agg_params_round_trip(bits: int, data: st.DataObject) -> None:
    vdaf = Poplar1(bits)
    level = data.draw(st.integers(0, bits - 1))
    raw = data.draw(st.sets(st.integers(0, 2 ** (level + 1) - 1), max_size=20))
    prefixes = tuple(
        tuple(bool(v >> (level - i) & 1) for i in range(level + 1)) for v in sorted(raw)
    )
    agg_param = Poplar1AggParam(level, prefixes)
    assert vdaf.decode_agg_param(vdaf.encode_agg_param(agg_param)) == agg_param


def test_malformed_agg_params_are_refused() -> None:
    vdaf = Poplar1(16, max_prefixes=4)
    with pytest.raises(CodecError, match="fewer than 6"):
        vdaf.decode_agg_param(b"\x00\x01\x00\x00")
    with pytest.raises(AggParamError, match="level must be in"):
        vdaf.decode_agg_param(b"\x00\x10" + b"\x00\x00\x00\x01" + b"\x00\x00\x00")
    # A count far beyond the bound is refused before anything is read.
    with pytest.raises(TooManyPrefixes, match="at most 4"):
        vdaf.decode_agg_param(b"\x00\x03" + b"\xff\xff\xff\xff")
    with pytest.raises(CodecError, match="expected 8"):
        vdaf.decode_agg_param(b"\x00\x03" + b"\x00\x00\x00\x02" + b"\x00")
    with pytest.raises(CodecError, match="expected 8"):
        vdaf.decode_agg_param(b"\x00\x03" + b"\x00\x00\x00\x02" + b"\x00\x10\x00")
    with pytest.raises(CodecError, match="padding bits"):
        vdaf.decode_agg_param(b"\x00\x03" + b"\x00\x00\x00\x01" + b"\x01")
    # Out of order, and repeated.
    with pytest.raises(AggParamError, match="increasing order"):
        vdaf.decode_agg_param(b"\x00\x00" + b"\x00\x00\x00\x02" + b"\x80\x00")
    with pytest.raises(AggParamError, match="increasing order"):
        vdaf.decode_agg_param(b"\x00\x00" + b"\x00\x00\x00\x02" + b"\x80\x80")


def test_too_many_prefixes_are_refused_everywhere() -> None:
    vdaf = Poplar1(8, max_prefixes=3)
    agg_param = Poplar1AggParam(1, _prefixes(["00", "01", "10", "11"]))
    with pytest.raises(TooManyPrefixes):
        vdaf.check_agg_param(agg_param)
    with pytest.raises(TooManyPrefixes):
        vdaf.encode_agg_param(agg_param)
    rng = random.Random(1)
    nonce, public_share, input_shares = shard(vdaf, (True,) * 8, rng)
    with pytest.raises(TooManyPrefixes):
        vdaf.verify_init(KEY, CTX, 0, agg_param, nonce, public_share, input_shares[0])
    assert not vdaf.is_valid(agg_param, [])
    with pytest.raises(ValueError, match="max_prefixes"):
        Poplar1(8, max_prefixes=0)


@pytest.mark.parametrize(
    ("agg_param", "message"),
    [
        (Poplar1AggParam(8, _prefixes(["000000000"])), "level must be in"),
        (Poplar1AggParam(-1, ()), "level must be in"),
        (Poplar1AggParam(1, _prefixes(["0"])), "2 bools"),
        (Poplar1AggParam(1, ((True, 2),)), "2 bools"),  # type: ignore[arg-type]
        (Poplar1AggParam(1, _prefixes(["01", "00"])), "increasing order"),
        (Poplar1AggParam(1, _prefixes(["01", "01"])), "increasing order"),
    ],
)
def test_verify_init_refuses_a_malformed_agg_param(
    agg_param: Poplar1AggParam, message: str
) -> None:
    vdaf = Poplar1(8)
    nonce, public_share, input_shares = shard(vdaf, (True,) * 8, random.Random(2))
    with pytest.raises(AggParamError, match=message):
        vdaf.verify_init(KEY, CTX, 0, agg_param, nonce, public_share, input_shares[0])


def test_the_validity_rule_across_a_sequence() -> None:
    vdaf = Poplar1(8)
    first = Poplar1AggParam(1, _prefixes(["01", "10"]))
    vdaf.check_valid(first, [])
    good = Poplar1AggParam(3, _prefixes(["0100", "0111", "1011"]))
    vdaf.check_valid(good, [first])
    assert vdaf.is_valid(good, [first])
    # The same level again (a second look at the same reports), a lower
    # level, and a prefix outside the previous level's.
    for bad, message in [
        (Poplar1AggParam(1, _prefixes(["01"])), "levels must increase"),
        (Poplar1AggParam(0, _prefixes(["0"])), "levels must increase"),
        (Poplar1AggParam(2, _prefixes(["010", "110"])), "does not extend"),
    ]:
        with pytest.raises(AggParamSequenceError, match=message):
            vdaf.check_valid(bad, [first])
        assert not vdaf.is_valid(bad, [first])
    # Only the last parameter counts, as in the draft.
    assert vdaf.is_valid(Poplar1AggParam(5, _prefixes(["010011"])), [first, good])


@given(
    level=st.integers(0, 5),
    last_level=st.integers(0, 5),
    last=st.sets(st.integers(0, 63), max_size=6),
    new=st.sets(st.integers(0, 63), max_size=6),
)
def test_validity_rule_agrees_with_its_statement(
    level: int, last_level: int, last: set[int], new: set[int]
) -> None:
    """Valid exactly when the level rises and every new prefix's ancestor at
    the last level was counted there (values as integers of their bits)."""
    vdaf = Poplar1(6)

    def as_prefixes(values: set[int], at: int) -> tuple[Prefix, ...]:
        kept = sorted({v >> (5 - at) for v in values})
        return tuple(tuple(bool(v >> (at - i) & 1) for i in range(at + 1)) for v in kept)

    previous = Poplar1AggParam(last_level, as_prefixes(last, last_level))
    agg_param = Poplar1AggParam(level, as_prefixes(new, level))
    ancestors = {p[: last_level + 1] for p in agg_param.prefixes}
    expected = level > last_level and ancestors <= set(previous.prefixes)
    assert vdaf.is_valid(agg_param, [previous]) == expected


# -- the other messages' codecs ----------------------------------------------


def test_input_shares_of_wrong_length_or_unreduced_are_refused() -> None:
    vdaf = Poplar1(8)
    _, _, input_shares = shard(vdaf, (False,) * 8, random.Random(4))
    encoded = vdaf.encode_input_share(input_shares[1])
    assert len(encoded) == vdaf.input_share_size(1)
    assert vdaf.decode_input_share(1, encoded) == input_shares[1]
    for bad in (encoded[:-1], encoded + b"\x00", b""):
        with pytest.raises(CodecError, match="input share"):
            vdaf.decode_input_share(1, bad)
    unreduced_inner = encoded[:48] + b"\xff" * 8 + encoded[56:]  # after key and seed
    with pytest.raises(CodecError, match="Field64"):
        vdaf.decode_input_share(0, unreduced_inner)
    with pytest.raises(CodecError, match="Field255"):
        vdaf.decode_input_share(0, encoded[:-32] + b"\xff" * 32)
    with pytest.raises(ValueError, match="agg_id"):
        vdaf.decode_input_share(2, encoded)


def test_sketch_messages_of_wrong_length_are_refused() -> None:
    vdaf = Poplar1(4)
    nonce, public_share, input_shares = shard(vdaf, (True,) * 4, random.Random(6))
    for level, size in ((1, 8), (3, 32)):
        agg_param = Poplar1AggParam(level, ((True,) * (level + 1),))
        state, share = vdaf.verify_init(
            KEY, CTX, 1, agg_param, nonce, public_share, input_shares[1]
        )
        encoded = vdaf.encode_verifier_share(share)
        assert len(encoded) == 3 * size
        assert vdaf.decode_verifier_share(state, encoded) == share
        for bad in (encoded[:-1], encoded + b"\x00", encoded[:size]):
            with pytest.raises(CodecError, match="verifier share"):
                vdaf.decode_verifier_share(state, bad)
            with pytest.raises(CodecError, match="verifier message"):
                vdaf.decode_verifier_message(state, bad)
        second = vdaf.verify_next(CTX, state, share)
        assert isinstance(second, tuple)
        with pytest.raises(CodecError, match="empty"):
            vdaf.decode_verifier_message(second[0], b"\x00")
        with pytest.raises(CodecError, match="verifier share"):
            vdaf.decode_verifier_share(second[0], encoded)
        with pytest.raises(CodecError, match="aggregate share"):
            vdaf.decode_agg_share(agg_param, b"\x00" * (size + 1))
        with pytest.raises(CodecError, match="output share"):
            vdaf.decode_out_share(agg_param, b"")
    with pytest.raises(TypeError, match="FieldVec"):
        vdaf.encode_agg_share([1, 2])  # type: ignore[arg-type]
