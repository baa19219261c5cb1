"""Extendable-output functions (draft-irtf-cfrg-vdaf-18, Section 6.2).

An XOF is keyed by a seed, a domain-separation tag and a binder string and
yields an unbounded byte stream, from which field vectors are drawn by
rejection sampling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from Crypto.Cipher import AES
from Crypto.Hash import TurboSHAKE128

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
    ``le16(len(dst)) || dst || le8(len(seed)) || seed || binder``."""

    SEED_SIZE = 32

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        _check_seed(type(self), seed)
        self._h = TurboSHAKE128.new(domain=1)
        self._h.update(len(dst).to_bytes(2, "little") + dst + len(seed).to_bytes(1, "little"))
        self._h.update(seed)
        self._h.update(binder)

    def next(self, length: int) -> bytes:
        """The next ``length`` bytes of the stream."""
        out: bytes = self._h.read(length)
        return out


class XofFixedKeyAes128(Xof):
    """A circular correlation-robust hash from fixed-key AES-128 (GKWWY20):
    the key is TurboSHAKE128 (domain byte 2) of the tag and binder, and block
    i of the stream is ``AES(s) xor s`` with ``s = sigma(seed xor le128(i))``,
    ``sigma(lo || hi) = hi || (hi xor lo)``."""

    SEED_SIZE = 16

    def __init__(self, seed: bytes, dst: bytes, binder: bytes) -> None:
        _check_seed(type(self), seed)
        h = TurboSHAKE128.new(domain=2)
        h.update(len(dst).to_bytes(2, "little") + dst + binder)
        self._cipher = AES.new(h.read(16), AES.MODE_ECB)
        self._seed = int.from_bytes(seed, "little")
        self._consumed = 0

    def next(self, length: int) -> bytes:
        """The next ``length`` bytes of the stream."""
        start = self._consumed
        end = start + length
        self._consumed = end
        first, last = start // 16, (end - 1) // 16 if length else start // 16 - 1
        blocks = [self._hash_block(i) for i in range(first, last + 1)]
        offset = start - first * 16
        return b"".join(blocks)[offset : offset + length]

    def _hash_block(self, index: int) -> bytes:
        block = (self._seed ^ index).to_bytes(16, "little")
        lo, hi = block[:8], block[8:]
        sigma = hi + bytes(a ^ b for a, b in zip(hi, lo, strict=True))
        encrypted: bytes = self._cipher.encrypt(sigma)
        return bytes(a ^ b for a, b in zip(encrypted, sigma, strict=True))
