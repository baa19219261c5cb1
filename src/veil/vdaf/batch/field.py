"""Vectorised arithmetic in the fields of draft-irtf-cfrg-vdaf-18, Section 6.1,
for the batched Prio3 path (``veil.vdaf.batch.prio3``).

A *field array* holds many elements at once. Its trailing axes are the
element axes; which leading axes exist depends on the field:

- Field64: ``uint64`` array of reduced elements, shape ``(*shape)``.
- Field128: ``int64`` array of shape ``(4, *shape)``, the element's four
  little-endian 32-bit limbs, each in ``[0, 2^32)``. Values are *weakly*
  reduced: below ``2^128`` but possibly ``>= p``. Every operation accepts
  that, and ``canonical`` (applied by ``encode``, ``to_ints``, ``eq`` and
  ``is_zero``) finishes the reduction where the value is observed.

Generic code indexes element axes only from the right (``a[..., i]``,
``axis=-1``) so that it runs unchanged on both layouts. Multiplication
splits operands into 32-bit limbs and uses the shape of each prime for the
reduction:

- Goldilocks ``p = 2^64 - 2^32 + 1``: ``2^64 = 2^32 - 1`` and ``2^96 = -1``.
- ``p = 2^128 - 28 * 2^64 + 1``: ``2^128 = 28 * 2^64 - 1``; the product's
  limbs at ``2^160``, ``2^192`` and ``2^224`` fold the same way.

Sums, differences, products and dot products are compiled kernels
(``veil.vdaf.batch.kernels``, numba).

Field64 inputs must be reduced and Field128 limbs in range; nothing checks
that except the decoders, which report unreduced encodings per element.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from veil.vdaf.batch.kernels import kernels
from veil.vdaf.spec.field import Field, Field64, Field128
from veil.vdaf.spec.poly import batch_inverse

Arr = npt.NDArray[Any]

_M32 = 0xFFFFFFFF


class VecField(ABC):
    """The arithmetic of one prime field over field arrays."""

    field: ClassVar[type[Field]]
    MODULUS: ClassVar[int]
    ENCODED_SIZE: ClassVar[int]

    # -- conversion ---------------------------------------------------------

    @classmethod
    @abstractmethod
    def from_ints(cls, values: Any) -> Arr:
        """A field array from (nested sequences of) reduced ints."""

    @classmethod
    @abstractmethod
    def to_ints(cls, a: Arr) -> Any:
        """Nested lists of ints, the inverse of ``from_ints``."""

    @classmethod
    @abstractmethod
    def decode(cls, raw: Arr) -> tuple[Arr, Arr]:
        """Decode ``uint8`` rows of ``count * ENCODED_SIZE`` bytes into a
        ``(rows, count)`` field array and a ``(rows, count)`` boolean mask of
        the elements that were reduced (unreduced ones decode to garbage)."""

    @classmethod
    @abstractmethod
    def encode(cls, a: Arr) -> Arr:
        """The ``uint8`` little-endian encoding of a ``(rows, count)`` array,
        shape ``(rows, count * ENCODED_SIZE)``."""

    @classmethod
    @abstractmethod
    def constant(cls, value: int, shape: tuple[int, ...] = ()) -> Arr:
        """``value`` (reduced first) in every element of ``shape``."""

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> Arr:
        return cls.constant(0, shape)

    # -- shape helpers (element axes are trailing) ---------------------------

    @classmethod
    @abstractmethod
    def elem_shape(cls, a: Arr) -> tuple[int, ...]: ...

    @classmethod
    def reshape(cls, a: Arr, shape: tuple[int, ...]) -> Arr:
        return a.reshape(a.shape[: a.ndim - len(cls.elem_shape(a))] + shape)

    @classmethod
    def moveaxis(cls, a: Arr, source: int, dest: int) -> Arr:
        """Move element axes; ``source`` and ``dest`` must be negative."""
        return np.moveaxis(a, source, dest)

    @classmethod
    def stack(cls, arrays: Sequence[Arr], axis: int = -1) -> Arr:
        """Stack along a new element axis (``axis`` negative)."""
        return np.stack(list(arrays), axis=axis)

    @classmethod
    def concat(cls, arrays: Sequence[Arr], axis: int = -1) -> Arr:
        return np.concatenate(list(arrays), axis=axis)

    @classmethod
    @abstractmethod
    def select(cls, mask: Arr, a: Arr, b: Arr) -> Arr:
        """Elementwise ``a if mask else b``; ``mask`` has element shape."""

    # -- arithmetic -----------------------------------------------------------

    # Sums, differences, products and dot products are compiled kernels
    # (``veil.vdaf.batch.kernels``) in each field: they broadcast like NumPy.

    @classmethod
    @abstractmethod
    def add(cls, a: Arr, b: Arr) -> Arr: ...

    @classmethod
    @abstractmethod
    def sub(cls, a: Arr, b: Arr) -> Arr: ...

    @classmethod
    @abstractmethod
    def neg(cls, a: Arr) -> Arr: ...

    @classmethod
    @abstractmethod
    def mul(cls, a: Arr, b: Arr) -> Arr: ...

    @classmethod
    @abstractmethod
    def dot(cls, a: Arr, b: Arr, axis: int = -1) -> Arr:
        """``sum(a * b)`` along an element axis (negative; operands broadcast)."""

    @classmethod
    @abstractmethod
    def sum(cls, a: Arr, axis: int = -1) -> Arr:
        """Sum along an element axis (negative), reduced."""

    @classmethod
    def dot_consts(cls, a: Arr, weights: Sequence[int]) -> Arr:
        """``sum_i a[..., i] * weights[i]`` for fixed ints."""
        return cls.dot(a, cls.from_ints([w % cls.MODULUS for w in weights]))

    @classmethod
    @abstractmethod
    def eq(cls, a: Arr, b: Arr) -> Arr:
        """Elementwise equality, a boolean array of the element shape."""

    @classmethod
    @abstractmethod
    def is_zero(cls, a: Arr) -> Arr: ...

    @classmethod
    @abstractmethod
    def bit_mask(cls, a: Arr) -> Arr | None:
        """Where ``a`` is 1, if every element is a reduced 0 or 1 (a
        prover's own encoding); else None. A cheap test on the raw values."""

    @classmethod
    def pow(cls, a: Arr, exponent: int) -> Arr:
        """``a ** exponent`` elementwise, by square and multiply."""
        result = cls.constant(1, cls.elem_shape(a))
        base = a
        while exponent:
            if exponent & 1:
                result = cls.mul(result, base)
            exponent >>= 1
            if exponent:
                base = cls.mul(base, base)
        return result

    @classmethod
    def inv_each(cls, a: Arr) -> Arr:
        """Elementwise inverse (zero maps to zero) with Python ints and
        Montgomery's trick over all elements: one modular inversion in all
        (``pow(x, -1, p)`` costs microseconds at these sizes)."""
        values = np.asarray(cls.to_ints(a), dtype=object)
        flat = values.reshape(-1).tolist()
        nonzero = [v for v in flat if v]
        inverses = iter(batch_inverse(cls.field, nonzero))
        inverted = [next(inverses) if v else 0 for v in flat]
        return cls.from_ints(np.array(inverted, dtype=object).reshape(values.shape).tolist())

    @classmethod
    def inv(cls, a: Arr) -> Arr:
        """Elementwise inverse (zero maps to zero). Montgomery's trick along
        the last element axis, as a product tree: about three
        multiplications per element in ``2 log n`` vectorised steps, and one
        modular inversion (with Python ints) per row."""
        shape = cls.elem_shape(a)
        n = shape[-1]
        if n == 0:
            return a
        zero = cls.is_zero(a)
        x = cls.select(zero, cls.constant(1), a)
        width = 1 << (n - 1).bit_length()
        if width > n:
            x = cls.concat([x, cls.constant(1, (*shape[:-1], width - n))])
        levels = [x]
        while cls.elem_shape(levels[-1])[-1] > 1:
            top = levels[-1]
            levels.append(cls.mul(top[..., 0::2], top[..., 1::2]))
        inv = cls.inv_each(levels[-1][..., 0])[..., None]
        for level in reversed(levels[:-1]):
            # Children of each node: inverse of one is the node's inverse
            # times the other.
            left = cls.mul(inv, level[..., 1::2])
            right = cls.mul(inv, level[..., 0::2])
            size = cls.elem_shape(level)[-1]
            inv = cls.reshape(cls.stack([left, right], axis=-1), (*shape[:-1], size))
        return cls.select(zero, a, inv[..., :n])


class VecField64(VecField):
    """Field64 (Goldilocks) on ``uint64`` arrays."""

    field = Field64
    MODULUS = Field64.MODULUS
    ENCODED_SIZE = 8
    _P = np.uint64(Field64.MODULUS)
    _EPS = np.uint64(0xFFFFFFFF)  # 2^64 mod p

    @classmethod
    def from_ints(cls, values: Any) -> Arr:
        return np.array(values, dtype=np.uint64)

    @classmethod
    def constant(cls, value: int, shape: tuple[int, ...] = ()) -> Arr:
        return np.full(shape, value % cls.MODULUS, dtype=np.uint64)

    @classmethod
    def to_ints(cls, a: Arr) -> Any:
        return a.tolist()

    @classmethod
    def decode(cls, raw: Arr) -> tuple[Arr, Arr]:
        rows, width = raw.shape
        a = np.ascontiguousarray(raw).view("<u8").reshape(rows, width // 8).astype(np.uint64)
        return a, np.asarray(a < cls._P)

    @classmethod
    def encode(cls, a: Arr) -> Arr:
        rows, count = a.shape
        return np.ascontiguousarray(a, dtype="<u8").view(np.uint8).reshape(rows, count * 8)

    @classmethod
    def elem_shape(cls, a: Arr) -> tuple[int, ...]:
        return tuple(a.shape)

    @classmethod
    def select(cls, mask: Arr, a: Arr, b: Arr) -> Arr:
        return np.where(mask, a, b)

    @classmethod
    def add(cls, a: Arr, b: Arr) -> Arr:
        return np.asarray(kernels().add64(a, b))

    @classmethod
    def sub(cls, a: Arr, b: Arr) -> Arr:
        return np.asarray(kernels().sub64(a, b))

    @classmethod
    def neg(cls, a: Arr) -> Arr:
        return np.where(a == 0, a, cls._P - a)

    @classmethod
    def _reduce128(cls, lo: Arr, hi: Arr) -> Arr:
        """``lo + 2^64 * hi`` modulo p, for ``hi < 2^64``."""
        eps = cls._EPS
        hi_hi = hi >> np.uint64(32)
        hi_lo = hi & eps
        # 2^96 = -1: subtract hi_hi; a borrow wrapped by 2^64 = eps too much.
        t: Arr = lo - hi_hi
        t -= np.where(lo < hi_hi, eps, np.uint64(0))
        # 2^64 = eps: add hi_lo * eps (< 2^64); a carry lost 2^64 = eps.
        u = hi_lo * eps
        r: Arr = t + u
        r += np.where(r < u, eps, np.uint64(0))
        r -= np.where(r >= cls._P, cls._P, np.uint64(0))
        return r

    @classmethod
    def mul(cls, a: Arr, b: Arr) -> Arr:
        return np.asarray(kernels().mul64(a, b))

    @classmethod
    def inv_each(cls, a: Arr) -> Arr:
        # Compiled Montgomery's trick: the Python-int version was a sixth of
        # a batched Count verification.
        flat = np.ascontiguousarray(a, dtype=np.uint64).reshape(-1)
        out = np.empty_like(flat)
        kernels().inv64_each(flat, out)
        return out.reshape(np.shape(a))

    @classmethod
    def dot(cls, a: Arr, b: Arr, axis: int = -1) -> Arr:
        a, b = _core_last(a, b, axis)
        return np.asarray(kernels().dot64(a, b))

    @classmethod
    def sum(cls, a: Arr, axis: int = -1) -> Arr:
        # Sum 32-bit halves separately so nothing overflows (< 2^32 terms).
        # keepdims: never let the result become a NumPy scalar, whose
        # (intended) wrap-around would warn.
        lo = np.sum(a & cls._EPS, axis=axis, dtype=np.uint64, keepdims=True)
        hi = np.sum(a >> np.uint64(32), axis=axis, dtype=np.uint64, keepdims=True)
        # lo + 2^32 * hi = lo + 2^32 * (hi mod 2^32) + 2^64 * (hi >> 32)
        lo2 = (hi & cls._EPS) << np.uint64(32)
        total_lo: Arr = np.asarray(lo + lo2)
        carry = (total_lo < lo).astype(np.uint64)
        out = cls._reduce128(total_lo, np.asarray((hi >> np.uint64(32)) + carry))
        return np.squeeze(out, axis=axis)

    @classmethod
    def eq(cls, a: Arr, b: Arr) -> Arr:
        return np.asarray(a == b)

    @classmethod
    def is_zero(cls, a: Arr) -> Arr:
        return np.asarray(a == 0)

    @classmethod
    def bit_mask(cls, a: Arr) -> Arr | None:
        return np.asarray(a == 1) if bool(np.all(a <= 1)) else None


# The compiled Field128 codec reads and writes the machine's 32-bit words.
_LITTLE_ENDIAN = sys.byteorder == "little"

# Limbs of the Field128 modulus p = 2^128 - 28 * 2^64 + 1.
_P128_LIMBS = (1, 0, 0xFFFFFFE4, 0xFFFFFFFF)


class VecField128(VecField):
    """Field128 on ``int64`` arrays of four 32-bit limbs (leading axis)."""

    field = Field128
    MODULUS = Field128.MODULUS
    ENCODED_SIZE = 16

    @classmethod
    def from_ints(cls, values: Any) -> Arr:
        obj = np.array(values, dtype=object)
        return np.stack(
            [np.asarray((obj >> (32 * i)) & _M32, dtype=object).astype(np.int64) for i in range(4)]
        )

    @classmethod
    def constant(cls, value: int, shape: tuple[int, ...] = ()) -> Arr:
        v = value % cls.MODULUS
        return np.stack([np.full(shape, (v >> (32 * i)) & _M32, dtype=np.int64) for i in range(4)])

    @classmethod
    def to_ints(cls, a: Arr) -> Any:
        obj = cls.canonical(a).astype(object)
        return np.asarray(obj[0] | (obj[1] << 32) | (obj[2] << 64) | (obj[3] << 96)).tolist()

    @classmethod
    def inv_each(cls, a: Arr) -> Arr:
        # Compiled Montgomery's trick: the Python-int version, with its
        # conversions to ints and back, cost 1.2 to 1.4 us more an element
        # (a batched Field128 verification inverts once a report).
        flat = np.ascontiguousarray(a, dtype=np.int64).reshape(4, -1)
        out = np.empty_like(flat)
        kernels().inv128_each(flat, out)
        return out.reshape(np.shape(a))

    @classmethod
    def decode(cls, raw: Arr) -> tuple[Arr, Arr]:
        rows, width = raw.shape
        if _LITTLE_ENDIAN:
            # One compiled pass: the transposing copy below cost 20 ns an
            # element, about what a multiplication does.
            out = np.empty((4, rows, width // 16), dtype=np.int64)
            ok = np.empty((rows, width // 16), dtype=bool)
            kernels().decode128(np.ascontiguousarray(raw).view(np.uint32), out, ok)
            return out, ok
        limbs = np.ascontiguousarray(raw).view("<u4").reshape(rows, width // 16, 4)
        a = np.moveaxis(limbs, -1, 0).astype(np.int64)
        return a, ~cls._ge_p(a[0], a[1], a[2], a[3], None)

    @classmethod
    def encode(cls, a: Arr) -> Arr:
        _, rows, count = a.shape
        if _LITTLE_ENDIAN:
            words = np.empty((rows, 4 * count), dtype=np.uint32)
            kernels().encode128(a, words)
            return words.view(np.uint8)
        return (
            np.ascontiguousarray(np.moveaxis(cls.canonical(a), 0, -1), dtype="<u4")
            .view(np.uint8)
            .reshape(rows, count * 16)
        )

    @classmethod
    def elem_shape(cls, a: Arr) -> tuple[int, ...]:
        return tuple(a.shape[1:])

    @classmethod
    def stack(cls, arrays: Sequence[Arr], axis: int = -1) -> Arr:
        return np.stack(list(arrays), axis=axis if axis < 0 else axis + 1)

    @classmethod
    def select(cls, mask: Arr, a: Arr, b: Arr) -> Arr:
        return np.stack([np.where(mask, a[i], b[i]) for i in range(4)])

    @staticmethod
    def _ge_p(x0: Arr, x1: Arr, x2: Arr, x3: Arr, carry: Arr | None) -> Arr:
        """Whether ``x + carry * 2^128 >= p`` for limbs in ``[0, 2^32)``."""
        top = x3 == _P128_LIMBS[3]
        ge = top & ((x2 > _P128_LIMBS[2]) | ((x2 == _P128_LIMBS[2]) & ((x1 > 0) | (x0 >= 1))))
        return np.asarray(ge if carry is None else ge | (carry > 0))

    @staticmethod
    def _propagate(x0: Arr, x1: Arr, x2: Arr, x3: Arr) -> tuple[Arr, Arr, Arr, Arr, Arr]:
        """Signed carry propagation: limbs in ``[0, 2^32)`` and the signed
        multiple of ``2^128`` left over."""
        x1 = x1 + (x0 >> 32)
        x2 = x2 + (x1 >> 32)
        x3 = x3 + (x2 >> 32)
        return x0 & _M32, x1 & _M32, x2 & _M32, x3 & _M32, x3 >> 32

    @classmethod
    def _normalize(cls, c0: Arr, c1: Arr, c2: Arr, c3: Arr) -> Arr:
        """Weakly reduce ``c0 + c1 2^32 + c2 2^64 + c3 2^96`` for signed
        ``|c_i| < 2^61``: limbs in ``[0, 2^32)``, value ``< 2^128`` but
        possibly ``>= p`` (``canonical`` finishes the job where it matters)."""
        # 2^128 = 28 * 2^64 - 1. Fold c3's high part first: the value is
        # then within 2^127 of [0, 2^128), so one propagation leaves a
        # top of -1, 0 or 1, and folding that cannot carry again.
        high = c3 >> 32
        x0, x1, x2, x3, top = cls._propagate(c0 - high, c1, c2 + 28 * high, c3 & _M32)
        x0, x1, x2, x3, _ = cls._propagate(x0 - top, x1, x2 + 28 * top, x3)
        return np.stack([x0, x1, x2, x3])

    @classmethod
    def canonical(cls, a: Arr) -> Arr:
        out = np.empty(a.shape, dtype=np.int64)
        kernels().canonical128(a[0], a[1], a[2], a[3], *_limb_views(out))
        return out

    @staticmethod
    def _limbwise(kernel: Any, a: Arr, b: Arr) -> Arr:
        out = np.empty((4, *np.broadcast_shapes(a.shape[1:], b.shape[1:])), dtype=np.int64)
        kernel(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], *_limb_views(out))
        return out

    @classmethod
    def add(cls, a: Arr, b: Arr) -> Arr:
        return cls._limbwise(kernels().add128, a, b)

    @classmethod
    def sub(cls, a: Arr, b: Arr) -> Arr:
        return cls._limbwise(kernels().sub128, a, b)

    @classmethod
    def neg(cls, a: Arr) -> Arr:
        return cls._limbwise(kernels().sub128, cls.constant(0), a)

    @classmethod
    def _fold_columns(cls, c: Sequence[Arr]) -> Arr:
        # 2^128 = 28 2^64 - 1, 2^160 = 28 2^96 - 2^32,
        # 2^192 = 783 2^64 - 28, 2^224 = 783 2^96 - 28 2^32.
        return cls._normalize(
            c[0] - c[4] - 28 * c[6],
            c[1] - c[5] - 28 * c[7],
            c[2] + 28 * c[4] + 783 * c[6],
            c[3] + 28 * c[5] + 783 * c[7],
        )

    @classmethod
    def mul(cls, a: Arr, b: Arr) -> Arr:
        return cls._limbwise(kernels().mul128, a, b)

    @classmethod
    def dot(cls, a: Arr, b: Arr, axis: int = -1) -> Arr:
        # Lazy reduction: the kernel sums each column of the products'
        # 32-bit limbs (< 2^32 per term), reduced once here. Folding
        # multiplies by < 2^10 and _normalize takes < 2^61: fine below 2^18
        # terms.
        a, b = _core_last(a, b, axis)
        if a.shape[-1] >= 1 << 18:
            return cls.sum(cls.mul(a, b), -1)
        cols = [
            np.empty(np.broadcast_shapes(a.shape[1:-1], b.shape[1:-1]), np.int64) for _ in range(8)
        ]
        kernels().dot128(a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], *cols)
        return cls._fold_columns(cols)

    @classmethod
    def dot_consts(cls, a: Arr, weights: Sequence[int]) -> Arr:
        # Small weights (range-check bit weights, signed): limb by limb, no
        # multi-limb products; with limbs below 2^32 each limb's sum stays
        # below 2^60 in size, which the signed normalisation absorbs.
        if sum(abs(w) for w in weights) < 1 << 28:
            w = np.array(weights, dtype=np.int64)
            c = [a[limb] @ w for limb in range(4)]
            return cls._normalize(c[0], c[1], c[2], c[3])
        return super().dot_consts(a, weights)

    @classmethod
    def sum(cls, a: Arr, axis: int = -1) -> Arr:
        count = a.shape[axis]
        if count >= 1 << 28:
            raise ValueError("too many terms for one vectorised sum")
        s = np.sum(a, axis=axis if axis < 0 else axis + 1)
        return cls._normalize(s[0], s[1], s[2], s[3])

    @classmethod
    def eq(cls, a: Arr, b: Arr) -> Arr:
        return cls.is_zero(cls.sub(a, b))

    @classmethod
    def is_zero(cls, a: Arr) -> Arr:
        a = cls.canonical(a)
        return np.asarray((a[0] == 0) & (a[1] == 0) & (a[2] == 0) & (a[3] == 0))

    @classmethod
    def bit_mask(cls, a: Arr) -> Arr | None:
        if bool(np.all(a[0] <= 1)) and not np.any(a[1:]):
            return np.asarray(a[0] == 1)
        return None


def _limb_views(out: Arr) -> list[Arr]:
    """The four limb arrays of a Field128 output, as arrays even for a
    single element (a kernel writes through them)."""
    flat = out.reshape(4, 1) if out.ndim == 1 else out
    return [flat[i] for i in range(4)]


def _core_last(a: Arr, b: Arr, axis: int) -> tuple[Arr, Arr]:
    """``a`` and ``b`` with element axis ``axis`` (negative, so the same
    axis for both layouts) moved last and broadcast to one length there,
    for a kernel that reduces its last axis."""
    a = np.moveaxis(a, axis, -1)
    b = np.moveaxis(b, axis, -1)
    n = max(a.shape[-1], b.shape[-1])
    if a.shape[-1] != n:
        a = np.broadcast_to(a, (*a.shape[:-1], n))
    if b.shape[-1] != n:
        b = np.broadcast_to(b, (*b.shape[:-1], n))
    return a, b


def vec_field(field: type[Field]) -> type[VecField]:
    """The vectorised arithmetic for ``field``."""
    for vec in (VecField64, VecField128):
        if issubclass(field, vec.field):
            return vec
    raise ValueError(f"no vectorised arithmetic for {field.__name__}")
