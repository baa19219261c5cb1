"""RSA blind signatures, RFC 9474: RSABSSA-SHA384-PSS-Deterministic and
RSABSSA-SHA384-PSS-Randomized.

veil implements those two of the RFC's four variants (section 5); tokens use
the deterministic one (TOKEN_VARIANT), as RFC 9578 asks of its token type
0x0002. The PSSZERO variants (no salt) are refused by name (`variant`), and
`blind` refuses the empty salt that would make them. The modulus is the key's: any size
from MIN_MODULUS_BITS up (the RFC's own test vectors use RSA-4096), and every
length follows it; veil's deployments generate RSA-2048 keys (MODULUS_BITS,
the size a token's authenticator has, veil.invite.token).

The RFC's operations, named as in its section 4: `prepare_identity` and
`prepare` (4.1: the message itself for the deterministic variant, a 32-byte
random prefix and the message for the randomized one), `blind` (4.2), `blind_sign`
(4.3), `finalize` (4.4), and `verify` (RSASSA-PSS verification with SHA-384,
MGF1-SHA-384 and a 48-byte salt, as section 4.5 says).

Keys are `cryptography` RSA keys. The private operation of `blind_sign` is
never a plain `pow` on the secret exponent: it is OpenSSL's (libcrypto 3,
through `veil.invite._openssl`: blinding, CRT, constant-time
exponentiation), or, where no libcrypto 3 can be loaded, pycryptodome's RSA
decryption primitive (also blinded, with the CRT), about 20 times slower.
Either way the signer's timing does not follow the attacker-chosen blinded
message. As the RFC requires, the result is checked with the public exponent
before it is returned, so a faulty computation never leaves the signer.
Randomness comes from `secrets`.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from veil.invite import _openssl

if TYPE_CHECKING:
    from Crypto.PublicKey import RSA as _PyRSA

HASH = hashlib.sha384
H_LEN = 48
S_LEN = 48  # PSS salt length: the hash's length (RSABSSA-SHA384-PSS)
PREFIX_LEN = 32  # the randomized variant's message prefix (section 4.1)
MODULUS_BITS = 2048  # the keys veil generates, and a token's authenticator
K_LEN = MODULUS_BITS // 8
MIN_MODULUS_BITS = 2048  # nothing smaller is taken, from anyone
PUBLIC_EXPONENT = 65537
RANDOMIZED = "RSABSSA-SHA384-PSS-Randomized"
DETERMINISTIC = "RSABSSA-SHA384-PSS-Deterministic"
VARIANTS = (DETERMINISTIC, RANDOMIZED)
TOKEN_VARIANT = DETERMINISTIC  # RFC 9578 section 6, token type 0x0002
_REFUSED_VARIANTS = (
    "RSABSSA-SHA384-PSSZERO-Randomized",
    "RSABSSA-SHA384-PSSZERO-Deterministic",
)


class BlindRSAError(ValueError):
    """A blinding, signing or finalising step failed (RFC 9474's errors)."""


def variant(name: str) -> str:
    """`name` if it is a variant veil implements; BlindRSAError otherwise,
    saying which one it is."""
    if name in VARIANTS:
        return name
    known = "one of RFC 9474's variants" if name in _REFUSED_VARIANTS else "not an RFC 9474 variant"
    raise BlindRSAError(
        f"{name} is {known} that veil does not implement: only {' and '.join(VARIANTS)}"
    )


def generate_key(bits: int = MODULUS_BITS) -> rsa.RSAPrivateKey:
    """A fresh RSA key (e = 65537) for signing tokens, RSA-2048 unless asked."""
    if bits < MIN_MODULUS_BITS:
        raise BlindRSAError(f"the modulus must be at least {MIN_MODULUS_BITS} bits, not {bits}")
    return rsa.generate_private_key(public_exponent=PUBLIC_EXPONENT, key_size=bits)


def modulus_len(pk: rsa.RSAPublicKey) -> int:
    """The key's modulus length in bytes (the RFC's modulus_len): the length of
    a blinded message, a blind signature, an inverse and a signature."""
    return (_numbers(pk)[0].bit_length() + 7) // 8


def _i2osp(x: int, length: int) -> bytes:
    return x.to_bytes(length, "big")


def _os2ip(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _mgf1(seed: bytes, length: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += HASH(seed + counter.to_bytes(4, "big")).digest()
        counter += 1
    return bytes(out[:length])


def emsa_pss_encode(msg: bytes, em_bits: int, salt: bytes) -> bytes:
    """EMSA-PSS-ENCODE (RFC 8017 section 9.1.1) with SHA-384 and MGF1-SHA-384."""
    em_len = (em_bits + 7) // 8
    if em_len < H_LEN + len(salt) + 2:
        raise BlindRSAError("encoding error: the modulus is too small")
    m_hash = HASH(msg).digest()
    h = HASH(b"\x00" * 8 + m_hash + salt).digest()
    db = b"\x00" * (em_len - len(salt) - H_LEN - 2) + b"\x01" + salt
    masked = bytearray(a ^ b for a, b in zip(db, _mgf1(h, em_len - H_LEN - 1), strict=True))
    masked[0] &= 0xFF >> (8 * em_len - em_bits)
    return bytes(masked) + h + b"\xbc"


def prepare_identity(msg: bytes) -> bytes:
    """Section 4.1, PrepareIdentity (the deterministic variants): msg itself."""
    return msg


def prepare(msg: bytes, prefix: bytes | None = None) -> bytes:
    """Section 4.1, PrepareRandomize: a 32-byte prefix (random unless given) || msg."""
    if prefix is None:
        prefix = secrets.token_bytes(PREFIX_LEN)
    if not prefix:
        raise BlindRSAError(
            f"an empty prefix is the deterministic variant: use prepare_identity ({DETERMINISTIC})"
        )
    if len(prefix) != PREFIX_LEN:
        raise BlindRSAError(f"the prefix must be {PREFIX_LEN} bytes")
    return prefix + msg


@dataclass(frozen=True)
class Blinded:
    """`blind`'s output: the message for the signer and the secret inverse."""

    blinded_msg: bytes
    inv: bytes


def _numbers(pk: rsa.RSAPublicKey) -> tuple[int, int]:
    n = pk.public_numbers()
    if n.n.bit_length() < MIN_MODULUS_BITS:
        raise BlindRSAError(f"the key must be RSA-{MIN_MODULUS_BITS} or larger")
    return n.n, n.e


def blind(
    pk: rsa.RSAPublicKey, msg: bytes, *, salt: bytes | None = None, r: int | None = None
) -> Blinded:
    """Section 4.2. `msg` is the prepared message; `salt` and `r` are drawn
    from `secrets` unless given (tests give them to reproduce a run)."""
    n, e = _numbers(pk)
    k_len = (n.bit_length() + 7) // 8
    if salt is None:
        salt = secrets.token_bytes(S_LEN)
    if len(salt) != S_LEN:
        raise BlindRSAError(
            f"the salt must be {S_LEN} bytes (PSSZERO variants are refused: veil implements "
            f"{' and '.join(VARIANTS)})"
        )
    encoded = emsa_pss_encode(msg, n.bit_length() - 1, salt)
    m = _os2ip(encoded)
    if _gcd(m, n) != 1:
        raise BlindRSAError("invalid input: the message shares a factor with the modulus")
    while r is None:
        candidate = secrets.randbelow(n - 1) + 1
        if _gcd(candidate, n) == 1:
            r = candidate
    if not 1 <= r < n or _gcd(r, n) != 1:
        raise BlindRSAError("blinding error: r is not invertible modulo n")
    inv = pow(r, -1, n)
    x = pow(r, e, n)
    z = (m * x) % n
    return Blinded(_i2osp(z, k_len), _i2osp(inv, k_len))


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@lru_cache(maxsize=64)
def _pycryptodome_key(der: bytes) -> _PyRSA.RsaKey:
    # Only a signer without OpenSSL's libcrypto needs pycryptodome's RSA: its
    # import (ASN.1, big integers) is not paid by every process that verifies.
    from Crypto.PublicKey import RSA as _PyRSA

    return _PyRSA.import_key(der)


def _private_der(sk: rsa.RSAPrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return sk.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Signer:
    """A private key ready for `blind_sign` (the key converted once)."""

    def __init__(self, sk: rsa.RSAPrivateKey, *, use_openssl: bool = True) -> None:
        self.public_key = sk.public_key()
        self._n, self._e = _numbers(self.public_key)
        self.modulus_len = (self._n.bit_length() + 7) // 8
        der = _private_der(sk)
        self._openssl = (
            _openssl.RawPrivateKey(der) if use_openssl and _openssl.available() else None
        )
        self._key = None if self._openssl is not None else _pycryptodome_key(der)

    def _private_op(self, m: int) -> int:
        if self._openssl is not None:
            return _os2ip(self._openssl.private_op(_i2osp(m, self.modulus_len)))
        assert self._key is not None
        return _os2ip(self._key._decrypt_to_bytes(m))  # type: ignore[no-untyped-call]

    def check(self, blinded_msg: bytes) -> int:
        """`blinded_msg` as an integer, if it is one this key can sign
        (modulus_len bytes, below the modulus); BlindRSAError otherwise."""
        if len(blinded_msg) != self.modulus_len:
            raise BlindRSAError(f"a blinded message is exactly {self.modulus_len} bytes")
        m = _os2ip(blinded_msg)
        if m >= self._n:
            raise BlindRSAError("the blinded message is not below the modulus")
        return m

    def blind_sign(self, blinded_msg: bytes) -> bytes:
        """Section 4.3: the blind signature of `blinded_msg` (modulus_len bytes)."""
        m = self.check(blinded_msg)
        s = self._private_op(m)
        if self._public_op(s) != m:
            raise BlindRSAError("signing failed: the signature does not verify")
        return _i2osp(s, self.modulus_len)

    def _public_op(self, s: int) -> int:
        if self._openssl is not None:
            return _os2ip(self._openssl.public_op(_i2osp(s, self.modulus_len)))
        return pow(s, self._e, self._n)


def blind_sign(sk: rsa.RSAPrivateKey, blinded_msg: bytes) -> bytes:
    """Section 4.3 with a key converted for this call (see `Signer`)."""
    return Signer(sk).blind_sign(blinded_msg)


_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=S_LEN)


def verify(pk: rsa.RSAPublicKey, msg: bytes, sig: bytes) -> bool:
    """RSASSA-PSS-VERIFY of the prepared `msg` (section 4.5)."""
    if len(sig) != modulus_len(pk):
        return False
    try:
        pk.verify(sig, msg, _PSS, hashes.SHA384())
    except InvalidSignature:
        return False
    return True


def finalize(pk: rsa.RSAPublicKey, msg: bytes, blind_sig: bytes, inv: bytes) -> bytes:
    """Section 4.4: unblind and check; the signature of the prepared `msg`."""
    n, _ = _numbers(pk)
    k_len = (n.bit_length() + 7) // 8
    if len(blind_sig) != k_len:
        raise BlindRSAError(f"a blind signature is exactly {k_len} bytes")
    if len(inv) != k_len:
        raise BlindRSAError(f"an inverse is exactly {k_len} bytes")
    z = _os2ip(blind_sig)
    if z >= n:
        raise BlindRSAError("the blind signature is not below the modulus")
    sig = _i2osp((z * _os2ip(inv)) % n, k_len)
    if not verify(pk, msg, sig):
        raise BlindRSAError("the issuer's signature does not verify")
    return sig
