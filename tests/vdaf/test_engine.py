"""veil.vdaf.engine: the batched engines and the draft-shaped classes behind
one interface give the same messages, report for report.

Each case shards random measurements, spoils some reports, and runs both
aggregators' rounds through `SpecEngine` (the spec classes, one report at a
time) and through the batched engine `engine_for` picks, with the same
inputs: every verifier share, message, error and aggregate share must be
the same. Poplar1 is driven with random aggregation parameters over a
batch's sequence of queries, the draft's validity rule (`is_valid`)
deciding which sequences are run.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veil.vdaf import (
    Poplar1,
    Poplar1AggParam,
    Prio3Count,
    Prio3Histogram,
    Prio3L1BoundSum,
    Prio3Sum,
    Prio3SumVec,
)
from veil.vdaf.engine import (
    Engine,
    OutShares,
    Poplar1Engine,
    Prio3Engine,
    Round,
    SpecEngine,
    engine_for,
    helper_steps,
    leader_steps,
)

CTX = b"veil engine test"

PRIO3 = {
    "count": lambda: Prio3Count(2),
    "sum": lambda: Prio3Sum(2, 13),
    "histogram": lambda: Prio3Histogram(2, 5, 2),
    "sumvec": lambda: Prio3SumVec(2, 3, 7, 2),
    "l1boundsum": lambda: Prio3L1BoundSum(2, 3, 7, 2),
}


def _measurement(kind: str, draw: Any) -> Any:
    if kind == "count":
        return draw(st.integers(0, 1))
    if kind == "sum":
        return draw(st.integers(0, 13))
    if kind == "histogram":
        return draw(st.integers(0, 4))
    if kind == "l1boundsum":  # three entries summing to at most 7
        first = draw(st.integers(0, 7))
        second = draw(st.integers(0, 7 - first))
        return [first, second, draw(st.integers(0, 7 - first - second))]
    return draw(st.lists(st.integers(0, 7), min_size=3, max_size=3))


def _spoil(data: bytes, where: int) -> bytes:
    """The bytes with one flipped: a share that fails to decode or to verify."""
    i = where % len(data)
    return data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1 :]


def _trace(
    engine: Engine,
    verify_key: bytes,
    agg_param: Any,
    nonces: list[bytes],
    public: list[bytes],
    inputs: list[list[bytes]],
) -> list[Any]:
    """Both aggregators' rounds: every share, message and error, then each
    aggregator's aggregate share of the reports both accepted."""
    steps = [
        engine.verify_init(verify_key, CTX, j, agg_param, nonces, public, inputs[j]) for j in (0, 1)
    ]
    trace: list[Any] = []
    while True:
        shares = [s.verifier_shares for s in steps]
        trace.append([shares, [[_why(e) for e in s.errors] for s in steps]])
        messages = engine.verifier_shares_to_message(CTX, agg_param, shares)
        trace.append([messages.messages, [_why(e) for e in messages.errors]])
        after = [engine.verify_next(CTX, agg_param, s, messages.messages) for s in steps]
        if isinstance(after[0], OutShares):
            break
        steps = after  # type: ignore[assignment]
    outs = [a for a in after if isinstance(a, OutShares)]
    assert len(outs) == 2
    both = sorted(set(outs[0].accepted) & set(outs[1].accepted))
    trace.append([[_why(e) for e in o.errors] for o in outs])
    agg = [engine.aggregate(agg_param, o, both) for o in outs]
    trace.append([engine.encode_agg_share(agg_param, a) for a in agg])
    trace.append(engine.merge(agg_param, agg))
    return trace


def _why(error: Exception | None) -> str | None:
    return None if error is None else type(error).__name__


def _shard(engine: Engine, measurements: list[Any]) -> tuple[list[bytes], Any]:
    nonces = [secrets.token_bytes(16) for _ in measurements]
    rand_size = engine.vdaf.RAND_SIZE  # type: ignore[attr-defined]
    rands = [secrets.token_bytes(rand_size) for _ in measurements]
    return nonces, engine.shard(CTX, measurements, nonces, rands)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(sorted(PRIO3)))
def test_prio3_batched_engine_is_the_spec_message_for_message(
    data: st.DataObject, kind: str
) -> None:
    vdaf = PRIO3[kind]()
    spec, batched = SpecEngine(vdaf), engine_for(vdaf)
    assert isinstance(batched, Prio3Engine) and batched.ROUNDS == spec.ROUNDS == 1
    n = data.draw(st.integers(0, 6))
    measurements = [_measurement(kind, data.draw) for _ in range(n)]
    nonces, sharded = _shard(spec, measurements)
    # The batched sharder is the spec's too, byte for byte.
    rands = [secrets.token_bytes(vdaf.RAND_SIZE) for _ in measurements]
    assert batched.shard(CTX, measurements, nonces, rands) == spec.shard(
        CTX, measurements, nonces, rands
    )
    public, inputs = list(sharded.public_shares), [list(s) for s in sharded.input_shares]
    for i in data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=n)) if n else []:
        j = data.draw(st.integers(0, 1))
        inputs[j][i] = _spoil(inputs[j][i], data.draw(st.integers(0, 1 << 16)))
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    assert batched.is_valid(None, []) and not batched.is_valid(None, [None])
    assert spec.is_valid(None, []) and not spec.is_valid(None, [None])
    got = _trace(batched, verify_key, None, nonces, public, inputs)
    assert got == _trace(spec, verify_key, None, nonces, public, inputs)
    assert batched.noise_modulus(None) == spec.noise_modulus(None) == vdaf.field.MODULUS


BITS = 8


def _bits(value: int, n: int) -> tuple[bool, ...]:
    """The n-bit prefix `value`, most significant bit first."""
    return tuple(bool(value >> (n - 1 - b) & 1) for b in range(n))


@st.composite
def _queries(draw: Any) -> list[Poplar1AggParam]:
    """A batch's sequence of queries: increasing levels, each with a set of
    prefixes, often extending the previous level's (valid) and sometimes
    not, or empty."""
    levels = sorted(draw(st.sets(st.integers(0, BITS - 1), min_size=1, max_size=3)))
    out: list[Poplar1AggParam] = []
    for level in levels:
        width = 1 << (level + 1)
        prefixes = sorted(draw(st.sets(st.integers(0, width - 1), max_size=4)))
        out.append(Poplar1AggParam(level, tuple(_bits(p, level + 1) for p in prefixes)))
    return out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), queries=_queries())
def test_poplar1_batched_engine_is_the_spec_message_for_message(
    data: st.DataObject, queries: list[Poplar1AggParam]
) -> None:
    vdaf = Poplar1(BITS)
    spec, batched = SpecEngine(vdaf), engine_for(vdaf)
    assert isinstance(batched, Poplar1Engine) and batched.ROUNDS == spec.ROUNDS == 2
    n = data.draw(st.integers(0, 5))
    values = [data.draw(st.integers(0, (1 << BITS) - 1)) for _ in range(n)]
    measurements = [_bits(v, BITS) for v in values]
    nonces, sharded = _shard(spec, measurements)
    public, inputs = list(sharded.public_shares), [list(s) for s in sharded.input_shares]
    for i in data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=2)) if n else []:
        inputs[1][i] = _spoil(inputs[1][i], data.draw(st.integers(0, 1 << 16)))
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    previous: list[Poplar1AggParam] = []
    for agg_param in queries:
        valid = spec.is_valid(agg_param, previous)
        assert batched.is_valid(agg_param, previous) == valid
        encoded = batched.encode_agg_param(agg_param)
        assert encoded == spec.encode_agg_param(agg_param)
        assert batched.decode_agg_param(encoded) == agg_param
        if not valid:
            continue
        got = _trace(batched, verify_key, agg_param, nonces, public, inputs)
        assert got == _trace(spec, verify_key, agg_param, nonces, public, inputs)
        # The counts are the measurements' at the level, where nothing was spoiled.
        if n and not any(inputs[1][i] != sharded.input_shares[1][i] for i in range(n)):
            counts = got[-1]
            level = agg_param.level
            want = [
                sum(1 for v in values if _bits(v >> (BITS - 1 - level), level + 1) == p)
                for p in agg_param.prefixes
            ]
            assert counts == want
        modulus = batched.noise_modulus(agg_param)
        assert modulus == spec.noise_modulus(agg_param)
        assert modulus == vdaf.idpf.current_field(agg_param.level).MODULUS
        previous.append(agg_param)


@pytest.mark.parametrize("level", [0, 3, BITS - 1])
def test_poplar1_empty_candidate_set_is_taken_by_both(level: int) -> None:
    """The draft's reference and the spec path accept a query with no
    prefix; so does the batched engine, with the same (empty) outcome."""
    vdaf = Poplar1(BITS)
    spec, batched = SpecEngine(vdaf), engine_for(vdaf)
    nonces, sharded = _shard(spec, [tuple([True] * BITS), tuple([False] * BITS)])
    public, inputs = list(sharded.public_shares), [list(s) for s in sharded.input_shares]
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    agg_param = Poplar1AggParam(level, ())
    got = _trace(batched, verify_key, agg_param, nonces, public, inputs)
    assert got == _trace(spec, verify_key, agg_param, nonces, public, inputs)
    assert got[-1] == []


def test_a_prio3_batch_aggregated_once_and_poplar1_parameters_decoded() -> None:
    count = engine_for(Prio3Count(2))
    assert count.decode_agg_param(b"") is None
    with pytest.raises(Exception, match="no aggregation parameter"):
        count.decode_agg_param(b"\x00")
    poplar = engine_for(Poplar1(BITS))
    with pytest.raises(Exception):  # noqa: B017 (the codec's own error type)
        poplar.decode_agg_param(b"\x00")


def _ping_pong(
    engine: Engine,
    verify_key: bytes,
    agg_param: Any,
    nonces: list[bytes],
    public: list[bytes],
    inputs: list[list[bytes]],
) -> tuple[list[int], list[int]]:
    """The rounds as the two aggregators run them over veil's wire: the rows
    each accepted and the merged aggregate of the rows both accepted."""
    lead = engine.verify_init(verify_key, CTX, 0, agg_param, nonces, public, inputs[0])
    help_ = engine.verify_init(verify_key, CTX, 1, agg_param, nonces, public, inputs[1])
    first = [lead.verifier_shares]
    step, messages = helper_steps(engine, CTX, agg_param, help_, first)
    helper_next = step.verifier_shares if isinstance(step, Round) else None
    out_leader, sent = leader_steps(engine, CTX, agg_param, lead, messages.messages, helper_next)
    if isinstance(step, Round):
        step, _ = helper_steps(engine, CTX, agg_param, help_, first + sent)
    assert isinstance(step, OutShares)
    assert out_leader.accepted == step.accepted
    rows = out_leader.accepted
    shares = [engine.aggregate(agg_param, o, rows) for o in (out_leader, step)]
    return rows, engine.merge(agg_param, shares)


@pytest.mark.parametrize("kind", [*sorted(PRIO3), "poplar1"])
def test_the_rounds_between_two_aggregators_give_the_spec_result(kind: str) -> None:
    vdaf: Any = Poplar1(BITS) if kind == "poplar1" else PRIO3[kind]()
    spec, batched = SpecEngine(vdaf), engine_for(vdaf)
    if kind == "poplar1":
        measurements: list[Any] = [_bits(v, BITS) for v in (3, 3, 200, 7, 9)]
        agg_param: Any = Poplar1AggParam(2, (_bits(0, 3), _bits(6, 3), _bits(7, 3)))
    else:
        measurements = {
            "count": [1, 0, 1, 1, 0],
            "sum": [7, 13, 0, 2, 5],
            "histogram": [3, 0, 4, 3, 1],
            "sumvec": [[1, 2, 3], [7, 0, 0], [0, 0, 0], [2, 2, 2], [5, 6, 7]],
            "l1boundsum": [[1, 2, 3], [7, 0, 0], [0, 0, 0], [2, 2, 2], [0, 6, 1]],
        }[kind]
        agg_param = None
    nonces, sharded = _shard(spec, measurements)
    public, inputs = list(sharded.public_shares), [list(s) for s in sharded.input_shares]
    inputs[0][1] = b"\x00" * len(inputs[0][1])  # undecodable or failing, at the leader
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    got = _ping_pong(batched, verify_key, agg_param, nonces, public, inputs)
    assert got == _ping_pong(spec, verify_key, agg_param, nonces, public, inputs)
    assert 1 not in got[0] and got[0] == [0, 2, 3, 4]
    assert got[1] == _trace(spec, verify_key, agg_param, nonces, public, inputs)[-1]
