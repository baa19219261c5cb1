"""Field arithmetic against Python integers, and the field codec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from veil.vdaf import CodecError, Field, Field64, Field128

FIELDS = [Field64, Field128]


def elements(field: type[Field]) -> st.SearchStrategy[int]:
    return st.integers(min_value=0, max_value=field.MODULUS - 1)


@pytest.mark.parametrize("field", FIELDS)
def test_moduli_and_roots(field: type[Field]) -> None:
    p = field.MODULUS
    # p - 1 is divisible by the subgroup order, and the generator has that order.
    assert (p - 1) % field.GEN_ORDER == 0
    assert pow(field.GENERATOR, field.GEN_ORDER, p) == 1
    assert pow(field.GENERATOR, field.GEN_ORDER // 2, p) == p - 1
    w = field.root_of_unity(8)
    assert pow(w, 8, p) == 1 and pow(w, 4, p) == p - 1
    with pytest.raises(ValueError):
        field.root_of_unity(6)


@pytest.mark.parametrize("field", FIELDS)
@given(data=st.data())
def test_element_arithmetic_matches_integers(field: type[Field], data: st.DataObject) -> None:
    p = field.MODULUS
    a = data.draw(elements(field))
    b = data.draw(elements(field))
    x, y = field(a), field(b)
    assert (x + y).val == (a + b) % p
    assert (x - y).val == (a - b) % p
    assert (x * y).val == (a * b) % p
    assert (-x).val == (-a) % p
    assert (x**5).val == pow(a, 5, p)
    if b:
        assert (x / y * y) == x
        assert (y.inv() * y).val == 1


@pytest.mark.parametrize("field", FIELDS)
@given(data=st.data())
def test_vector_ops_and_codec_round_trip(field: type[Field], data: st.DataObject) -> None:
    p = field.MODULUS
    n = data.draw(st.integers(min_value=0, max_value=20))
    a = data.draw(st.lists(elements(field), min_size=n, max_size=n))
    b = data.draw(st.lists(elements(field), min_size=n, max_size=n))
    assert field.vec_add(a, b) == [(x + y) % p for x, y in zip(a, b, strict=True)]
    assert field.vec_sub(a, b) == [(x - y) % p for x, y in zip(a, b, strict=True)]
    encoded = field.encode_vec(a)
    assert len(encoded) == n * field.ENCODED_SIZE
    assert field.decode_vec(encoded) == a


@pytest.mark.parametrize("field", FIELDS)
def test_decode_rejects_bad_lengths_and_unreduced(field: type[Field]) -> None:
    size = field.ENCODED_SIZE
    with pytest.raises(CodecError):
        field.decode_vec(bytes(size + 1))
    with pytest.raises(CodecError):
        field.decode_vec(bytes(size - 1))
    with pytest.raises(CodecError):
        field.decode_vec(field.MODULUS.to_bytes(size, "little"))
    assert field.decode_vec((field.MODULUS - 1).to_bytes(size, "little")) == [field.MODULUS - 1]


def test_elements_refuse_non_ints() -> None:
    with pytest.raises(TypeError):
        Field64(True)
    with pytest.raises(TypeError):
        Field64(1.5)  # type: ignore[arg-type]
    with pytest.raises(ZeroDivisionError):
        Field64(0).inv()
