"""AES-128 of many reports' blocks, each report under its own key: the
fixed-key AES of XofFixedKeyAes128 (draft-irtf-cfrg-vdaf-20, Section
6.2.2) in the batched IDPF (``veil.vdaf.batch.idpf``).

A report's key is derived from its nonce, so a batch has as many AES keys
as reports. Through ``cryptography`` each key is a cipher context: about
7 µs to create (OpenSSL 3 looks the cipher up again for each, and Python
checks the objects) and 0.3 µs a call. At a level walked from the root,
where a report has few nodes, creating the contexts was most of the cost.
So ``RowAes`` calls the process's libcrypto (OpenSSL 3, its stable EVP
interface) from one compiled loop (``_idpf_kernels.aes_rows``): one cipher
context per call, keyed again for each report (the key schedule, well
under a tenth of a µs), then one ``EVP_EncryptUpdate`` on the report's
blocks. The AES is OpenSSL's own choice of implementation for the CPU
(AES-NI, or its constant-time vector-permutation code on a CPU without AES
instructions), as through ``cryptography``; veil has no AES of its own, so
the secret keys never index a table.

The library is found by ``ctypes.util.find_library("crypto")`` and must be
OpenSSL 3 or later and give FIPS-197's AES-128 example at first use. If
anything is missing, ``RowAes`` uses one ``cryptography`` context per
report instead: the same bytes, slower (``backend()`` says which).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import operator
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from veil.vdaf.batch.field import Arr
from veil.vdaf.batch.kernels import idpf_kernels

# A report's AES-128-ECB under its key through ``cryptography``:
# ``update_into(data, out)``.
Encrypt = Callable[[Any, Any], int]

_LITTLE = sys.byteorder == "little"
_CALLS = (
    "EVP_CIPHER_CTX_new",
    "EVP_CIPHER_CTX_free",
    "EVP_EncryptInit_ex",
    "EVP_CIPHER_CTX_set_padding",
    "EVP_EncryptUpdate",
)
# FIPS-197's two AES-128 examples (Appendix B, Appendix C.1) as two rows,
# each block three times: (key, plaintext, ciphertext).
_KNOWN = (
    (
        "2b7e151628aed2a6abf7158809cf4f3c",
        "3243f6a8885a308d313198a2e0370734",
        "3925841d02dc09fbdc118597196a0b32",
    ),
    (
        "000102030405060708090a0b0c0d0e0f",
        "00112233445566778899aabbccddeeff",
        "69c4e0d86a7b0430d8cdb78070b4c55a",
    ),
)


@dataclass(frozen=True)
class _Libcrypto:
    """The library, the addresses ``aes_rows`` calls (``_CALLS``, then the
    fetched AES-128-ECB cipher) and the library's version text."""

    library: ctypes.CDLL | None
    calls: Arr
    version: str


def _load() -> _Libcrypto | None:
    name = ctypes.util.find_library("crypto")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.OpenSSL_version_num.restype = ctypes.c_ulong
        if lib.OpenSSL_version_num() < 0x30000000:
            return None
        lib.OpenSSL_version.restype = ctypes.c_char_p
        lib.OpenSSL_version.argtypes = [ctypes.c_int]
        version = (lib.OpenSSL_version(0) or b"OpenSSL").decode("ascii", "replace")
        fetch = lib.EVP_CIPHER_fetch
        fetch.restype = ctypes.c_void_p
        fetch.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
        # Fetched once for the process (never freed): a re-key then skips
        # the lookup that makes a context cost microseconds.
        cipher = fetch(None, b"AES-128-ECB", None)
        if not cipher:
            return None
        addresses = [ctypes.cast(getattr(lib, f), ctypes.c_void_p).value for f in _CALLS]
    except (OSError, AttributeError):
        return None
    if not all(addresses):
        return None
    loaded = _Libcrypto(lib, np.array([*addresses, cipher], dtype=np.uint64), version)
    keys = np.array([list(bytes.fromhex(k)) for k, _, _ in _KNOWN], dtype=np.uint8)
    blocks = np.array([list(bytes.fromhex(p) * 3) for _, p, _ in _KNOWN], dtype=np.uint8)
    try:
        out = _encrypt_libcrypto(loaded, keys, blocks)
    except RuntimeError:
        return None
    expected = b"".join(bytes.fromhex(c) * 3 for _, _, c in _KNOWN)
    return loaded if out.tobytes() == expected else None


_lock = threading.Lock()
_UNSET = _Libcrypto(None, np.zeros(0, dtype=np.uint64), "")
_loaded: _Libcrypto | None = _UNSET


def _libcrypto() -> _Libcrypto | None:
    """libcrypto's calls, found and checked on first use; ``None`` if the
    process has no usable libcrypto."""
    global _loaded
    if _loaded is _UNSET:
        with _lock:
            if _loaded is _UNSET:
                _loaded = _load()
    return _loaded


def backend() -> str:
    """Which AES ``RowAes`` runs: libcrypto's version, or ``cryptography``."""
    lib = _libcrypto()
    return f"libcrypto ({lib.version})" if lib is not None else "cryptography"


def _encrypt_libcrypto(lib: _Libcrypto, keys: Arr, blocks: Arr) -> Arr:
    out = np.empty_like(blocks)
    if idpf_kernels().aes_rows(lib.calls, keys, blocks, out):
        raise RuntimeError("libcrypto's AES-128-ECB failed")
    return out


def _encrypt_each(encrypts: list[Encrypt], blocks: Arr) -> Arr:
    """One ``cryptography`` call per row, each writing into its row of one
    buffer; the loop over rows runs in C (``map``)."""
    rows, width = blocks.shape
    # update_into wants room for a block beyond its input: the next row's
    # (written after), and 16 spare bytes at the end.
    out = np.empty(blocks.nbytes + 16, dtype=np.uint8)
    source = blocks.data.cast("B")
    target = out.data
    starts = range(0, rows * width, width)
    ins = map(source.__getitem__, map(slice, starts, range(width, rows * width + 1, width)))
    outs = map(target.__getitem__, map(slice, starts, range(width + 16, rows * width + 17, width)))
    deque(map(operator.call, encrypts, ins, outs), maxlen=0)
    return out[: blocks.nbytes].reshape(rows, width)


class RowAes:
    """AES-128 (ECB) of each report's blocks under the report's own key:
    ``keys`` is ``(reports, 16)`` ``uint8``. Through libcrypto where the
    process has it, else ``cryptography`` (its contexts made at the first
    ``encrypt`` and kept, so a walk of many depths makes them once)."""

    def __init__(self, keys: Arr) -> None:
        # The compiled call takes C-ordered, writable arrays.
        keys = np.require(keys, np.uint8, ["C", "W"])
        if keys.ndim != 2 or keys.shape[1] != 16:
            raise ValueError("AES-128 keys are (reports, 16) bytes")
        self.keys = keys
        self._encrypts: list[Encrypt] | None = None

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def part(self, rows: slice) -> RowAes:
        """The same reports' rows ``rows``."""
        part = RowAes(self.keys[rows])
        if self._encrypts is not None:
            part._encrypts = self._encrypts[rows]
        return part

    def encrypt(self, blocks: Arr) -> Arr:
        """``blocks`` is ``(reports, ..., 2)`` ``uint64`` (two little-endian
        words per 16-byte block); each report's blocks under its key, the
        same shape."""
        rows = blocks.shape[0]
        if rows != len(self):
            raise ValueError("one row of blocks per key")
        words = np.require(blocks, "<u8", ["C", "W"])
        raw = words.view(np.uint8).reshape(rows, words.nbytes // rows if rows else 0)
        lib = _libcrypto()
        if rows == 0 or raw.shape[1] == 0:
            out = raw.copy()
        elif lib is not None:
            out = _encrypt_libcrypto(lib, self.keys, raw)
        else:
            if self._encrypts is None:
                ecb = modes.ECB()
                self._encrypts = [
                    Cipher(algorithms.AES(key.tobytes()), ecb).encryptor().update_into
                    for key in self.keys
                ]
            out = _encrypt_each(self._encrypts, raw)
        hashed = out.view("<u8").reshape(blocks.shape)
        return hashed if _LITTLE else hashed.astype(np.uint64)
