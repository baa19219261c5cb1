"""NTT, Lagrange-basis evaluation and prefix extension against direct
polynomial arithmetic on Python integers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from veil.vdaf import Field, Field64, Field128
from veil.vdaf.spec.poly import LagrangeEvaluator, PrefixExtension, batch_inverse, inv_ntt, ntt


def horner(p: int, coeffs: list[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % p
    return acc


@pytest.mark.parametrize("field", [Field64, Field128])
@given(data=st.data())
@settings(max_examples=40)
def test_ntt_evaluates_and_inverts(field: type[Field], data: st.DataObject) -> None:
    p = field.MODULUS
    n = 1 << data.draw(st.integers(min_value=0, max_value=5))
    coeffs = data.draw(st.lists(st.integers(0, p - 1), min_size=n, max_size=n))
    values = ntt(field, coeffs, n)
    w = field.root_of_unity(n)
    assert values == [horner(p, coeffs, pow(w, i, p)) for i in range(n)]
    assert inv_ntt(field, values) == coeffs


@pytest.mark.parametrize("field", [Field64, Field128])
@given(data=st.data())
@settings(max_examples=40)
def test_lagrange_eval_and_extension(field: type[Field], data: st.DataObject) -> None:
    p = field.MODULUS
    length = data.draw(st.integers(min_value=1, max_value=20))
    n = 1 << (length - 1).bit_length()
    coeffs = data.draw(st.lists(st.integers(0, p - 1), min_size=length, max_size=length))
    w = field.root_of_unity(n)
    full = [horner(p, coeffs, pow(w, i, p)) for i in range(n)]
    assert PrefixExtension(field, length).extend(full[:length]) == full
    t = data.draw(st.integers(0, p - 1))
    assert LagrangeEvaluator(field, n, t).eval(full) == horner(p, coeffs, t)
    # At a node the evaluator must return the stored value, not divide by zero.
    assert LagrangeEvaluator(field, n, pow(w, n - 1, p)).eval(full) == full[n - 1]


def test_batch_inverse() -> None:
    xs = [1, 2, 3, Field64.MODULUS - 1, 123456789]
    inverses = batch_inverse(Field64, xs)
    assert all(x * y % Field64.MODULUS == 1 for x, y in zip(xs, inverses, strict=True))
