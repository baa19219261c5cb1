"""Compiled loops of the batched IDPF walk (``veil.vdaf.batch.idpf``).

Between its two AES passes per tree depth (which OpenSSL does, one call
per report), the walk does a little work per node: build the
correlation-robust hash's input blocks, xor the cipher's output back,
take the control bit, apply the correction word, pick the children, and at
the last depth read and correct the node's values. As NumPy operations
that is some twenty whole-array passes with their temporaries; here it is
one loop per pass, each node's words kept in registers. Imported on first
use (numba's on-disk cache keeps the machine code), like
the field kernels (``veil.vdaf.batch.kernels``).

Seeds are two ``uint64`` words (the 16 bytes, little-endian); a block of
XofFixedKeyAes128's stream of seed ``lo || hi`` is ``AES(s) xor s`` with
``s = hi || (hi xor lo xor i)`` for block ``i``.

The AES itself is OpenSSL's (``veil.vdaf.batch.aes``): ``aes_rows`` calls
libcrypto's EVP functions at addresses it is given, through the small
intrinsics below (a call through a pointer passed as an integer, so the
machine code holds no address and numba can cache it).
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# Compiled at import, under veil.vdaf.batch.kernels' cache lock: explicit
# signatures over C-contiguous arrays.
_U2 = "uint64[:, ::1]"
_U3 = "uint64[:, :, ::1]"
_U4 = "uint64[:, :, :, ::1]"
_B2 = "boolean[:, ::1]"
_I1 = "intp[::1]"

_P64 = np.uint64(2**64 - 2**32 + 1)
_ONE = np.uint64(1)

# -- calls into libcrypto (veil.vdaf.batch.aes) ------------------------------

_PTR = ir.IntType(8).as_pointer()
_INT = ir.IntType(32)


def _function(builder, address, returns, params):
    return builder.inttoptr(address, ir.FunctionType(returns, params).as_pointer())


@intrinsic
def _ctx_new(typingctx, fn):
    """``EVP_CIPHER_CTX *EVP_CIPHER_CTX_new(void)`` at ``fn``."""

    def codegen(context, builder, sig, args):
        made = builder.call(_function(builder, args[0], _PTR, []), [])
        return builder.ptrtoint(made, ir.IntType(64))

    return types.uint64(types.uint64), codegen


@intrinsic
def _ctx_free(typingctx, fn, ctx):
    """``void EVP_CIPHER_CTX_free(EVP_CIPHER_CTX *)`` at ``fn``."""

    def codegen(context, builder, sig, args):
        free = _function(builder, args[0], ir.VoidType(), [_PTR])
        builder.call(free, [builder.inttoptr(args[1], _PTR)])
        return context.get_dummy_value()

    return types.void(types.uint64, types.uint64), codegen


@intrinsic
def _encrypt_init(typingctx, fn, ctx, cipher, key):
    """``int EVP_EncryptInit_ex(ctx, cipher, NULL, key, NULL)`` at ``fn``
    (``cipher`` or ``key`` 0 for NULL: keep the current one)."""

    def codegen(context, builder, sig, args):
        init = _function(builder, args[0], _INT, [_PTR] * 5)
        null = ir.Constant(_PTR, None)
        ctx, cipher, key = (builder.inttoptr(a, _PTR) for a in args[1:])
        return builder.call(init, [ctx, cipher, null, key, null])

    return types.int32(types.uint64, types.uint64, types.uint64, types.uint64), codegen


@intrinsic
def _set_padding(typingctx, fn, ctx, pad):
    """``int EVP_CIPHER_CTX_set_padding(ctx, pad)`` at ``fn``."""

    def codegen(context, builder, sig, args):
        set_padding = _function(builder, args[0], _INT, [_PTR, _INT])
        pad = builder.trunc(args[2], _INT)
        return builder.call(set_padding, [builder.inttoptr(args[1], _PTR), pad])

    return types.int32(types.uint64, types.uint64, types.int64), codegen


@intrinsic
def _encrypt_update(typingctx, fn, ctx, out, written, data, length):
    """``int EVP_EncryptUpdate(ctx, out, &written, data, length)`` at ``fn``."""

    def codegen(context, builder, sig, args):
        update = _function(builder, args[0], _INT, [_PTR, _PTR, _INT.as_pointer(), _PTR, _INT])
        ctx, out, data = (builder.inttoptr(args[i], _PTR) for i in (1, 2, 4))
        written = builder.inttoptr(args[3], _INT.as_pointer())
        return builder.call(update, [ctx, out, written, data, builder.trunc(args[5], _INT)])

    u64 = types.uint64
    return types.int32(u64, u64, u64, u64, u64, types.int64), codegen


@nb.njit("int64(uint64[::1], uint8[:, ::1], uint8[:, ::1], uint8[:, ::1])", cache=True)
def aes_rows(calls, keys, blocks, out):
    """AES-128-ECB of each row of ``blocks`` under the same row of ``keys``
    (16 bytes) into ``out``, through libcrypto: ``calls`` holds the
    addresses of EVP_CIPHER_CTX_new, EVP_CIPHER_CTX_free,
    EVP_EncryptInit_ex, EVP_CIPHER_CTX_set_padding, EVP_EncryptUpdate and
    the AES-128-ECB cipher. One context, keyed again for each row (the key
    schedule is cheaper than a context per key). The number of calls that
    failed (or wrote other than a row's length): 0 when all is well."""
    new, free, init, set_padding, update, cipher = (
        calls[0],
        calls[1],
        calls[2],
        calls[3],
        calls[4],
        calls[5],
    )
    rows, width = blocks.shape[0], blocks.shape[1]
    # Every row one key, one output row of its length, whole blocks, and a
    # length EVP_EncryptUpdate's int holds: else nothing is called.
    if (
        keys.shape[0] != rows
        or keys.shape[1] != 16
        or out.shape[0] != rows
        or out.shape[1] != width
        or width % 16 != 0
        or width > 2**31 - 16
    ):
        return rows + 1
    ctx = _ctx_new(new)
    if ctx == 0:
        return rows + 1
    failed = 0
    if _encrypt_init(init, ctx, cipher, 0) != 1 or _set_padding(set_padding, ctx, 0) != 1:
        failed += 1
    written = np.zeros(1, dtype=np.int32)
    key_at, in_at, out_at = keys.ctypes.data, blocks.ctypes.data, out.ctypes.data
    # Addresses stay uint64 (uint64 mixed with int64 would be a float).
    step, key_step = np.uint64(width), np.uint64(16)
    for r in range(rows):
        if failed:
            break
        at = np.uint64(r)
        if _encrypt_init(init, ctx, 0, key_at + at * key_step) != 1:
            # Not keyed: the row would be encrypted under the previous key.
            failed += 1
            break
        done = _encrypt_update(
            update, ctx, out_at + at * step, written.ctypes.data, in_at + at * step, width
        )
        if done != 1 or written[0] != width:
            failed += 1
    _ctx_free(free, ctx)
    return failed


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
