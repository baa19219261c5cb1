"""numba kernels of Field64 (Goldilocks, ``p = 2^64 - 2^32 + 1``) behind
``veil.vdaf.batch.kernels``: import that module, not this one (see
``veil.vdaf.batch._field128_kernels``). Products use ``2^64 = 2^32 - 1``
and ``2^96 = -1`` (mod p).
"""

import numba as nb
import numpy as np

_U64 = np.uint64
_MASK = _U64(0xFFFFFFFF)
_S32 = _U64(32)
_P64 = _U64(0xFFFFFFFF00000001)
_EPS64 = _U64(0xFFFFFFFF)  # 2^64 mod the Field64 prime

# Helpers inlined into the kernels (compiled only as part of them); every
# kernel has explicit signatures, so that all compiling (or loading from
# numba's cache) happens when this module is imported, which
# veil.vdaf.batch.kernels does under an inter-process lock.
_inline = nb.njit(inline="always")


@_inline
def _mul64(a, b):
    a0 = a & _MASK
    a1 = a >> _S32
    b0 = b & _MASK
    b1 = b >> _S32
    ll = a0 * b0
    lh = a0 * b1
    hl = a1 * b0
    mid = (ll >> _S32) + (lh & _MASK) + (hl & _MASK)
    lo = (ll & _MASK) | (mid << _S32)
    hi = a1 * b1 + (lh >> _S32) + (hl >> _S32) + (mid >> _S32)
    # lo + 2^64 hi = lo - hi_hi + eps * hi_lo
    hi_hi = hi >> _S32
    t = lo - hi_hi
    if lo < hi_hi:
        t -= _EPS64
    u = (hi & _MASK) * _EPS64
    r = t + u
    if r < u:
        r += _EPS64
    if r >= _P64:
        r -= _P64
    return r


@_inline
def _add64(a, b):
    s = a + b
    if s < a:  # wrapped past 2^64 = eps
        s += _EPS64
    if s >= _P64:
        s -= _P64
    return s


@nb.vectorize(["uint64(uint64, uint64)"], cache=True)
def mul64(a, b):
    return _mul64(a, b)


@nb.vectorize(["uint64(uint64, uint64)"], cache=True)
def add64(a, b):
    return _add64(a, b)


@nb.vectorize(["uint64(uint64, uint64)"], cache=True)
def sub64(a, b):
    d = a - b
    if a < b:
        d += _P64
    return d


@nb.guvectorize(["void(uint64[:], uint64[:], uint64[:])"], "(n),(n)->()", cache=True)
def dot64(a, b, out):
    acc = _U64(0)
    for i in range(a.shape[0]):
        acc = _add64(acc, _mul64(a[i], b[i]))
    out[0] = acc


@nb.njit("void(uint64[::1], uint64[::1])", cache=True)
def inv64_each(a, out):
    """Field64 inverse of each element of ``a`` into ``out`` (zero to zero):
    Montgomery's trick, one exponentiation ``x^(p-2)`` for the whole array."""
    n = a.shape[0]
    one = _U64(1)
    acc = one
    for i in range(n):
        out[i] = acc  # product of the non-zero elements before i
        if a[i] != 0:
            acc = _mul64(acc, a[i])
    # acc^(p - 2), square and multiply from the top bit down.
    e = _P64 - _U64(2)
    inv = one
    for bit in range(63, -1, -1):
        inv = _mul64(inv, inv)
        if (e >> _U64(bit)) & one:
            inv = _mul64(inv, acc)
    for i in range(n - 1, -1, -1):
        x = a[i]
        if x == 0:
            out[i] = 0
        else:
            out[i] = _mul64(inv, out[i])
            inv = _mul64(inv, x)
