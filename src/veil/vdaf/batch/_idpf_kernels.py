"""Compiled loops of the batched IDPF walk (``veil.vdaf.batch.idpf``).

Between its two AES passes per tree depth (which OpenSSL does, one call
per report), the walk does a little work per node: build the
correlation-robust hash's input blocks, xor the cipher's output back,
take the control bit, apply the correction word, pick the children, and at
the last depth read and correct the node's values. As NumPy operations
that is some twenty whole-array passes with their temporaries; here it is
one loop per pass, each node's words kept in registers. Imported on first
use (numba's on-disk cache keeps the machine code), like
``veil.vdaf.batch._kernels``.

Seeds are two ``uint64`` words (the 16 bytes, little-endian); a block of
XofFixedKeyAes128's stream of seed ``lo || hi`` is ``AES(s) xor s`` with
``s = hi || (hi xor lo xor i)`` for block ``i``.
"""

import numba as nb
import numpy as np

# Compiled at import, under veil.vdaf.batch.kernels' cache lock: explicit
# signatures over C-contiguous arrays.
_U2 = "uint64[:, ::1]"
_U3 = "uint64[:, :, ::1]"
_U4 = "uint64[:, :, :, ::1]"
_B2 = "boolean[:, ::1]"
_I1 = "intp[::1]"

_P64 = np.uint64(2**64 - 2**32 + 1)
_ONE = np.uint64(1)


@nb.njit(f"void({_U3}, int64, {_U4})", cache=True)
def sigma_blocks(seeds, count, out):
    """The hash inputs of blocks 0 to ``count - 1`` of each seed:
    ``seeds`` (R, N, 2) into ``out`` (R, N, count, 2)."""
    rows, nodes = seeds.shape[0], seeds.shape[1]
    for r in range(rows):
        for n in range(nodes):
            lo = seeds[r, n, 0]
            hi = seeds[r, n, 1]
            for i in range(count):
                out[r, n, i, 0] = hi
                out[r, n, i, 1] = hi ^ lo ^ np.uint64(i)


@nb.njit(
    f"void({_U4}, {_U4}, {_B2}, {_U2}, {_B2}, {_I1}, {_I1}, int64, {_B2}, {_U4})",
    cache=True,
)
def extend_children(
    hashed, sigma, parent_ctrl, seed_cw, ctrl_cw, parent, bit, count, child_ctrl, out
):
    """After extend's AES pass: ``hashed`` (R, P, 2, 2) is AES of ``sigma``,
    the two children's blocks of each parent. For each child n (its parent
    ``parent[n]`` and side ``bit[n]``): the seed (control bit taken from
    its low bit, then cleared; the correction word applied where the
    parent's control bit is set) goes straight into convert's hash inputs
    of its first ``count`` blocks, ``out`` (R, N, count, 2), and its
    control bit into ``child_ctrl`` (R, N)."""
    rows, nodes = hashed.shape[0], parent.shape[0]
    for r in range(rows):
        cw_lo = seed_cw[r, 0]
        cw_hi = seed_cw[r, 1]
        for n in range(nodes):
            p = parent[n]
            b = bit[n]
            lo = hashed[r, p, b, 0] ^ sigma[r, p, b, 0]
            hi = hashed[r, p, b, 1] ^ sigma[r, p, b, 1]
            t = (lo & _ONE) != 0
            lo = lo & ~_ONE
            if parent_ctrl[r, p]:
                lo ^= cw_lo
                hi ^= cw_hi
                t = t != ctrl_cw[r, b]
            child_ctrl[r, n] = t
            for i in range(count):
                out[r, n, i, 0] = hi
                out[r, n, i, 1] = hi ^ lo ^ np.uint64(i)


@nb.njit(f"void({_U4}, {_U4}, {_B2}, {_U2}, boolean, {_U3}, {_U3}, {_B2})", cache=True)
def convert_nodes(hashed, sigma, ctrl, w_cw, last, next_seeds, values, bad):
    """After convert's AES pass over ``sigma`` (R, N, count, 2): each node's
    next seed (block 0) into ``next_seeds`` (R, N, 2); at the last depth its
    two Field64 values (block 1) into ``values`` (R, N, 2), plus ``w_cw``
    (R, 2) where its control bit is set, and in ``bad`` (R, N) whether a
    candidate was >= p (the draft's sampler rejects it: redone exactly)."""
    rows, nodes = hashed.shape[0], hashed.shape[1]
    for r in range(rows):
        for n in range(nodes):
            next_seeds[r, n, 0] = hashed[r, n, 0, 0] ^ sigma[r, n, 0, 0]
            next_seeds[r, n, 1] = hashed[r, n, 0, 1] ^ sigma[r, n, 0, 1]
            if last:
                rejected = False
                for k in range(2):
                    v = hashed[r, n, 1, k] ^ sigma[r, n, 1, k]
                    if v >= _P64:
                        rejected = True
                        v = np.uint64(0)
                    if ctrl[r, n]:
                        w = w_cw[r, k]
                        # v + w mod p without overflowing 64 bits.
                        v = v - (_P64 - w) if w >= _P64 - v else v + w
                    values[r, n, k] = v
                bad[r, n] = rejected
