"""The IDPF of BBCGGI21 (draft-irtf-cfrg-vdaf-20, Sections 8.1 and 8.3).

An incremental distributed point function shares a path through the full
binary tree of depth ``BITS``: the client picks an index ``alpha`` and a
value for each level; evaluating the two keys at a node of level ``L`` gives
shares of that level's value if the node is the ``L + 1``-bit prefix of
``alpha``, and shares of zero otherwise.

Each node is a 16-byte seed and a control bit. ``extend`` hashes a seed into
the seeds and control bits of its two children, ``convert`` hashes a child's
seed into the seed it passes on and its share of the node's value. The
public share holds one correction word per level that keeps the two keys'
nodes equal off the path and apart on it. Inner levels hash with
XofFixedKeyAes128 and carry Field64 values; the leaf level hashes with
XofTurboShake128 and carries Field255 values.

Values are canonical ints; indices and prefixes are tuples of bools, most
significant bit first (``to_bits`` maps byte strings to them, Section 8.1.1).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from veil.vdaf.errors import CodecError
from veil.vdaf.spec.field import Field, Field64, Field255
from veil.vdaf.spec.xof import FixedKeyAes128, Xof, XofFixedKeyAes128, XofTurboShake128

# Version byte of the domain-separation tags (shared with Prio3, drafts 18 to 20).
VERSION = 18


def format_dst(algo_class: int, algo: int, usage: int) -> bytes:
    """``VERSION || algo_class || algo (4 bytes) || usage (2 bytes)``, big-endian
    (draft section 6.2.3)."""
    return bytes([VERSION, algo_class]) + algo.to_bytes(4, "big") + usage.to_bytes(2, "big")


# The IDPF's two tags (algorithm class 1, algorithm 0): extend and convert.
DST_EXTEND = format_dst(1, 0, 0)
DST_CONVERT = format_dst(1, 0, 1)


class CorrectionWord(NamedTuple):
    """One level's correction: a seed, two control bits, and the value
    correction (Field64 elements on inner levels, Field255 at the leaf)."""

    seed: bytes
    ctrl: tuple[bool, bool]
    payload: list[int]


PublicShare = list[CorrectionWord]


def to_bits(data: bytes) -> tuple[bool, ...]:
    """The index of a byte string: its bits by byte, most significant first
    (draft section 8.1.1), so that prefixes and order are kept."""
    return tuple(bool(byte >> (7 - i) & 1) for byte in data for i in range(8))


def from_bits(bits: Sequence[bool]) -> bytes:
    """Inverse of ``to_bits`` for a whole number of bytes; ValueError otherwise."""
    if len(bits) % 8:
        raise ValueError(f"{len(bits)} bits are not a whole number of bytes")
    return bytes(sum(int(bits[i + j]) << (7 - j) for j in range(8)) for i in range(0, len(bits), 8))


def pack_bits(bits: Sequence[bool]) -> bytes:
    """Eight bits a byte, least significant first, the last byte padded with
    zero bits (draft section 8.2.6.1)."""
    packed = bytearray((len(bits) + 7) // 8)
    for i, bit in enumerate(bits):
        packed[i // 8] |= int(bit) << (i % 8)
    return bytes(packed)


def unpack_bits(packed: bytes, length: int) -> list[bool]:
    """Inverse of ``pack_bits``; CodecError on a wrong length or a set padding bit."""
    if len(packed) != (length + 7) // 8:
        raise CodecError(f"packed control bits: {len(packed)} bytes, expected {(length + 7) // 8}")
    if length % 8 and packed[-1] >> (length % 8):
        raise CodecError("packed control bits: padding bits are set")
    return [bool(packed[i // 8] >> (i % 8) & 1) for i in range(length)]


def _xor(left: bytes, right: bytes) -> bytes:
    return (int.from_bytes(left, "little") ^ int.from_bytes(right, "little")).to_bytes(
        len(left), "little"
    )


class IdpfBBCGGI21:
    """The IDPF of BBCGGI21, Section 6, with vectors of ``VALUE_LEN`` field
    elements as values (draft section 8.3)."""

    SHARES = 2
    KEY_SIZE = XofFixedKeyAes128.SEED_SIZE
    RAND_SIZE = 2 * XofFixedKeyAes128.SEED_SIZE
    NONCE_SIZE = XofFixedKeyAes128.SEED_SIZE
    field_inner: type[Field] = Field64
    field_leaf: type[Field] = Field255

    def __init__(self, value_len: int, bits: int) -> None:
        if isinstance(value_len, bool) or not isinstance(value_len, int) or value_len < 1:
            raise ValueError(f"value_len must be a positive int, got {value_len!r}")
        # Levels travel as 16-bit numbers in Poplar1's aggregation parameter.
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 2**16:
            raise ValueError(f"bits must be an int in [1, 65536], got {bits!r}")
        self.VALUE_LEN = value_len
        self.BITS = bits

    def current_field(self, level: int) -> type[Field]:
        """Field64 below the leaf level, Field255 at it (draft section 8.1)."""
        return self.field_inner if level < self.BITS - 1 else self.field_leaf

    # -- key generation (client), draft section 8.3.2 -------------------

    def gen(
        self,
        alpha: Sequence[bool],
        beta_inner: Sequence[Sequence[int]],
        beta_leaf: Sequence[int],
        ctx: bytes,
        nonce: bytes,
        rand: bytes,
    ) -> tuple[PublicShare, list[bytes]]:
        """The public share and the two keys programming ``alpha`` with
        ``beta_inner[L]`` at inner level ``L`` and ``beta_leaf`` at the leaf.

        Pre: ``len(alpha) == BITS``, ``len(beta_inner) == BITS - 1``, every
        value of length ``VALUE_LEN``, ``len(nonce) == NONCE_SIZE``,
        ``len(rand) == RAND_SIZE``; ValueError otherwise.
        """
        if len(alpha) != self.BITS:
            raise ValueError(f"alpha must have {self.BITS} bits, got {len(alpha)}")
        if len(beta_inner) != self.BITS - 1:
            raise ValueError(f"beta_inner must have {self.BITS - 1} values")
        if any(len(b) != self.VALUE_LEN for b in beta_inner) or len(beta_leaf) != self.VALUE_LEN:
            raise ValueError(f"each value must have {self.VALUE_LEN} elements")
        if len(rand) != self.RAND_SIZE:
            raise ValueError(f"rand must be {self.RAND_SIZE} bytes, got {len(rand)}")
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes, got {len(nonce)}")
        hashes = FixedKeys(nonce)
        keys = [rand[: self.KEY_SIZE], rand[self.KEY_SIZE :]]
        seed = list(keys)
        ctrl = [False, True]
        public_share: PublicShare = []
        for level in range(self.BITS):
            bit = bool(alpha[level])
            keep, lose = int(bit), 1 - int(bit)
            s0, t0 = self.extend(hashes, level, seed[0], ctx, nonce)
            s1, t1 = self.extend(hashes, level, seed[1], ctx, nonce)
            seed_cw = _xor(s0[lose], s1[lose])
            ctrl_cw = (t0[0] ^ t1[0] ^ (not bit), t0[1] ^ t1[1] ^ bit)
            # The draft's note applies: a constant-time implementation would
            # select without branching on the client's bits.
            x0 = _xor(s0[keep], seed_cw) if ctrl[0] else s0[keep]
            x1 = _xor(s1[keep], seed_cw) if ctrl[1] else s1[keep]
            ctrl[0] = t0[keep] ^ (ctrl_cw[keep] if ctrl[0] else False)
            ctrl[1] = t1[keep] ^ (ctrl_cw[keep] if ctrl[1] else False)
            seed[0], w0 = self.convert(hashes, level, x0, ctx, nonce)
            seed[1], w1 = self.convert(hashes, level, x1, ctx, nonce)
            field = self.current_field(level)
            beta = beta_inner[level] if level < self.BITS - 1 else beta_leaf
            w_cw = field.vec_add(field.vec_sub(list(beta), w0), w1)
            if ctrl[1]:
                w_cw = [-x % field.MODULUS for x in w_cw]
            public_share.append(CorrectionWord(seed_cw, ctrl_cw, w_cw))
        return public_share, keys

    # -- key evaluation (aggregators), draft section 8.3.3 --------------

    def eval(
        self,
        agg_id: int,
        public_share: PublicShare,
        key: bytes,
        level: int,
        prefixes: Sequence[tuple[bool, ...]],
        ctx: bytes,
        nonce: bytes,
    ) -> list[list[int]]:
        """Aggregator ``agg_id``'s share of the value at each prefix of length
        ``level + 1``: ``VALUE_LEN`` elements of ``current_field(level)`` each.

        Nodes shared by several prefixes are computed once within a call (the
        draft's walk from the root for each prefix gives the same values).
        ValueError on an ``agg_id``, ``level``, key or nonce out of range, a
        prefix of the wrong length, or a repeated prefix.
        """
        if agg_id not in range(self.SHARES):
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if level not in range(self.BITS):
            raise ValueError(f"level must be in [0, {self.BITS}), got {level}")
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("prefixes must be distinct")
        if len(key) != self.KEY_SIZE:
            raise ValueError(f"an IDPF key is {self.KEY_SIZE} bytes, got {len(key)}")
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes, got {len(nonce)}")
        if len(public_share) != self.BITS:
            raise ValueError(f"the public share must have {self.BITS} correction words")
        hashes = FixedKeys(nonce)
        # Node of each prefix walked so far: (seed, ctrl, value share).
        nodes: dict[tuple[bool, ...], tuple[bytes, bool, list[int]]] = {(): (key, bool(agg_id), [])}
        out_share = []
        field = self.current_field(level)
        for prefix in prefixes:
            if len(prefix) != level + 1:
                raise ValueError(f"a prefix at level {level} has {level + 1} bits")
            prefix = tuple(bool(b) for b in prefix)
            depth = len(prefix)
            while prefix[:depth] not in nodes:
                depth -= 1
            seed, ctrl, y = nodes[prefix[:depth]]
            for current in range(depth, level + 1):
                seed, ctrl, y = self.eval_next(
                    hashes, seed, ctrl, public_share[current], current, prefix[current], ctx, nonce
                )
                nodes[prefix[: current + 1]] = (seed, ctrl, y)
            out_share.append(y if agg_id == 0 else [-x % field.MODULUS for x in y])
        return out_share

    def eval_next(
        self,
        hashes: FixedKeys,
        prev_seed: bytes,
        prev_ctrl: bool,
        correction_word: CorrectionWord,
        level: int,
        bit: bool,
        ctx: bytes,
        nonce: bytes,
    ) -> tuple[bytes, bool, list[int]]:
        """The child on side ``bit`` of the node ``(prev_seed, prev_ctrl)`` at
        ``level``: its seed, control bit and share of its value."""
        seed_cw, ctrl_cw, w_cw = correction_word
        s, t = self.extend(hashes, level, prev_seed, ctx, nonce)
        if prev_ctrl:
            s = [_xor(s[0], seed_cw), _xor(s[1], seed_cw)]
            t = [t[0] ^ ctrl_cw[0], t[1] ^ ctrl_cw[1]]
        next_ctrl = t[int(bit)]
        next_seed, y = self.convert(hashes, level, s[int(bit)], ctx, nonce)
        if next_ctrl:
            y = self.current_field(level).vec_add(y, w_cw)
        return next_seed, next_ctrl, y

    # -- helpers, draft section 8.3.4 -----------------------------------

    def extend(
        self, hashes: FixedKeys, level: int, seed: bytes, ctx: bytes, nonce: bytes
    ) -> tuple[list[bytes], list[bool]]:
        """The two children's seeds and control bits; a control bit is the
        low bit of its seed's first byte, which is then cleared."""
        xof = self.current_xof(hashes, level, seed, DST_EXTEND + ctx, nonce)
        both = xof.next(2 * self.KEY_SIZE)  # the same stream as two reads
        s = [bytearray(both[: self.KEY_SIZE]), bytearray(both[self.KEY_SIZE :])]
        t = [bool(s[0][0] & 1), bool(s[1][0] & 1)]
        s[0][0] &= 0xFE
        s[1][0] &= 0xFE
        return [bytes(s[0]), bytes(s[1])], t

    def convert(
        self, hashes: FixedKeys, level: int, seed: bytes, ctx: bytes, nonce: bytes
    ) -> tuple[bytes, list[int]]:
        """The seed a node passes on and its ``VALUE_LEN`` value elements."""
        xof = self.current_xof(hashes, level, seed, DST_CONVERT + ctx, nonce)
        next_seed = xof.next(self.KEY_SIZE)
        return next_seed, xof.next_vec(self.current_field(level), self.VALUE_LEN)

    def current_xof(
        self, hashes: FixedKeys, level: int, seed: bytes, dst: bytes, nonce: bytes
    ) -> Xof:
        """XofFixedKeyAes128 below the leaf, XofTurboShake128 at it; the
        fixed AES key of a (tag, nonce) is derived once per call."""
        if level < self.BITS - 1:
            return hashes.key(dst).xof(seed)
        return XofTurboShake128(seed, dst, nonce)

    # -- codec, draft section 8.2.6.1 -----------------------------------

    def public_share_size(self) -> int:
        """Bytes of an encoded public share."""
        return (
            (2 * self.BITS + 7) // 8
            + self.KEY_SIZE * self.BITS
            + self.VALUE_LEN
            * (self.field_inner.ENCODED_SIZE * (self.BITS - 1) + self.field_leaf.ENCODED_SIZE)
        )

    def encode_public_share(self, public_share: PublicShare) -> bytes:
        """Packed control bits, then the seeds, then the payloads."""
        encoded = pack_bits([bit for cw in public_share for bit in cw.ctrl])
        encoded += b"".join(cw.seed for cw in public_share)
        for level, cw in enumerate(public_share):
            encoded += self.current_field(level).encode_vec(cw.payload)
        return encoded

    def decode_public_share(self, encoded: bytes) -> PublicShare:
        """Inverse of ``encode_public_share``; CodecError on any other length,
        a set padding bit or an unreduced element."""
        if len(encoded) != self.public_share_size():
            raise CodecError(
                f"IDPF public share: {len(encoded)} bytes, expected {self.public_share_size()}"
            )
        packed_len = (2 * self.BITS + 7) // 8
        ctrl = unpack_bits(encoded[:packed_len], 2 * self.BITS)
        offset = packed_len
        seeds = []
        for _ in range(self.BITS):
            seeds.append(encoded[offset : offset + self.KEY_SIZE])
            offset += self.KEY_SIZE
        public_share = []
        for level in range(self.BITS):
            field = self.current_field(level)
            size = field.ENCODED_SIZE * self.VALUE_LEN
            payload = field.decode_vec(encoded[offset : offset + size])
            offset += size
            public_share.append(
                CorrectionWord(seeds[level], (ctrl[2 * level], ctrl[2 * level + 1]), payload)
            )
        return public_share


class FixedKeys:
    """The fixed AES keys of one report (its nonce is the binder), one per
    tag, derived on first use: extend and convert each need one, used at
    every inner level. Callers of ``extend``/``convert``/``eval_next`` make
    one per report: ``FixedKeys(nonce)``."""

    __slots__ = ("_binder", "_keys")

    def __init__(self, nonce: bytes) -> None:
        self._binder = nonce
        self._keys: dict[bytes, FixedKeyAes128] = {}

    def key(self, dst: bytes) -> FixedKeyAes128:
        found = self._keys.get(dst)
        if found is None:
            found = self._keys[dst] = FixedKeyAes128(dst, self._binder)
        return found
