"""XofTurboShake128 (draft-irtf-cfrg-vdaf-18, Section 6.2.1) over many seeds.

Prio3 calls its XOF several times per report on short inputs, so the
per-call overhead of the Python hash object (about 5 us: object creation,
three ``update`` calls, ``read``) dominates small circuits. Here the input
of every call is laid out in one NumPy byte array and hashed row by row in
one compiled loop (``veil.vdaf.batch._xof_kernels.turboshake128_rows``, about 0.4 us a
short row, where even pycryptodome's one-shot C entry point costs twice that
through cffi, a call per row, and made up two thirds of a batched Count
shard). Long rows (SumVec's shares, hundreds of bytes in or out) go to the
one-shot entry point, whose permutation is twice as fast as the compiled
loop's. On a big-endian machine the one-shot entry point is used (12
rounds, capacity 32 bytes, domain byte 1, which is TurboSHAKE128 by
definition), or, where that is unavailable (a pycryptodome without it, or
its ctypes backend), the public ``Crypto.Hash.TurboSHAKE128`` API; a known
answer checked at import decides. The output is the same byte stream every
way.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from Crypto.Hash import TurboSHAKE128

from veil.vdaf.batch.field import Arr, VecField
from veil.vdaf.batch.kernels import kernels
from veil.vdaf.spec.xof import XofTurboShake128

SEED_SIZE = XofTurboShake128.SEED_SIZE
_CAPACITY = 32  # bytes, TurboSHAKE128
_ROUNDS = 12
_DOMAIN = 1
_RATE = 168  # bytes


def _load_oneshot() -> tuple[Any, Any] | None:
    try:
        from Crypto.Hash.keccak import _raw_keccak_lib
        from Crypto.Util import _raw_api

        if getattr(_raw_api, "backend", None) != "cffi":
            return None
        lib = _raw_keccak_lib
        ffi = _raw_api.ffi
        msg = b"veil batch xof self-test"
        out = bytearray(40)
        if lib.keccak_oneshot(msg, len(msg), ffi.from_buffer(out), 40, _CAPACITY, _ROUNDS, _DOMAIN):
            return None
        expected = TurboSHAKE128.new(domain=_DOMAIN, data=msg).read(40)
        return (lib, ffi) if bytes(out) == expected else None
    except Exception:  # any missing private piece: use the public API
        return None


_ONESHOT = _load_oneshot()
# The compiled sponge (veil.vdaf.batch._xof_kernels) reads and writes lanes as the
# machine's words: little-endian machines only.
_COMPILED = sys.byteorder == "little"


def turboshake_rows(messages: Arr, out_len: int, domain: int = _DOMAIN) -> Arr:
    """TurboSHAKE128 (domain byte ``domain``, 1 for the XOF, 2 for the fixed
    AES keys of XofFixedKeyAes128) of each row of the ``uint8`` array
    ``messages``; a ``(rows, out_len)`` ``uint8`` array."""
    messages = np.ascontiguousarray(messages, dtype=np.uint8)
    rows, msg_len = messages.shape
    out = np.empty((rows, out_len), dtype=np.uint8)
    if rows == 0:
        return out
    # Permutations per row: the compiled loop takes about 0.4 us for one,
    # the one-shot C entry point 0.2 us plus about 0.5 us per call.
    permutations = msg_len // _RATE + 1 + (out_len - 1) // _RATE
    if _COMPILED and out_len and (_ONESHOT is None or permutations <= 3):
        kernels().turboshake128_rows(messages, np.uint8(domain), out)
        return out
    if _ONESHOT is not None:
        lib, ffi = _ONESHOT
        src = ffi.from_buffer(messages)
        dst = ffi.from_buffer(out)
        oneshot = lib.keccak_oneshot
        for i in range(rows):
            oneshot(
                src + i * msg_len, msg_len, dst + i * out_len, out_len, _CAPACITY, _ROUNDS, domain
            )
        return out
    for i in range(rows):
        h = TurboSHAKE128.new(domain=domain, data=messages[i].tobytes())
        out[i] = np.frombuffer(h.read(out_len), dtype=np.uint8)
    return out


def _as_rows(value: Arr | bytes, rows: int) -> Arr:
    if isinstance(value, bytes):
        return np.broadcast_to(np.frombuffer(value, dtype=np.uint8), (rows, len(value)))
    return _reshaped(value, rows)


def _reshaped(value: Arr, rows: int) -> Arr:
    """``value`` as ``rows`` rows (also of a batch of no report, whose
    width NumPy cannot infer)."""
    array = np.asarray(value, dtype=np.uint8)
    return array.reshape(rows, array.size // rows if rows else array.shape[-1])


def xof_rows(
    seeds: Arr | bytes,
    dst: bytes,
    binders: Arr | bytes | tuple[Arr | bytes, ...],
    out_len: int,
    rows: int,
) -> Arr:
    """``XofTurboShake128(seed, dst, binder).next(out_len)`` for each row;
    ``seeds`` and ``binders`` are ``uint8`` arrays with one row per report,
    or bytes shared by every row; a binder may also be a tuple of such
    parts, joined in order (each written into place, not concatenated
    first)."""
    seed_part = _row_part(seeds, rows)
    binder_parts = [
        _row_part(b, rows) for b in (binders if isinstance(binders, tuple) else (binders,))
    ]
    if seed_part.shape[-1] != SEED_SIZE:
        raise ValueError(f"XofTurboShake128 seeds must be {SEED_SIZE} bytes")
    prefix = len(dst).to_bytes(2, "little") + dst + SEED_SIZE.to_bytes(1, "little")
    # Each part assigned into place, a shared one broadcast by the
    # assignment: the same rows as concatenating, without building a
    # broadcast view of each shared part (a fixed cost that a batch of a few
    # reports, as a client's, felt).
    at = len(prefix) + SEED_SIZE
    width = at + sum(part.shape[-1] for part in binder_parts)
    messages = np.empty((rows, width), dtype=np.uint8)
    messages[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    messages[:, len(prefix) : at] = seed_part
    for part in binder_parts:
        messages[:, at : at + part.shape[-1]] = part
        at += part.shape[-1]
    return turboshake_rows(messages, out_len)


def _row_part(value: Arr | bytes, rows: int) -> Arr:
    """``value`` as a ``(rows, n)`` array, or as one row of n if it is bytes
    shared by every row."""
    if isinstance(value, bytes):
        return np.frombuffer(value, dtype=np.uint8)
    return _reshaped(value, rows)


def expand_rows(
    vf: type[VecField],
    seeds: Arr | bytes,
    dst: bytes,
    binders: Arr | bytes,
    length: int,
    rows: int,
) -> Arr:
    """``XofTurboShake128.expand_into_vec`` for each row: a ``(rows, length)``
    field array. Candidates are drawn in one read per row; the rare row with
    a candidate ``>= p`` (rejected by the draft's sampler, so the stream
    shifts) is redone with the scalar sampler, keeping the bytes exact."""
    raw = xof_rows(seeds, dst, binders, length * vf.ENCODED_SIZE, rows)
    vec, ok = vf.decode(raw)
    if length and not ok.all():
        bad = np.flatnonzero(~ok.all(axis=1))
        seed_rows = _as_rows(seeds, rows)
        binder_rows = _as_rows(binders, rows)
        redone = vf.from_ints(
            [
                XofTurboShake128.expand_into_vec(
                    vf.field, seed_rows[i].tobytes(), dst, binder_rows[i].tobytes(), length
                )
                for i in bad
            ]
        )
        vec[..., bad, :] = redone
    return vec
