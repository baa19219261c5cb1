"""Prime fields of draft-irtf-cfrg-vdaf, Section 6.1.

Field elements travel through veil as plain Python ints in ``[0, MODULUS)``;
vectors are ``list[int]``. The field classes carry the parameters and the
vector operations, and can also be instantiated as element objects with
operator overloading (``Field64(3) * Field64(5)``) where code reads better
that way. The codec (``encode_vec``/``decode_vec``) is the one place where
bytes meet field elements: little-endian, fixed width, reduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Self

from veil.vdaf.errors import CodecError


class Field:
    """A prime field with a multiplicative subgroup of order ``GEN_ORDER``
    (a power of two), so that polynomials can be handled with the NTT."""

    MODULUS: ClassVar[int]
    ENCODED_SIZE: ClassVar[int]
    GEN_ORDER: ClassVar[int]
    # A generator of the subgroup of order GEN_ORDER.
    GENERATOR: ClassVar[int]

    __slots__ = ("val",)

    def __init__(self, val: int) -> None:
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"field element must be an int, not {type(val).__name__}")
        self.val = val % self.MODULUS

    # -- element arithmetic --------------------------------------------

    def __add__(self, other: Self) -> Self:
        return type(self)((self.val + other.val) % self.MODULUS)

    def __sub__(self, other: Self) -> Self:
        return type(self)((self.val - other.val) % self.MODULUS)

    def __mul__(self, other: Self) -> Self:
        return type(self)(self.val * other.val % self.MODULUS)

    def __neg__(self) -> Self:
        return type(self)(-self.val % self.MODULUS)

    def __pow__(self, exponent: int) -> Self:
        return type(self)(pow(self.val, exponent, self.MODULUS))

    def __truediv__(self, other: Self) -> Self:
        return self * other.inv()

    def inv(self) -> Self:
        """The multiplicative inverse; raises ZeroDivisionError for zero."""
        if self.val == 0:
            raise ZeroDivisionError("zero has no inverse")
        return type(self)(pow(self.val, -1, self.MODULUS))

    def __int__(self) -> int:
        return self.val

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Field):
            return NotImplemented
        return type(self) is type(other) and self.val == other.val

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.val))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.val})"

    # -- vectors of canonical ints -------------------------------------

    @classmethod
    def zeros(cls, length: int) -> list[int]:
        """A vector of `length` zeros."""
        return [0] * length

    @classmethod
    def encode_vec(cls, vec: Sequence[int]) -> bytes:
        """Encode reduced elements as ``ENCODED_SIZE`` little-endian bytes each."""
        size = cls.ENCODED_SIZE
        return b"".join(x.to_bytes(size, "little") for x in vec)

    @classmethod
    def decode_vec(cls, encoded: bytes) -> list[int]:
        """Inverse of ``encode_vec``; raises ``CodecError`` on a length that is
        not a multiple of ``ENCODED_SIZE`` or on an unreduced element."""
        size = cls.ENCODED_SIZE
        if len(encoded) % size != 0:
            raise CodecError(
                f"{cls.__name__} vector: {len(encoded)} bytes is not a multiple of {size}"
            )
        vec = [
            int.from_bytes(encoded[i : i + size], "little") for i in range(0, len(encoded), size)
        ]
        p = cls.MODULUS
        for x in vec:
            if x >= p:
                raise CodecError(f"{cls.__name__} element is not reduced modulo the prime")
        return vec

    @classmethod
    def vec_add(cls, left: Sequence[int], right: Sequence[int]) -> list[int]:
        """Element-wise sum; raises ValueError if the lengths differ."""
        if len(left) != len(right):
            raise ValueError(f"vector lengths differ: {len(left)} != {len(right)}")
        p = cls.MODULUS
        return [(a + b) % p for a, b in zip(left, right, strict=True)]

    @classmethod
    def vec_sub(cls, left: Sequence[int], right: Sequence[int]) -> list[int]:
        """Element-wise difference; raises ValueError if the lengths differ."""
        if len(left) != len(right):
            raise ValueError(f"vector lengths differ: {len(left)} != {len(right)}")
        p = cls.MODULUS
        return [(a - b) % p for a, b in zip(left, right, strict=True)]

    @classmethod
    def root_of_unity(cls, n: int) -> int:
        """A primitive ``n``-th root of unity, ``n`` a power of two dividing
        ``GEN_ORDER``; the same root the draft uses, so that polynomial
        evaluations in proofs agree byte for byte."""
        if n <= 0 or n & (n - 1) or cls.GEN_ORDER % n:
            raise ValueError(f"no {n}-th root of unity in {cls.__name__}")
        return pow(cls.GENERATOR, cls.GEN_ORDER // n, cls.MODULUS)


class Field64(Field):
    """GF(2^32 * 4294967295 + 1)."""

    __slots__ = ()
    MODULUS = 2**32 * 4294967295 + 1
    ENCODED_SIZE = 8
    GEN_ORDER = 2**32
    GENERATOR = pow(7, 4294967295, 2**32 * 4294967295 + 1)


class Field128(Field):
    """GF(2^66 * 4611686018427387897 + 1)."""

    __slots__ = ()
    MODULUS = 2**66 * 4611686018427387897 + 1
    ENCODED_SIZE = 16
    GEN_ORDER = 2**66
    GENERATOR = pow(7, 4611686018427387897, 2**66 * 4611686018427387897 + 1)


class Field255(Field):
    """GF(2^255 - 19), the field of Poplar1's leaf level (draft section
    6.1.2). No proof system runs over it, so it needs no large power-of-two
    subgroup: p - 1 = 4 * odd, and -1 generates the subgroup of order 2."""

    __slots__ = ()
    MODULUS = 2**255 - 19
    ENCODED_SIZE = 32
    GEN_ORDER = 2
    GENERATOR = 2**255 - 20
