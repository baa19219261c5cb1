"""numba kernel of the XOF behind ``veil.vdaf.batch.kernels``: TurboSHAKE128
of each row of a byte array (``veil.vdaf.batch.xof``). Import that module,
not this one (see ``veil.vdaf.batch._field128_kernels``).
"""

import numba as nb
import numpy as np

_U64 = np.uint64
# Helpers inlined into the kernel (compiled only as part of it); explicit
# signatures, so that compiling (or loading from numba's cache) happens when
# this module is imported, under veil.vdaf.batch.kernels' inter-process lock.
_inline = nb.njit(inline="always")
# Messages often come straight from ``bytes`` (read-only buffers).
_RO_U8 = nb.types.Array(nb.types.uint8, 2, "C", readonly=True)

# Keccak-p[1600, 12] (FIPS 202's permutation with the last 12 of its 24
# rounds) and the TurboSHAKE128 sponge over it: rate 168 bytes, capacity 32.
# Lanes are read and written little-endian, as the standard orders them.
_KECCAK_RC = np.array(
    [
        0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000,
        0x000000000000808B, 0x0000000080000001, 0x8000000080008081, 0x8000000000008009,
        0x000000000000008A, 0x0000000000000088, 0x0000000080008009, 0x000000008000000A,
        0x000000008000808B, 0x800000000000008B, 0x8000000000008089, 0x8000000000008003,
        0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
        0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008,
    ],
    dtype=np.uint64,
)  # fmt: skip
# The rho-pi walk: lane visited at step i and the rotation it gets there.
_KECCAK_PI = np.array(
    [10, 7, 11, 17, 18, 3, 5, 16, 8, 21, 24, 4, 15, 23, 19, 13, 12, 2, 20, 14, 22, 9, 6, 1],
    dtype=np.int64,
)
_KECCAK_ROT = np.array(
    [1, 3, 6, 10, 15, 21, 28, 36, 45, 55, 2, 14, 27, 41, 56, 8, 25, 43, 62, 18, 39, 61, 20, 44],
    dtype=np.uint64,
)
_RATE = 168  # bytes
_RATE_LANES = 21


@_inline
def _keccak_p12(s, c):
    """Keccak-p[1600, 12] on the 25 lanes ``s`` in place (``c``: 5 scratch lanes)."""
    sixty_four = _U64(64)
    for rnd in range(12, 24):
        for x in range(5):
            c[x] = s[x] ^ s[x + 5] ^ s[x + 10] ^ s[x + 15] ^ s[x + 20]
        for x in range(5):
            left = c[(x + 1) % 5]
            d = c[(x + 4) % 5] ^ ((left << _U64(1)) | (left >> _U64(63)))
            for y in range(0, 25, 5):
                s[y + x] ^= d
        t = s[1]
        for i in range(24):
            j = _KECCAK_PI[i]
            nxt = s[j]
            r = _KECCAK_ROT[i]
            s[j] = (t << r) | (t >> (sixty_four - r))
            t = nxt
        for y in range(0, 25, 5):
            for x in range(5):
                c[x] = s[y + x]
            for x in range(5):
                s[y + x] = c[x] ^ (~c[(x + 1) % 5] & c[(x + 2) % 5])
        s[0] ^= _KECCAK_RC[rnd]


@nb.njit(
    [
        "void(uint8[:, ::1], uint8, uint8[:, ::1])",
        nb.void(_RO_U8, nb.uint8, nb.uint8[:, ::1]),
    ],
    cache=True,
)
def turboshake128_rows(messages, domain, out):
    """TurboSHAKE128 with domain byte ``domain`` of each row of ``messages``
    into the same row of ``out`` (as many bytes as ``out`` has columns)."""
    rows, msg_len = messages.shape
    out_len = out.shape[1]
    state = np.zeros(25, np.uint64)
    scratch = np.zeros(5, np.uint64)
    block = np.zeros(_RATE, np.uint8)
    lanes = block.view(np.uint64)
    state_bytes = state.view(np.uint8)
    for row in range(rows):
        state[:] = 0
        pos = 0
        while msg_len - pos >= _RATE:
            block[:] = messages[row, pos : pos + _RATE]
            for i in range(_RATE_LANES):
                state[i] ^= lanes[i]
            _keccak_p12(state, scratch)
            pos += _RATE
        rest = msg_len - pos
        block[:] = 0
        block[:rest] = messages[row, pos:msg_len]
        block[rest] ^= domain
        block[_RATE - 1] ^= np.uint8(0x80)
        for i in range(_RATE_LANES):
            state[i] ^= lanes[i]
        _keccak_p12(state, scratch)
        done = 0
        while True:
            take = min(_RATE, out_len - done)
            out[row, done : done + take] = state_bytes[:take]
            done += take
            if done >= out_len:
                break
            _keccak_p12(state, scratch)
