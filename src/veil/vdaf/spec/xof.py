"""Extendable-output functions (draft-irtf-cfrg-vdaf-18, Section 6.2).

An XOF is keyed by a seed, a domain-separation tag and a binder string and
yields an unbounded byte stream, from which field vectors are drawn by
rejection sampling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from Crypto.Hash import TurboSHAKE128
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from veil.vdaf.spec.field import Field


class Xof(ABC):
    SEED_SIZE: ClassVar[int]

    @abstractmethod
    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None: ...

    @abstractmethod
    def next(self, length: int) -> bytes:
        """The next ``length`` bytes of the stream."""

    def next_vec(self, field: type[Field], length: int) -> list[int]:
        """The next ``length`` field elements: each candidate is
        ``ENCODED_SIZE`` little-endian bytes, masked to the modulus' bit
        length and kept only if reduced. Reading several candidates at once
        consumes the stream exactly as reading them one by one."""
        size = field.ENCODED_SIZE
        p = field.MODULUS
        mask = (1 << p.bit_length()) - 1
        vec: list[int] = []
        while len(vec) < length:
            missing = length - len(vec)
            chunk = self.next(missing * size)
            for i in range(0, len(chunk), size):
                x = int.from_bytes(chunk[i : i + size], "little") & mask
                if x < p:
                    vec.append(x)
        return vec

    @classmethod
    def derive_seed(cls, seed: bytes, dst: bytes, binder: bytes) -> bytes:
        return cls(seed, dst, binder).next(cls.SEED_SIZE)

    @classmethod
    def expand_into_vec(
        cls, field: type[Field], seed: bytes, dst: bytes, binder: bytes, length: int
    ) -> list[int]:
        return cls(seed, dst, binder).next_vec(field, length)


def _check_seed(cls: type[Xof], seed: bytes) -> None:
    if len(seed) != cls.SEED_SIZE:
        raise ValueError(f"{cls.__name__} seed must be {cls.SEED_SIZE} bytes, got {len(seed)}")


class XofTurboShake128(Xof):
    """TurboSHAKE128 (RFC 9861) with domain byte 1 over
    ``le16(len(dst)) || dst || le8(len(seed)) || seed || binder``.

    Seeds are ``SEED_SIZE`` bytes by default; the draft allows other lengths
    up to 255 (Poplar1's IDPF hashes its 16-byte seeds with it at the leaf)."""

    SEED_SIZE = 32

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        if len(seed) > 255:
            raise ValueError(f"XofTurboShake128 seed must be at most 255 bytes, got {len(seed)}")
        self._h = TurboSHAKE128.new(domain=1)
        self._h.update(len(dst).to_bytes(2, "little") + dst + len(seed).to_bytes(1, "little"))
        self._h.update(seed)
        self._h.update(binder)

    def next(self, length: int) -> bytes:
        """The next ``length`` bytes of the stream."""
        out: bytes = self._h.read(length)
        return out


class FixedKeyAes128:
    """The keyed half of XofFixedKeyAes128: the AES-128 key that
    TurboSHAKE128 (domain byte 2) derives from ``le16(len(dst)) || dst ||
    binder``, and the hash of stream blocks under it. The key depends only on
    the tag and the binder, so one instance serves every seed used with them
    (the IDPF hashes a few hundred seeds per report under one nonce); the
    draft notes this step may be cached across evaluations."""

    __slots__ = ("_encrypt",)

    def __init__(self, dst: bytes, binder: bytes) -> None:
        h = TurboSHAKE128.new(domain=2)
        h.update(len(dst).to_bytes(2, "little") + dst + binder)
        # ECB has no state between calls: one encryptor serves every block.
        # (OpenSSL through `cryptography` costs a twentieth of
        # pycryptodome's per call, and this is called per tree node.)
        self._encrypt = Cipher(algorithms.AES(h.read(16)), modes.ECB()).encryptor().update

    def hash_blocks(self, seed: int, first: int, count: int) -> bytes:
        """Blocks ``first`` to ``first + count - 1`` of the stream of ``seed``
        (an int of its 16 little-endian bytes): ``AES(s) xor s`` for each
        ``s = sigma(seed xor le128(i))``, ``sigma(lo || hi) = hi || (hi xor lo)``."""
        low = (1 << 64) - 1
        sigmas = b"".join(
            ((b >> 64) | (((b >> 64) ^ (b & low)) << 64)).to_bytes(16, "little")
            for b in (seed ^ i for i in range(first, first + count))
        )
        encrypted = self._encrypt(sigmas)
        mixed = int.from_bytes(encrypted, "little") ^ int.from_bytes(sigmas, "little")
        return mixed.to_bytes(16 * count, "little")

    def xof(self, seed: bytes) -> XofFixedKeyAes128:
        """The XOF of ``seed`` under this key (the same stream as
        ``XofFixedKeyAes128(seed, dst, binder)``)."""
        return XofFixedKeyAes128.keyed(seed, self)


class XofFixedKeyAes128(Xof):
    """A circular correlation-robust hash from fixed-key AES-128 (GKWWY20):
    the key is TurboSHAKE128 (domain byte 2) of the tag and binder, and block
    i of the stream is ``AES(s) xor s`` with ``s = sigma(seed xor le128(i))``,
    ``sigma(lo || hi) = hi || (hi xor lo)`` (``FixedKeyAes128``)."""

    SEED_SIZE = 16

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        _check_seed(type(self), seed)
        self._key = FixedKeyAes128(dst, binder)
        self._seed = int.from_bytes(seed, "little")
        self._consumed = 0

    @classmethod
    def keyed(cls, seed: bytes, key: FixedKeyAes128) -> XofFixedKeyAes128:
        """The XOF of ``seed`` under a key already derived from (dst, binder)."""
        _check_seed(cls, seed)
        xof = cls.__new__(cls)
        xof._key = key
        xof._seed = int.from_bytes(seed, "little")
        xof._consumed = 0
        return xof

    def next(self, length: int) -> bytes:
        """The next ``length`` bytes of the stream."""
        start = self._consumed
        end = start + length
        self._consumed = end
        if length == 0:
            return b""
        first, last = start // 16, (end - 1) // 16
        blocks = self._key.hash_blocks(self._seed, first, last - first + 1)
        offset = start - first * 16
        return blocks[offset : offset + length]
