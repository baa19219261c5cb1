"""The raw RSA private operation from the system's OpenSSL (libcrypto 3).

`cryptography` exposes RSA only with padding, and RFC 9474's signer needs
the bare operation on the blinded message. OpenSSL's (EVP_PKEY_decrypt with
RSA_NO_PADDING) blinds its input, uses the CRT and constant-time
exponentiation, and signs about 20 times faster here than pycryptodome's,
which `blindrsa` falls back to when no libcrypto 3 can be loaded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

RSA_NO_PADDING = 3


def _load() -> Any:
    name = ctypes.util.find_library("crypto")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.OpenSSL_version_num.restype = ctypes.c_ulong
        if lib.OpenSSL_version_num() < 0x30000000:
            return None
    except (OSError, AttributeError):
        return None
    vp = ctypes.c_void_p
    lib.d2i_AutoPrivateKey.restype = vp
    lib.d2i_AutoPrivateKey.argtypes = [vp, ctypes.POINTER(ctypes.c_char_p), ctypes.c_long]
    lib.EVP_PKEY_free.argtypes = [vp]
    lib.EVP_PKEY_CTX_new.restype = vp
    lib.EVP_PKEY_CTX_new.argtypes = [vp, vp]
    lib.EVP_PKEY_CTX_free.argtypes = [vp]
    lib.EVP_PKEY_decrypt_init.argtypes = [vp]
    lib.EVP_PKEY_CTX_set_rsa_padding.argtypes = [vp, ctypes.c_int]
    lib.EVP_PKEY_decrypt.argtypes = [
        vp,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.EVP_PKEY_encrypt_init.argtypes = [vp]
    lib.EVP_PKEY_encrypt.argtypes = lib.EVP_PKEY_decrypt.argtypes
    return lib


_LIB = _load()


def available() -> bool:
    return _LIB is not None


class RawPrivateKey:
    """An OpenSSL key for the bare RSA private operation; raises OSError if unusable."""

    def __init__(self, pkcs8_der: bytes) -> None:
        if _LIB is None:
            raise OSError("no OpenSSL 3 libcrypto")
        buf = ctypes.c_char_p(pkcs8_der)
        self._pkey = _LIB.d2i_AutoPrivateKey(None, ctypes.byref(buf), len(pkcs8_der))
        if not self._pkey:
            raise OSError("OpenSSL could not read the key")

    def __del__(self) -> None:
        if _LIB is not None and getattr(self, "_pkey", None):
            _LIB.EVP_PKEY_free(self._pkey)

    def private_op(self, data: bytes) -> bytes:
        """data^d mod n as len(data) bytes; raises OSError if OpenSSL refuses."""
        return self._op(data, private=True)

    def public_op(self, data: bytes) -> bytes:
        """data^e mod n as len(data) bytes (the check of a signature, with
        the GIL released, where Python's pow holds it for about 140 µs at
        RSA-2048); raises OSError if OpenSSL refuses."""
        return self._op(data, private=False)

    def _op(self, data: bytes, *, private: bool) -> bytes:
        assert _LIB is not None
        ctx = _LIB.EVP_PKEY_CTX_new(self._pkey, None)
        if not ctx:
            raise OSError("EVP_PKEY_CTX_new failed")
        init, run = (
            (_LIB.EVP_PKEY_decrypt_init, _LIB.EVP_PKEY_decrypt)
            if private
            else (_LIB.EVP_PKEY_encrypt_init, _LIB.EVP_PKEY_encrypt)
        )
        try:
            if init(ctx) <= 0:
                raise OSError(
                    "EVP_PKEY_decrypt_init failed" if private else "EVP_PKEY_encrypt_init failed"
                )
            if _LIB.EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_NO_PADDING) <= 0:
                raise OSError("EVP_PKEY_CTX_set_rsa_padding failed")
            out = ctypes.create_string_buffer(len(data))
            outlen = ctypes.c_size_t(len(data))
            if run(ctx, out, ctypes.byref(outlen), data, len(data)) <= 0:
                raise OSError(f"the RSA {'private' if private else 'public'} operation failed")
            return out.raw[: outlen.value].rjust(len(data), b"\x00")
        finally:
            _LIB.EVP_PKEY_CTX_free(ctx)
