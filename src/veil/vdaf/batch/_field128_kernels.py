"""numba kernels of Field128 behind ``veil.vdaf.batch.kernels``: its
arithmetic, codec and inverses, and the FLP's loops over it (the prover's
wire polynomials, the range check's gadget inputs and wire values, the
query's inverse differences), which share its inlined products. Import that
module, not this one (importing this compiles, or loads from numba's cache,
every kernel, and must not run in two processes at once on a cold cache).

Field128 ``p = 2^128 - 28 * 2^64 + 1``: ``2^128 = M = 27 * 2^64 + 2^64 - 1``
(mod p), whose 32-bit limbs are ``(2^32 - 1, 2^32 - 1, 27)``. Products are
schoolbook on 32-bit limbs in uint64, where every step ``x * y + r + c``
with 32-bit operands stays below ``2^64``; the high half is folded back
with M until it vanishes.

Each kernel module imports nothing but numba and NumPy: numba's cache
notices a change to the file that defines a kernel, not to a file it
imports from, so an inlined helper stays in the module of its callers
(tests/vdaf/batch/test_kernels.py checks it).
"""

import numba as nb
import numpy as np

_U64 = np.uint64
_MASK = _U64(0xFFFFFFFF)
_S32 = _U64(32)
_M0 = _U64(0xFFFFFFFF)
_M1 = _U64(0xFFFFFFFF)
_M2 = _U64(27)

# Helpers inlined into the kernels (compiled only as part of them).
_inline = nb.njit(inline="always")
# Every kernel has explicit signatures, so that all compiling (or loading
# from numba's cache) happens when this module is imported, which
# veil.vdaf.batch.kernels does under an inter-process lock.
_A3 = "int64[:, :, :]"
_A4 = "int64[:, :, :, :]"
# C-contiguous: lets the compiler vectorise loops along the last axis.
_C3 = "int64[:, :, ::1]"


@_inline
def _mac(x, y, acc, c):
    """``x * y + acc + c`` as (low 32 bits, carry); all four below 2^32."""
    t = x * y + acc + c
    return t & _MASK, t >> _S32


@_inline
def _fold(s0, s1, s2, s3, h0, h1, h2, h3):
    """Limbs of a value below 2^128 congruent to ``s + h * 2^128``."""
    zero = _U64(0)
    # Each pass replaces h * 2^128 by h * M, about 59 bits shorter: a
    # 256-bit value needs at most four passes.
    while h0 | h1 | h2 | h3:
        r0, c = _mac(h0, _M0, s0, zero)
        r1, c = _mac(h0, _M1, s1, c)
        r2, c = _mac(h0, _M2, s2, c)
        t = s3 + c
        r3 = t & _MASK
        r4 = t >> _S32
        r1, c = _mac(h1, _M0, r1, zero)
        r2, c = _mac(h1, _M1, r2, c)
        r3, c = _mac(h1, _M2, r3, c)
        t = r4 + c
        r4 = t & _MASK
        r5 = t >> _S32
        r2, c = _mac(h2, _M0, r2, zero)
        r3, c = _mac(h2, _M1, r3, c)
        r4, c = _mac(h2, _M2, r4, c)
        t = r5 + c
        r5 = t & _MASK
        r6 = t >> _S32
        r3, c = _mac(h3, _M0, r3, zero)
        r4, c = _mac(h3, _M1, r4, c)
        r5, c = _mac(h3, _M2, r5, c)
        s0, s1, s2, s3 = r0, r1, r2, r3
        h0, h1, h2, h3 = r4, r5, r6 + c, zero
    return s0, s1, s2, s3


@_inline
def _product(a0, a1, a2, a3, b0, b1, b2, b3):
    """The 256-bit product as eight 32-bit limbs."""
    zero = _U64(0)
    r0, c = _mac(a0, b0, zero, zero)
    r1, c = _mac(a0, b1, zero, c)
    r2, c = _mac(a0, b2, zero, c)
    r3, r4 = _mac(a0, b3, zero, c)
    r1, c = _mac(a1, b0, r1, zero)
    r2, c = _mac(a1, b1, r2, c)
    r3, c = _mac(a1, b2, r3, c)
    r4, r5 = _mac(a1, b3, r4, c)
    r2, c = _mac(a2, b0, r2, zero)
    r3, c = _mac(a2, b1, r3, c)
    r4, c = _mac(a2, b2, r4, c)
    r5, r6 = _mac(a2, b3, r5, c)
    r3, c = _mac(a3, b0, r3, zero)
    r4, c = _mac(a3, b1, r4, c)
    r5, c = _mac(a3, b2, r5, c)
    r6, r7 = _mac(a3, b3, r6, c)
    return r0, r1, r2, r3, r4, r5, r6, r7


_SCALAR8 = "(),(),(),(),(),(),(),()->(),(),(),()"
_SIG8 = ["void(" + ",".join(["int64"] * 8 + ["int64[:]"] * 4) + ")"]


@nb.guvectorize(_SIG8, _SCALAR8, cache=True)
def mul128(a0, a1, a2, a3, b0, b1, b2, b3, o0, o1, o2, o3):
    r = _product(_U64(a0), _U64(a1), _U64(a2), _U64(a3), _U64(b0), _U64(b1), _U64(b2), _U64(b3))
    x0, x1, x2, x3 = _fold(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7])
    o0[0] = np.int64(x0)
    o1[0] = np.int64(x1)
    o2[0] = np.int64(x2)
    o3[0] = np.int64(x3)


@nb.guvectorize(_SIG8, _SCALAR8, cache=True)
def add128(a0, a1, a2, a3, b0, b1, b2, b3, o0, o1, o2, o3):
    t = a0 + b0
    x0 = t & 0xFFFFFFFF
    t = a1 + b1 + (t >> 32)
    x1 = t & 0xFFFFFFFF
    t = a2 + b2 + (t >> 32)
    x2 = t & 0xFFFFFFFF
    t = a3 + b3 + (t >> 32)
    x3 = t & 0xFFFFFFFF
    zero = _U64(0)
    r = _fold(_U64(x0), _U64(x1), _U64(x2), _U64(x3), _U64(t >> 32), zero, zero, zero)
    o0[0] = np.int64(r[0])
    o1[0] = np.int64(r[1])
    o2[0] = np.int64(r[2])
    o3[0] = np.int64(r[3])


@_inline
def _sub128(a0, a1, a2, a3, b0, b1, b2, b3):
    """``a - b`` on int64 limbs, canonical when both are.

    Signed carries; a final borrow means the limbs hold a - b + 2^128,
    which is a - b + M: subtract M (a second time if that borrows too).
    """
    t = a0 - b0
    x0 = t & 0xFFFFFFFF
    t = a1 - b1 + (t >> 32)
    x1 = t & 0xFFFFFFFF
    t = a2 - b2 + (t >> 32)
    x2 = t & 0xFFFFFFFF
    t = a3 - b3 + (t >> 32)
    x3 = t & 0xFFFFFFFF
    borrow = t >> 32
    while borrow:
        t = x0 - 0xFFFFFFFF
        x0 = t & 0xFFFFFFFF
        t = x1 - 0xFFFFFFFF + (t >> 32)
        x1 = t & 0xFFFFFFFF
        t = x2 - 27 + (t >> 32)
        x2 = t & 0xFFFFFFFF
        t = x3 + (t >> 32)
        x3 = t & 0xFFFFFFFF
        borrow = t >> 32
    return x0, x1, x2, x3


@nb.guvectorize(_SIG8, _SCALAR8, cache=True)
def sub128(a0, a1, a2, a3, b0, b1, b2, b3, o0, o1, o2, o3):
    x0, x1, x2, x3 = _sub128(a0, a1, a2, a3, b0, b1, b2, b3)
    o0[0] = x0
    o1[0] = x1
    o2[0] = x2
    o3[0] = x3


@nb.guvectorize(
    ["void(" + ",".join(["int64[:]"] * 16) + ")"],
    "(n),(n),(n),(n),(n),(n),(n),(n)->(),(),(),(),(),(),(),()",
    cache=True,
)
def dot128(a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, c4, c5, c6, c7):
    # Column sums of the products' limbs (each < 2^32 per term): exact for
    # fewer than 2^31 terms; the caller folds the columns once.
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = _U64(0)
    for i in range(a0.shape[0]):
        r = _product(
            _U64(a0[i]), _U64(a1[i]), _U64(a2[i]), _U64(a3[i]),
            _U64(b0[i]), _U64(b1[i]), _U64(b2[i]), _U64(b3[i]),
        )  # fmt: skip
        s0 += r[0]
        s1 += r[1]
        s2 += r[2]
        s3 += r[3]
        s4 += r[4]
        s5 += r[5]
        s6 += r[6]
        s7 += r[7]
    c0[0] = np.int64(s0)
    c1[0] = np.int64(s1)
    c2[0] = np.int64(s2)
    c3[0] = np.int64(s3)
    c4[0] = np.int64(s4)
    c5[0] = np.int64(s5)
    c6[0] = np.int64(s6)
    c7[0] = np.int64(s7)


@_inline
def _propagate(x0, x1, x2, x3):
    """Signed carries through four int64 limbs: limbs in [0, 2^32) and the
    signed multiple of 2^128 left over."""
    x1 += x0 >> 32
    x2 += x1 >> 32
    x3 += x2 >> 32
    return x0 & 0xFFFFFFFF, x1 & 0xFFFFFFFF, x2 & 0xFFFFFFFF, x3 & 0xFFFFFFFF, x3 >> 32


_SMALL = 1 << 31


@_inline
def _store_columns(acc, out, r):
    """Reduce column sums ``acc`` (8, J): signed int64 sums at weights
    ``2^(32 c)``, each below 2^50 in magnitude, into ``out[:, r, :]``."""
    for y in range(acc.shape[1]):
        # 2^128 = 28 2^64 - 1, 2^160 = 28 2^96 - 2^32, 2^192 = 783 2^64 - 28,
        # 2^224 = 783 2^96 - 28 2^32; the results stay below 2^61.
        c0 = acc[0, y] - acc[4, y] - 28 * acc[6, y]
        c1 = acc[1, y] - acc[5, y] - 28 * acc[7, y]
        c2 = acc[2, y] + 28 * acc[4, y] + 783 * acc[6, y]
        c3 = acc[3, y] + 28 * acc[5, y] + 783 * acc[7, y]
        high = c3 >> 32
        x0, x1, x2, x3, top = _propagate(c0 - high, c1, c2 + 28 * high, c3 & 0xFFFFFFFF)
        x0, x1, x2, x3, top = _propagate(x0 - top, x1, x2 + 28 * top, x3)
        out[0, r, y] = x0
        out[1, r, y] = x1
        out[2, r, y] = x2
        out[3, r, y] = x3


@_inline
def _store_spread(acc, out, dest):
    """`_store_columns` for one row ``out`` (4, D), column y going to
    ``out[:, dest[y]]``."""
    for y in range(acc.shape[1]):
        c0 = acc[0, y] - acc[4, y] - 28 * acc[6, y]
        c1 = acc[1, y] - acc[5, y] - 28 * acc[7, y]
        c2 = acc[2, y] + 28 * acc[4, y] + 783 * acc[6, y]
        c3 = acc[3, y] + 28 * acc[5, y] + 783 * acc[7, y]
        high = c3 >> 32
        x0, x1, x2, x3, top = _propagate(c0 - high, c1, c2 + 28 * high, c3 & 0xFFFFFFFF)
        x0, x1, x2, x3, top = _propagate(x0 - top, x1, x2 + 28 * top, x3)
        col = dest[y]
        out[0, col] = x0
        out[1, col] = x1
        out[2, col] = x2
        out[3, col] = x3


@_inline
def _add_split_products(acc, j, a0, a1, a2, a3, b0, b1, b2, b3):
    """Add the product of ``a`` and ``b`` (32-bit limbs in uint64) to the
    column sums ``acc[:, j]`` (8 columns) as its sixteen limb products, each
    split at 32 bits into its two columns: no carry chain, so a loop over j
    calling it vectorises."""
    p00 = a0 * b0
    p01 = a0 * b1
    p10 = a1 * b0
    p02 = a0 * b2
    p11 = a1 * b1
    p20 = a2 * b0
    p03 = a0 * b3
    p12 = a1 * b2
    p21 = a2 * b1
    p30 = a3 * b0
    p13 = a1 * b3
    p22 = a2 * b2
    p31 = a3 * b1
    p23 = a2 * b3
    p32 = a3 * b2
    p33 = a3 * b3
    acc[0, j] += np.int64(p00 & _MASK)
    acc[1, j] += np.int64((p00 >> _S32) + (p01 & _MASK) + (p10 & _MASK))
    acc[2, j] += np.int64(
        (p01 >> _S32) + (p10 >> _S32) + (p02 & _MASK) + (p11 & _MASK) + (p20 & _MASK)
    )
    acc[3, j] += np.int64(
        (p02 >> _S32) + (p11 >> _S32) + (p20 >> _S32)
        + (p03 & _MASK) + (p12 & _MASK) + (p21 & _MASK) + (p30 & _MASK)
    )  # fmt: skip
    acc[4, j] += np.int64(
        (p03 >> _S32) + (p12 >> _S32) + (p21 >> _S32) + (p30 >> _S32)
        + (p13 & _MASK) + (p22 & _MASK) + (p31 & _MASK)
    )  # fmt: skip
    acc[5, j] += np.int64(
        (p13 >> _S32) + (p22 >> _S32) + (p31 >> _S32) + (p23 & _MASK) + (p32 & _MASK)
    )
    acc[6, j] += np.int64((p23 >> _S32) + (p32 >> _S32) + (p33 & _MASK))
    acc[7, j] += np.int64(p33 >> _S32)


@_inline
def _matvec_entry(v0, v1, v2, v3, e, k, acc):
    """Add the products of one non-zero entry (limbs v0..v3) of a row with
    row k of the matrix ``e`` (4, K, J) to the column sums ``acc`` (8, J)."""
    j_len = e.shape[2]
    e0 = e[0, k]
    e1 = e[1, k]
    e2 = e[2, k]
    e3 = e[3, k]
    u = -1
    sign = 1
    if (v1 | v2 | v3) == 0 and v0 < _SMALL:
        u = v0
    else:
        # p - v with signed borrows; p's limbs are (1, 0, 2^32 - 28, 2^32 - 1).
        d0 = 1 - v0
        d1 = -v1 + (d0 >> 32)
        d2 = 0xFFFFFFE4 - v2 + (d1 >> 32)
        d3 = 0xFFFFFFFF - v3 + (d2 >> 32)
        low = d0 & 0xFFFFFFFF
        high_zero = d3 == 0 and (d2 & 0xFFFFFFFF) == 0 and (d1 & 0xFFFFFFFF) == 0
        if high_zero and low < _SMALL:
            u = low
            sign = -1
    if u >= 0:
        # u * limb < 2^63: split at 32 bits into this column and the next.
        for y in range(j_len):
            t0 = u * e0[y]
            t1 = u * e1[y]
            t2 = u * e2[y]
            t3 = u * e3[y]
            acc[0, y] += sign * (t0 & 0xFFFFFFFF)
            acc[1, y] += sign * ((t0 >> 32) + (t1 & 0xFFFFFFFF))
            acc[2, y] += sign * ((t1 >> 32) + (t2 & 0xFFFFFFFF))
            acc[3, y] += sign * ((t2 >> 32) + (t3 & 0xFFFFFFFF))
            acc[4, y] += sign * (t3 >> 32)
        return
    a0 = _U64(v0)
    a1 = _U64(v1)
    a2 = _U64(v2)
    a3 = _U64(v3)
    for y in range(j_len):
        # Sixteen limb products, each split at 32 bits into its two
        # columns: no carry chain.
        b0 = _U64(e0[y])
        b1 = _U64(e1[y])
        b2 = _U64(e2[y])
        b3 = _U64(e3[y])
        _add_split_products(acc, y, a0, a1, a2, a3, b0, b1, b2, b3)


@nb.njit(f"void({_C3}, {_C3}, {_C3})", cache=True)
def matvec128(x, e, out):
    """``out[:, r] = x[:, r] @ E`` for rows ``x`` (4, R, K) and a matrix
    ``e`` (4, K, J), in limbs, all three C-contiguous. Each non-zero entry of a row adds its
    products with a row of E to column sums, in a loop over E's row that
    the compiler vectorises; small entries (``u`` or ``p - u`` for
    ``u < 2^31``: the prover's bits and ``x - 1``) take four limb products
    instead of sixteen; zero entries nothing. Column sums stay below
    ``K 2^35`` in magnitude; callers keep K below ``2^12``."""
    j_len = e.shape[2]
    acc = np.empty((8, j_len), np.int64)
    for r in range(x.shape[1]):
        acc[:] = 0
        for k in range(x.shape[2]):
            v0 = x[0, r, k]
            v1 = x[1, r, k]
            v2 = x[2, r, k]
            v3 = x[3, r, k]
            if (v0 | v1 | v2 | v3) != 0:
                _matvec_entry(v0, v1, v2, v3, e, k, acc)
        _store_columns(acc, out, r)


@_inline
def _extend_wire(seeds, wires, e, dest, r, a, o, acc):
    """One wire polynomial of row r on the whole domain into ``o`` (4, D):
    the body of `extend128`."""
    k_len = e.shape[1]
    calls = wires.shape[3]
    step = o.shape[1] // k_len
    acc[:] = 0
    for k in range(calls + 1):
        if k == 0:
            v0 = seeds[0, r, a]
            v1 = seeds[1, r, a]
            v2 = seeds[2, r, a]
            v3 = seeds[3, r, a]
        else:
            v0 = wires[0, r, a, k - 1]
            v1 = wires[1, r, a, k - 1]
            v2 = wires[2, r, a, k - 1]
            v3 = wires[3, r, a, k - 1]
        o[0, k * step] = v0
        o[1, k * step] = v1
        o[2, k * step] = v2
        o[3, k * step] = v3
        if (v0 | v1 | v2 | v3) != 0:
            _matvec_entry(v0, v1, v2, v3, e, k, acc)
    for k in range(calls + 1, k_len):
        for limb in range(4):
            o[limb, k * step] = 0
    _store_spread(acc, o, dest)


@nb.njit(
    "void(int64[:, :, :], int64[:, :, :, :], int64[:, :, ::1], int64[::1], int64[:, :, :, ::1])",
    cache=True,
)
def extend128(seeds, wires, e, dest, out):
    """A prover's wire polynomials on the whole domain, written in place.

    The polynomial of row r and wire a has the values ``seeds[:, r, a]``,
    ``wires[:, r, a, 0..C)`` and then zeros on the first coset (the K = P
    points of E's rows); its values on the other cosets are ``poly @ E``
    (as `matvec128`), whose column y goes to ``out[:, r, a, dest[y]]``, and
    the first coset's values to every s-th entry (s = D / P). Saves
    building the polynomials and interleaving the cosets as arrays; the
    inputs may have any strides (the circuit's wires come transposed)."""
    acc = np.empty((8, e.shape[2]), np.int64)
    for r in range(seeds.shape[1]):
        for a in range(seeds.shape[2]):
            _extend_wire(seeds, wires, e, dest, r, a, out[:, r, a], acc)


@nb.njit(
    "void(int64[:, :, :], int64[:, :, :, :], int64[:, :, ::1], int64[::1], int64[:, :, ::1])",
    cache=True,
)
def prove_mul_sum128(seeds, wires, e, dest, g):
    """A prover's gadget polynomial for ParallelSum(Mul): for each row r,
    the wires on the whole domain (as `extend128`, in a buffer of one row)
    and then ``g[:, r, y] = sum_i wire_2i(y) wire_2i+1(y)`` for the first
    G points of the domain (``g`` (4, R, G), G = the polynomial's length).
    Saves writing every wire's values on the domain for a whole batch and
    reading them back with strides for the products; the column sums of
    the products' 32-bit halves stay below ``A 2^32``."""
    arity = seeds.shape[2]
    dom = e.shape[1] + e.shape[2]
    g_len = g.shape[2]
    buf = np.empty((4, arity, dom), np.int64)
    acc = np.empty((8, e.shape[2]), np.int64)
    sums = np.empty((8, g_len), np.int64)
    for r in range(seeds.shape[1]):
        for a in range(arity):
            _extend_wire(seeds, wires, e, dest, r, a, buf[:, a], acc)
        sums[:] = 0
        for i in range(arity // 2):
            x0 = buf[0, 2 * i]
            x1 = buf[1, 2 * i]
            x2 = buf[2, 2 * i]
            x3 = buf[3, 2 * i]
            z0 = buf[0, 2 * i + 1]
            z1 = buf[1, 2 * i + 1]
            z2 = buf[2, 2 * i + 1]
            z3 = buf[3, 2 * i + 1]
            for y in range(g_len):
                # Limbs masked to 32 bits (a no-op) so that the compiler
                # multiplies them as 32 x 32 bits.
                a0 = _U64(x0[y]) & _MASK
                a1 = _U64(x1[y]) & _MASK
                a2 = _U64(x2[y]) & _MASK
                a3 = _U64(x3[y]) & _MASK
                b0 = _U64(z0[y]) & _MASK
                b1 = _U64(z1[y]) & _MASK
                b2 = _U64(z2[y]) & _MASK
                b3 = _U64(z3[y]) & _MASK
                _add_split_products(sums, y, a0, a1, a2, a3, b0, b1, b2, b3)
        _store_columns(sums, g, r)


@nb.guvectorize(
    ["void(" + ",".join(["int64"] * 4 + ["int64[:]"] * 4) + ")"],
    "(),(),(),()->(),(),(),()",
    cache=True,
)
def canonical128(a0, a1, a2, a3, o0, o1, o2, o3):
    """The reduced representative of a weakly reduced value: subtract p once
    where the value is at least p."""
    d0 = a0 - 1
    d1 = a1 + (d0 >> 32)
    d2 = a2 - 0xFFFFFFE4 + (d1 >> 32)
    d3 = a3 - 0xFFFFFFFF + (d2 >> 32)
    if d3 >= 0:
        o0[0] = d0 & 0xFFFFFFFF
        o1[0] = d1 & 0xFFFFFFFF
        o2[0] = d2 & 0xFFFFFFFF
        o3[0] = d3
    else:
        o0[0] = a0
        o1[0] = a1
        o2[0] = a2
        o3[0] = a3


@_inline
def _add_product(acc, j, a0, a1, a2, a3, b0, b1, b2, b3):
    """Add the limbs of the product ``a * b`` to the column sums ``acc[:, j]``."""
    q = _product(a0, a1, a2, a3, b0, b1, b2, b3)
    for c in range(8):
        acc[c, j] += np.int64(q[c])


@nb.njit(f"void({_A4}, {_A3}, {_A3}, {_A3}, {_A3})", cache=True)
def chunk_wire_evals128(x, r, w, left, right):
    """The chunked range check's wire polynomials at the query point, past
    their seeds: ``left[:, i, j] = sum_k w_k r_k^(j+1) x_kj`` and
    ``right[:, i, j] = sum_k w_k x_kj`` for measurement chunks ``x``
    (4, rows, calls, m), joint randomness ``r`` and Lagrange weights ``w``
    (4, rows, calls). Column sums stay below ``calls 2^32``; callers keep
    ``calls`` below ``2^16``."""
    m = x.shape[3]
    acc_left = np.empty((8, m), np.int64)
    acc_right = np.empty((8, m), np.int64)
    for i in range(x.shape[1]):
        acc_left[:] = 0
        acc_right[:] = 0
        for k in range(x.shape[2]):
            r0 = _U64(r[0, i, k])
            r1 = _U64(r[1, i, k])
            r2 = _U64(r[2, i, k])
            r3 = _U64(r[3, i, k])
            w0 = _U64(w[0, i, k])
            w1 = _U64(w[1, i, k])
            w2 = _U64(w[2, i, k])
            w3 = _U64(w[3, i, k])
            q = _product(w0, w1, w2, w3, r0, r1, r2, r3)
            c0, c1, c2, c3 = _fold(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])
            for j in range(m):
                x0 = _U64(x[0, i, k, j])
                x1 = _U64(x[1, i, k, j])
                x2 = _U64(x[2, i, k, j])
                x3 = _U64(x[3, i, k, j])
                _add_product(acc_left, j, c0, c1, c2, c3, x0, x1, x2, x3)
                _add_product(acc_right, j, w0, w1, w2, w3, x0, x1, x2, x3)
                if j + 1 < m:
                    q = _product(c0, c1, c2, c3, r0, r1, r2, r3)
                    c0, c1, c2, c3 = _fold(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])
        _store_columns(acc_left, left, i)
        _store_columns(acc_right, right, i)


# Byte arrays often come straight from ``bytes`` (read-only buffers).
_RO_U32 = nb.types.Array(nb.types.uint32, 2, "C", readonly=True)


@_inline
def _times(a0, a1, a2, a3, b0, b1, b2, b3):
    """``a * b`` of ``uint64`` limbs as a tuple of four, as ``mul128``
    computes it (weakly reduced)."""
    q = _product(a0, a1, a2, a3, b0, b1, b2, b3)
    return _fold(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])


@_inline
def _mul128_into(out, j, a0, a1, a2, a3, b0, b1, b2, b3):
    """``out[:, j] = a * b``, as ``mul128`` computes it."""
    x0, x1, x2, x3 = _times(
        _U64(a0), _U64(a1), _U64(a2), _U64(a3), _U64(b0), _U64(b1), _U64(b2), _U64(b3)
    )
    out[0, j] = np.int64(x0)
    out[1, j] = np.int64(x1)
    out[2, j] = np.int64(x2)
    out[3, j] = np.int64(x3)


@nb.njit(f"void({_A3}, {_A3}, int64[::1], boolean, int64[:, :, :, ::1])", cache=True)
def bit_check_wires128(x, r, c, bits, out):
    """The chunked range check's gadget inputs (``batch_circuits._Chunked``)
    in one pass: for each report i, call k and j in the chunk,
    ``out[:, i, k, 2j] = r_ik^(j+1) * x_ikj`` and
    ``out[:, i, k, 2j+1] = x_ikj - c``, where ``x_ikj`` is entry ``k m + j``
    of the measurement ``x[:, i]`` (zero past its end: the last chunk's
    padding, never copied). The powers come in the order
    ``batch_circuits.powers`` multiplies them and each value is computed as
    ``mul128``/``sub128`` compute it, so the limbs are the same as the NumPy
    form's. ``bits``: every ``x`` is 0 or 1 (canonical), the product is a
    selection, as there."""
    rows, length = x.shape[1], x.shape[2]
    calls, m = out.shape[2], out.shape[3] // 2
    pw = np.empty((4, m), np.int64)
    for i in range(rows):
        for k in range(calls):
            pw[0, 0] = r[0, i, k]
            pw[1, 0] = r[1, i, k]
            pw[2, 0] = r[2, i, k]
            pw[3, 0] = r[3, i, k]
            have = 1
            while have < m:
                take = min(have, m - have)
                b0, b1, b2, b3 = pw[0, have - 1], pw[1, have - 1], pw[2, have - 1], pw[3, have - 1]
                for j in range(take):
                    a0, a1, a2, a3 = pw[0, j], pw[1, j], pw[2, j], pw[3, j]
                    _mul128_into(pw, have + j, a0, a1, a2, a3, b0, b1, b2, b3)
                have += take
            for j in range(m):
                at = k * m + j
                if at < length:
                    x0, x1, x2, x3 = x[0, i, at], x[1, i, at], x[2, i, at], x[3, i, at]
                else:
                    x0 = x1 = x2 = x3 = 0
                left = 2 * j
                if bits:
                    if x0 == 1:
                        for q in range(4):
                            out[q, i, k, left] = pw[q, j]
                    else:
                        for q in range(4):
                            out[q, i, k, left] = 0
                else:
                    p = _product(
                        _U64(pw[0, j]), _U64(pw[1, j]), _U64(pw[2, j]), _U64(pw[3, j]),
                        _U64(x0), _U64(x1), _U64(x2), _U64(x3),
                    )  # fmt: skip
                    y0, y1, y2, y3 = _fold(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
                    out[0, i, k, left] = np.int64(y0)
                    out[1, i, k, left] = np.int64(y1)
                    out[2, i, k, left] = np.int64(y2)
                    out[3, i, k, left] = np.int64(y3)
                d0, d1, d2, d3 = _sub128(x0, x1, x2, x3, c[0], c[1], c[2], c[3])
                out[0, i, k, left + 1] = d0
                out[1, i, k, left + 1] = d1
                out[2, i, k, left + 1] = d2
                out[3, i, k, left + 1] = d3


@nb.njit(
    [
        "void(uint32[:, ::1], int64[:, :, ::1], boolean[:, ::1])",
        nb.void(_RO_U32, nb.int64[:, :, ::1], nb.boolean[:, ::1]),
    ],
    cache=True,
)
def decode128(words, out, ok):
    """Field128 elements from their encoding, seen as little-endian 32-bit
    words (``(R, 4N)``), into limbs ``(4, R, N)``; ``ok``: below p."""
    rows, count = out.shape[1], out.shape[2]
    for i in range(rows):
        for n in range(count):
            x0 = np.int64(words[i, 4 * n])
            x1 = np.int64(words[i, 4 * n + 1])
            x2 = np.int64(words[i, 4 * n + 2])
            x3 = np.int64(words[i, 4 * n + 3])
            out[0, i, n] = x0
            out[1, i, n] = x1
            out[2, i, n] = x2
            out[3, i, n] = x3
            ok[i, n] = not (
                x3 == 0xFFFFFFFF and (x2 > 0xFFFFFFE4 or (x2 == 0xFFFFFFE4 and (x1 > 0 or x0 >= 1)))
            )


@nb.njit(f"void({_A3}, uint32[:, ::1])", cache=True)
def encode128(a, words):
    """The encoding of Field128 limbs ``(4, R, N)`` (weakly reduced) as
    little-endian 32-bit words ``(R, 4N)``: the reduced representative, as
    ``canonical128`` gives it."""
    rows, count = a.shape[1], a.shape[2]
    for i in range(rows):
        for n in range(count):
            a0, a1, a2, a3 = a[0, i, n], a[1, i, n], a[2, i, n], a[3, i, n]
            d0 = a0 - 1
            d1 = a1 + (d0 >> 32)
            d2 = a2 - 0xFFFFFFE4 + (d1 >> 32)
            d3 = a3 - 0xFFFFFFFF + (d2 >> 32)
            if d3 >= 0:
                a0, a1, a2, a3 = d0 & 0xFFFFFFFF, d1 & 0xFFFFFFFF, d2 & 0xFFFFFFFF, d3
            words[i, 4 * n] = np.uint32(a0)
            words[i, 4 * n + 1] = np.uint32(a1)
            words[i, 4 * n + 2] = np.uint32(a2)
            words[i, 4 * n + 3] = np.uint32(a3)


@nb.njit(f"void({_A3}, int64[:, :], int64[:, :], {_A3})", cache=True)
def inverse_differences128(t_pows, inv_root, nodes, out):
    """The descent of ``veil.vdaf.batch.flp._inverse_differences`` for each
    row r: ``out[:, r, i] = 1 / (t - w^i)`` for the D roots of unity
    ``nodes`` (4, D), from ``t^(2^l)`` (``t_pows`` (4, R, L), D = 2^L) and
    the inverse of the product tree's root, ``1 / (t^D - 1)`` (``inv_root``
    (4, R)). Level l's nodes are ``t^(2^l) - w^(i 2^l)``; each node's
    inverse times its sibling is a child's. The same subtractions and
    products, in the same order, as the NumPy form: the limbs are equal."""
    levels = t_pows.shape[2]
    for r in range(out.shape[1]):
        row = out[:, r]
        row[0, 0] = inv_root[0, r]
        row[1, 0] = inv_root[1, r]
        row[2, 0] = inv_root[2, r]
        row[3, 0] = inv_root[3, r]
        n = 1
        for lvl in range(levels - 1, -1, -1):
            a0 = t_pows[0, r, lvl]
            a1 = t_pows[1, r, lvl]
            a2 = t_pows[2, r, lvl]
            a3 = t_pows[3, r, lvl]
            for i in range(n):
                c0 = row[0, i]
                c1 = row[1, i]
                c2 = row[2, i]
                c3 = row[3, i]
                lo = i << lvl
                hi = (i + n) << lvl
                d = _sub128(a0, a1, a2, a3, nodes[0, lo], nodes[1, lo], nodes[2, lo], nodes[3, lo])
                _mul128_into(row, n + i, c0, c1, c2, c3, d[0], d[1], d[2], d[3])
                d = _sub128(a0, a1, a2, a3, nodes[0, hi], nodes[1, hi], nodes[2, hi], nodes[3, hi])
                _mul128_into(row, i, c0, c1, c2, c3, d[0], d[1], d[2], d[3])
            n *= 2


# p - 2, the exponent of a Field128 inverse (Fermat), as 32-bit limbs.
_P128_MINUS_2 = np.array([0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFE3, 0xFFFFFFFF], dtype=np.int64)


@nb.njit("void(int64[:, ::1], int64[:, ::1])", cache=True)
def inv128_each(a, out):
    """Field128 inverse of each element of ``a`` (4, N) into ``out`` (4, N),
    zero (held as 0 or as p) to zero: Montgomery's trick, one
    exponentiation ``x^(p-2)`` for the whole array. The outputs are weakly
    reduced (below 2^128), as products are."""
    n = a.shape[1]
    one = (_U64(1), _U64(0), _U64(0), _U64(0))
    acc = one
    zero = np.zeros(n, np.bool_)
    for i in range(n):
        # Product of the non-zero elements before i.
        out[0, i] = np.int64(acc[0])
        out[1, i] = np.int64(acc[1])
        out[2, i] = np.int64(acc[2])
        out[3, i] = np.int64(acc[3])
        x0, x1, x2, x3 = _U64(a[0, i]), _U64(a[1, i]), _U64(a[2, i]), _U64(a[3, i])
        is_p = x0 == 1 and x1 == 0 and x2 == 0xFFFFFFE4 and x3 == 0xFFFFFFFF
        if (x0 | x1 | x2 | x3) == 0 or is_p:
            zero[i] = True
            continue
        acc = _times(acc[0], acc[1], acc[2], acc[3], x0, x1, x2, x3)
    # acc^(p - 2), square and multiply from the top bit down.
    inv = one
    for limb in range(3, -1, -1):
        e = _U64(_P128_MINUS_2[limb])
        for bit in range(31, -1, -1):
            inv = _times(inv[0], inv[1], inv[2], inv[3], inv[0], inv[1], inv[2], inv[3])
            if (e >> _U64(bit)) & _U64(1):
                inv = _times(inv[0], inv[1], inv[2], inv[3], acc[0], acc[1], acc[2], acc[3])
    for i in range(n - 1, -1, -1):
        if zero[i]:
            out[0, i] = 0
            out[1, i] = 0
            out[2, i] = 0
            out[3, i] = 0
            continue
        _mul128_into(
            out, i, inv[0], inv[1], inv[2], inv[3], out[0, i], out[1, i], out[2, i], out[3, i]
        )
        inv = _times(
            inv[0], inv[1], inv[2], inv[3],
            _U64(a[0, i]), _U64(a[1, i]), _U64(a[2, i]), _U64(a[3, i]),
        )  # fmt: skip
