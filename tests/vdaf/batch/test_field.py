"""Vectorised field arithmetic (veil.vdaf.batch.field) and its compiled
kernels against Python ints and the NumPy forms they replace (the batched
XOF is in test_xof.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.vdaf import Field64, Field128
from veil.vdaf.batch.field import VecField, VecField64, VecField128, vec_field
from veil.vdaf.batch.kernels import kernels

FIELDS = [VecField64, VecField128]


def _elements(p: int) -> st.SearchStrategy[int]:
    # Uniform values plus the places where carries and reductions turn.
    edges = [0, 1, 2, p - 1, p - 2, 2**32 - 1, 2**32, 2**63, (p - 1) // 2, 2**64 % p]
    edges += [2**96 % p, (2**128 - 1) % p, p - 2**32]
    return st.one_of(st.integers(0, p - 1), st.sampled_from([e % p for e in edges]))


def _vectors(p: int) -> st.SearchStrategy[tuple[list[int], list[int]]]:
    return st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.lists(_elements(p), min_size=n, max_size=n),
            st.lists(_elements(p), min_size=n, max_size=n),
        )
    )


@pytest.mark.parametrize("vf", FIELDS, ids=lambda f: f.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_arithmetic_matches_ints(vf: type[VecField], data: st.DataObject) -> None:
    p = vf.MODULUS
    xs, ys = data.draw(_vectors(p))
    a, b = vf.from_ints(xs), vf.from_ints(ys)
    assert vf.to_ints(vf.add(a, b)) == [(x + y) % p for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.sub(a, b)) == [(x - y) % p for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.neg(a)) == [-x % p for x in xs]
    assert vf.to_ints(vf.mul(a, b)) == [x * y % p for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.sum(a)) == sum(xs) % p
    assert vf.to_ints(vf.dot(a, b)) == sum(x * y for x, y in zip(xs, ys, strict=True)) % p
    assert vf.to_ints(vf.inv(a)) == [pow(x, -1, p) if x else 0 for x in xs]
    assert vf.eq(a, b).tolist() == [x == y for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.pow(a, 5)) == [pow(x, 5, p) for x in xs]


@pytest.mark.parametrize("vf", FIELDS, ids=lambda f: f.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_dot_consts_matches_ints(vf: type[VecField], data: st.DataObject) -> None:
    """Fixed weights, signed, few or many, small (Field128's limb by limb
    path: their absolute sum below 2^28) or not, on extreme elements."""
    p = vf.MODULUS
    n = data.draw(st.sampled_from([1, 7, 63, 64, 808, 3000]), label="length")
    top = data.draw(st.sampled_from([1, 255, 2**20, 2**40, p - 1]), label="largest weight")
    weights = data.draw(st.lists(st.integers(-top, top), min_size=n, max_size=n), label="weights")
    rows = [data.draw(st.lists(_elements(p), min_size=n, max_size=n)) for _ in range(2)]
    got = vf.to_ints(vf.dot_consts(vf.from_ints(rows), weights))
    assert got == [sum(x * w for x, w in zip(r, weights, strict=True)) % p for r in rows]


@pytest.mark.parametrize("n", [64, 808, 3000])
@pytest.mark.parametrize("total", [2**28 - 1, 2**28, 2**31, 2**34])
@pytest.mark.parametrize("sign", [1, -1])
def test_dot_consts_at_the_limb_path_bound(n: int, total: int, sign: int) -> None:
    """Weights of one sign summing to about ``total`` in size against elements
    whose limbs are all at their largest (2^128 - 1, weakly reduced): just
    inside the limb by limb path's bound and beyond it, where it would wrap."""
    p = VecField128.MODULUS
    weights = [sign * (total // n)] * n
    rows = [[2**128 - 1] * n, [p - 1] * n]
    got = VecField128.to_ints(VecField128.dot_consts(VecField128.from_ints(rows), weights))
    assert got == [sum(x * w for x, w in zip(r, weights, strict=True)) % p for r in rows]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_field128_weakly_reduced_inputs(data: st.DataObject) -> None:
    """Results of Field128 operations may lie in [p, 2^128); every operation
    must accept such inputs and every output boundary must reduce them."""
    p = VecField128.MODULUS
    xs, ys = data.draw(_vectors(p))
    weak = [x + p if x + p < 2**128 else x for x in xs]
    limbs = np.stack([np.array([(w >> (32 * i)) & 0xFFFFFFFF for w in weak]) for i in range(4)])
    a, b = limbs.astype(np.int64), VecField128.from_ints(ys)
    vf = VecField128
    assert vf.to_ints(vf.mul(a, b)) == [x * y % p for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.add(a, a)) == [2 * x % p for x in xs]
    assert vf.to_ints(vf.sub(b, a)) == [(y - x) % p for x, y in zip(xs, ys, strict=True)]
    assert vf.to_ints(vf.sum(a)) == sum(xs) % p
    assert vf.is_zero(a).tolist() == [x == 0 for x in xs]
    encoded = vf.encode(a[:, None, :])
    assert encoded.tobytes() == Field128.encode_vec(xs)


@pytest.mark.parametrize("vf", FIELDS, ids=lambda f: f.__name__)
@settings(max_examples=30, deadline=None)
@given(raw=st.binary(min_size=0, max_size=8 * 16))
def test_decode_flags_unreduced(vf: type[VecField], raw: bytes) -> None:
    size = vf.ENCODED_SIZE
    raw = raw[: len(raw) - len(raw) % size]
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(1, len(raw))
    vec, ok = vf.decode(rows)
    ints = [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)]
    assert ok.tolist() == [[x < vf.MODULUS for x in ints]]
    good = [x for x in ints if x < vf.MODULUS]
    assert [x for x, k in zip(vf.to_ints(vec)[0], ok[0], strict=True) if k] == good
    if all(x < vf.MODULUS for x in ints):
        assert vf.encode(vec).tobytes() == raw


def _limbs(values: list[list[int]]) -> np.ndarray[Any, Any]:
    """Field128 limb layout of any values below 2^128 (reduced or not)."""
    obj = np.array(values, dtype=object)
    return np.stack([((obj >> (32 * i)) & 0xFFFFFFFF).astype(np.int64) for i in range(4)])


def _weak(p: int) -> st.SearchStrategy[int]:
    # Anything a Field128 array may hold: [0, 2^128), with the edges.
    return st.one_of(
        _elements(p),
        st.integers(p, 2**128 - 1),
        st.sampled_from([p, p + 1, 2**128 - 1, 2**128 - 2**32]),
        st.just(0),
    )


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_field128_kernels_on_any_limbs(data: st.DataObject) -> None:
    """The compiled kernels on weakly reduced inputs, with broadcasting,
    and the row-by-matrix product with zero entries skipped."""
    p = VecField128.MODULUS
    vf = VecField128
    k = data.draw(st.integers(1, 9))
    j = data.draw(st.integers(1, 7))
    rows = data.draw(st.integers(1, 5))
    matrix = [[data.draw(_weak(p)) for _ in range(j)] for _ in range(k)]
    xs = [[data.draw(_weak(p)) for _ in range(k)] for _ in range(rows)]
    # Small entries (u and p - u) take their own path in the kernel.
    small = st.one_of(st.integers(0, 2**31 + 1), st.integers(p - 2**31 - 1, p - 1))
    xs = [[v if data.draw(st.booleans()) else data.draw(small) for v in r] for r in xs]
    x, m = _limbs(xs), _limbs(matrix)
    out = np.empty((4, rows, j), dtype=np.int64)
    kernels().matvec128(x, m, out)
    assert ((out >= 0) & (out < 2**32)).all()
    want = [[sum(r[i] * matrix[i][c] for i in range(k)) % p for c in range(j)] for r in xs]
    assert vf.to_ints(out) == want
    # (rows, k) against one broadcast (k,) vector.
    ys = [data.draw(_weak(p)) for _ in range(k)]
    y = _limbs([ys])[:, 0]
    pairs = [list(zip(r, ys, strict=True)) for r in xs]
    assert vf.to_ints(vf.mul(x, y)) == [[a * b % p for a, b in row] for row in pairs]
    assert vf.to_ints(vf.sub(x, y)) == [[(a - b) % p for a, b in row] for row in pairs]
    assert vf.to_ints(vf.add(x, y)) == [[(a + b) % p for a, b in row] for row in pairs]
    assert vf.to_ints(vf.dot(x, y)) == [sum(a * b for a, b in row) % p for row in pairs]
    cols = vf.dot(x, x[:, :, :1], axis=-2)  # along the rows
    assert vf.to_ints(cols) == [sum(xs[r][c] * xs[r][0] for r in range(rows)) % p for c in range(k)]


def test_vec_field_lookup() -> None:
    assert vec_field(Field64) is VecField64
    assert vec_field(Field128) is VecField128


@settings(max_examples=40, deadline=None)
@given(st.lists(_elements(Field64.MODULUS), max_size=30))
def test_field64_inv_each(values: list[int]) -> None:
    p = Field64.MODULUS
    got = VecField64.to_ints(VecField64.inv_each(VecField64.from_ints(values)))
    assert got == [pow(v, -1, p) if v else 0 for v in values]
    if len(values) >= 6:
        square = VecField64.from_ints(values[:6]).reshape(2, 3)
        assert VecField64.to_ints(VecField64.inv_each(square)) == [
            [pow(v, -1, p) if v else 0 for v in values[r * 3 : r * 3 + 3]] for r in range(2)
        ]


def test_field128_codec_compiled_matches_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled Field128 codec against the NumPy form it replaces: the
    same limbs and mask from any bytes (values at and above p included), the
    same encoding of weakly reduced limbs."""
    import veil.vdaf.batch.field as bf

    p = Field128.MODULUS
    values = [0, 1, p - 1, p, p + 1, 2**128 - 1, 2**127, 28 * 2**64]
    raw = np.frombuffer(b"".join(v.to_bytes(16, "little") for v in values * 2), dtype=np.uint8)
    raw = raw.reshape(2, -1)
    limbs, ok = VecField128.decode(raw)
    monkeypatch.setattr(bf, "_LITTLE_ENDIAN", False)
    want_limbs, want_ok = VecField128.decode(raw)
    want_bytes = VecField128.encode(want_limbs)
    monkeypatch.setattr(bf, "_LITTLE_ENDIAN", True)
    assert (limbs == want_limbs).all() and (ok == want_ok).all()
    assert ok.tolist() == [[v < p for v in values]] * 2
    assert VecField128.encode(limbs).tobytes() == want_bytes.tobytes()


@pytest.mark.parametrize("shares", [[1, 0, 1, 1, 0], [3, 2**100, 5, 0, 7]])
def test_chunked_wires_compiled_match_numpy(
    monkeypatch: pytest.MonkeyPatch, shares: list[int]
) -> None:
    """The compiled range-check wires give the same limbs as the NumPy form,
    on bits (the prover) and on arbitrary shares (the verifiers)."""
    import veil.vdaf.batch.circuits as bc
    from veil.vdaf.batch.circuits import batch_circuit
    from veil.vdaf.spec.prio3 import Prio3SumVec

    circuit = batch_circuit(Prio3SumVec(2, 5, 1, 2).flp.valid)
    meas = VecField128.from_ints([shares, shares[::-1]])
    r = VecField128.from_ints([[2**127 + 5, 3, 11], [7, 2**90, 1]])
    compiled = circuit._bit_check_wires(meas, r, 2)  # type: ignore[attr-defined]
    monkeypatch.setattr(bc, "VecField128", None)
    assert (compiled == circuit._bit_check_wires(meas, r, 2)).all()  # type: ignore[attr-defined]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_inverse_differences_compiled_match_numpy(data: st.DataObject) -> None:
    """The compiled descent of the query's inverse differences gives the
    NumPy form's limbs, which are 1 / (t - w^i), or all zero for a point t
    on the roots (t^D = 1)."""
    import veil.vdaf.batch.flp as bflp

    p = VecField128.MODULUS
    domain = data.draw(st.sampled_from([2, 4, 32]))
    w = Field128.root_of_unity(domain)
    nodes = [pow(w, i, p) for i in range(domain)]
    points = data.draw(st.lists(st.one_of(_elements(p), st.sampled_from(nodes)), min_size=1))
    root_levels = [
        VecField128.from_ints(nodes[:: 1 << lvl][: domain >> lvl])
        for lvl in range(domain.bit_length() - 1)
    ]
    t = VecField128.from_ints(points)
    compiled, pows = bflp._inverse_differences(VecField128, t, root_levels)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bflp, "VecField128", None)
        numpy_form, _ = bflp._inverse_differences(VecField128, t, root_levels)
    assert compiled.shape == numpy_form.shape == (4, len(points), domain)
    assert (compiled == numpy_form).all()
    assert VecField128.to_ints(pows[-1]) == [pow(x, domain, p) for x in points]
    assert VecField128.to_ints(compiled) == [
        [0] * domain if pow(x, domain, p) == 1 else [pow(x - u, -1, p) for u in nodes]
        for x in points
    ]


@settings(max_examples=40, deadline=None)
@given(values=st.lists(_elements(VecField128.MODULUS), max_size=30))
def test_field128_inverse_of_each(values: list[int]) -> None:
    """The compiled Montgomery's trick: each element's inverse, zero to
    zero, also for zero held as p (a weakly reduced product's form), in a
    2-D array of any layout."""
    p = VecField128.MODULUS
    a = VecField128.from_ints([values, values[::-1]])
    want = [[pow(x, -1, p) if x else 0 for x in row] for row in ([values, values[::-1]])]
    assert VecField128.to_ints(VecField128.inv_each(a)) == want
    assert VecField128.to_ints(VecField128.inv_each(a[:, :, ::-1])) == [r[::-1] for r in want]
    held_as_p = np.array([[1], [0], [0xFFFFFFE4], [0xFFFFFFFF]], dtype=np.int64)
    assert VecField128.to_ints(VecField128.inv_each(held_as_p)) == [0]
