"""Poplar1 (draft-irtf-cfrg-vdaf-20, Section 8): counting how many clients'
bit strings begin with each of a set of candidate prefixes, the core of the
BBCGGI21 heavy-hitters protocol.

Each client shards its ``BITS``-bit string into two IDPF keys
(``veil.vdaf.spec.idpf``) and shares of correlated randomness. The
aggregation parameter names a level and the candidate prefixes of that
length; each aggregator evaluates its key at every prefix and the two check,
in two rounds of the arithmetic sketch of BBCGGI21 (Section 4.2 and
Appendix C.4), that their output shares add up to a vector that is zero but
for at most one 1. The same reports are aggregated once per level, with
increasing levels and prefixes that extend the previous level's
(``is_valid``, Section 8.2.3).

Method names, argument order and constants mirror the draft. Randomness
enters only as arguments (``nonce``, ``rand``, ``verify_key``); field
elements are canonical ints of Field64 (inner levels) or Field255 (the
leaf); prefixes are tuples of bools, most significant bit first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from veil.vdaf.errors import (
    AggParamError,
    AggParamSequenceError,
    CodecError,
    TooManyPrefixes,
    VerifyError,
)
from veil.vdaf.spec.field import Field
from veil.vdaf.spec.idpf import IdpfBBCGGI21, PublicShare, format_dst, from_bits, to_bits
from veil.vdaf.spec.xof import XofTurboShake128

USAGE_SHARD_RAND = 1
USAGE_CORR_INNER = 2
USAGE_CORR_LEAF = 3
USAGE_VERIFY_RAND = 4

# The verification steps a state can be in (the draft's byte strings).
EVALUATE_SKETCH = b"evaluate sketch"
REVEAL_SKETCH = b"reveal sketch"

# The default bound on candidate prefixes per aggregation parameter: room
# for every one-byte extension of 256 candidates, while a hostile parameter
# cannot make an aggregator evaluate millions of nodes per report.
MAX_PREFIXES = 1 << 16

Prefix = tuple[bool, ...]


class Poplar1AggParam(NamedTuple):
    """The level (0 to BITS - 1) and its candidate prefixes, each
    ``level + 1`` bits, distinct and in lexicographic order."""

    level: int
    # Written out, not as ``Prefix``: the tuple's generated constructor
    # resolves its annotations without this module's names.
    prefixes: tuple[tuple[bool, ...], ...]


class Poplar1InputShare(NamedTuple):
    """An aggregator's IDPF key, its seed of the correlated randomness, and
    its shares of the sketch's (A, B) pair at each inner level and the leaf."""

    idpf_key: bytes
    corr_seed: bytes
    corr_inner: list[int]  # 2 * (BITS - 1) Field64 elements
    corr_leaf: list[int]  # 2 Field255 elements


class Poplar1VerifyState(NamedTuple):
    """Where an aggregator is in verification: the step, the level, and the
    memory the draft keeps (A, B and agg_id before the second round, then
    the output share alone)."""

    step: bytes
    level: int
    verify_mem: FieldVec


class FieldVec(list[int]):
    """Elements of a known field. Poplar1's values are Field64 below the
    leaf and Field255 at it, and the width of their encoding follows; the
    draft's values carry their field, so these do too."""

    __slots__ = ("field",)

    def __init__(self, field: type[Field], elems: Sequence[int] = ()) -> None:
        super().__init__(elems)
        self.field = field


VerifierShare = FieldVec
VerifierMessage = FieldVec | None


def get_ancestor(index: Prefix, level: int) -> Prefix:
    """The prefix of ``index`` at ``level`` (its first ``level + 1`` bits)."""
    return index[: level + 1]


class Poplar1:
    """Poplar1 over ``bits``-bit strings, two aggregators, two rounds
    (draft section 8.2). ``max_prefixes`` bounds the candidate prefixes of
    one aggregation parameter (``TooManyPrefixes`` beyond it)."""

    ID: ClassVar[int] = 0x00000006
    SHARES: ClassVar[int] = 2
    ROUNDS: ClassVar[int] = 2
    NONCE_SIZE: ClassVar[int] = 16
    xof: ClassVar[type[XofTurboShake128]] = XofTurboShake128
    VERIFY_KEY_SIZE: ClassVar[int] = XofTurboShake128.SEED_SIZE

    def __init__(self, bits: int, max_prefixes: int = MAX_PREFIXES) -> None:
        if isinstance(max_prefixes, bool) or not isinstance(max_prefixes, int):
            raise ValueError(f"max_prefixes must be an int, got {max_prefixes!r}")
        if not 1 <= max_prefixes < 2**32:
            raise ValueError(f"max_prefixes must be in [1, 2^32), got {max_prefixes}")
        self.idpf = IdpfBBCGGI21(2, bits)
        self.BITS = bits
        self.max_prefixes = max_prefixes
        self.RAND_SIZE = 3 * self.xof.SEED_SIZE + self.idpf.RAND_SIZE
        self._dst = {u: format_dst(0, self.ID, u) for u in range(1, 5)}

    def __repr__(self) -> str:
        return f"Poplar1(bits={self.BITS})"

    def domain_separation_tag(self, usage: int, ctx: bytes) -> bytes:
        """The XOF tag of ``usage`` under ``ctx`` (draft section 6.2.3)."""
        return self._dst[usage] + ctx

    # -- measurements ----------------------------------------------------

    def measurement_from_bytes(self, data: bytes) -> Prefix:
        """The measurement of a byte string of exactly ``BITS / 8`` bytes: its
        bits by byte, most significant first (draft section 8.1.1)."""
        if len(data) * 8 != self.BITS:
            raise ValueError(f"a Poplar1({self.BITS}) measurement is {self.BITS} bits")
        return to_bits(data)

    @staticmethod
    def prefix_to_bytes(prefix: Sequence[bool]) -> bytes:
        """Inverse of ``measurement_from_bytes`` for a prefix of whole bytes."""
        return from_bits(prefix)

    # -- sharding (client), draft section 8.2.1 -----------------------

    def shard(
        self, ctx: bytes, measurement: Sequence[bool], nonce: bytes, rand: bytes
    ) -> tuple[PublicShare, list[Poplar1InputShare]]:
        """The public share (the IDPF's correction words) and the two input
        shares of ``measurement`` (``BITS`` bools). ValueError on a bad
        measurement or argument sizes."""
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes, got {len(nonce)}")
        if len(rand) != self.RAND_SIZE:
            raise ValueError(f"rand must be {self.RAND_SIZE} bytes, got {len(rand)}")
        if len(measurement) != self.BITS or any(not isinstance(b, bool) for b in measurement):
            raise ValueError(f"a Poplar1({self.BITS}) measurement is {self.BITS} bools")
        idpf = self.idpf
        size = self.xof.SEED_SIZE
        idpf_rand, rest = rand[: idpf.RAND_SIZE], rand[idpf.RAND_SIZE :]
        corr_seed = [rest[:size], rest[size : 2 * size]]
        shard_seed = rest[2 * size :]
        xof = self.xof(shard_seed, self.domain_separation_tag(USAGE_SHARD_RAND, ctx), nonce)

        beta_inner, beta_leaf = self.programmed_values(xof)
        public_share, keys = idpf.gen(measurement, beta_inner, beta_leaf, ctx, nonce, idpf_rand)

        inner, leaf = idpf.field_inner, idpf.field_leaf
        # Shares of an (a, b, c) triple per level, from the two seeds, and
        # from them and k the (A, B) pair each aggregator's sketch needs
        # (BBCGGI21, Appendix C.4).
        corr_offsets = inner.vec_add(
            self._corr(inner, corr_seed[0], USAGE_CORR_INNER, ctx, 0, nonce, 3 * (self.BITS - 1)),
            self._corr(inner, corr_seed[1], USAGE_CORR_INNER, ctx, 1, nonce, 3 * (self.BITS - 1)),
        )
        corr_offsets += leaf.vec_add(
            self._corr(leaf, corr_seed[0], USAGE_CORR_LEAF, ctx, 0, nonce, 3),
            self._corr(leaf, corr_seed[1], USAGE_CORR_LEAF, ctx, 1, nonce, 3),
        )
        corr_inner: list[list[int]] = [[], []]
        corr_leaf: list[list[int]] = [[], []]
        for level in range(self.BITS):
            field = idpf.current_field(level)
            p = field.MODULUS
            k = beta_inner[level][1] if level < self.BITS - 1 else beta_leaf[1]
            a, b, c = corr_offsets[3 * level : 3 * level + 3]
            big_a = (-2 * a + k) % p
            big_b = (a * a + b - a * k + c) % p
            corr1 = xof.next_vec(field, 2)
            corr0 = field.vec_sub([big_a, big_b], corr1)
            if level < self.BITS - 1:
                corr_inner[0] += corr0
                corr_inner[1] += corr1
            else:
                corr_leaf = [corr0, corr1]
        input_shares = [
            Poplar1InputShare(keys[j], corr_seed[j], corr_inner[j], corr_leaf[j]) for j in (0, 1)
        ]
        return public_share, input_shares

    def programmed_values(self, xof: XofTurboShake128) -> tuple[list[list[int]], list[int]]:
        """The values the client programs along its path: (1, k) at every
        level, the count and a random authenticator k that the sketch uses
        to check the count is 1 (drawn from the shard XOF, inner levels
        first). Tests override this to play a client that cheats."""
        inner, leaf = self.idpf.field_inner, self.idpf.field_leaf
        beta_inner = [[1, k] for k in xof.next_vec(inner, self.BITS - 1)]
        beta_leaf = [1, *xof.next_vec(leaf, 1)]
        return beta_inner, beta_leaf

    def _corr(
        self,
        field: type[Field],
        seed: bytes,
        usage: int,
        ctx: bytes,
        agg_id: int,
        nonce: bytes,
        length: int,
    ) -> list[int]:
        return self.xof.expand_into_vec(
            field, seed, self.domain_separation_tag(usage, ctx), bytes([agg_id]) + nonce, length
        )

    # -- aggregation parameters, draft section 8.2.3 ------------------

    def check_agg_param(self, agg_param: Poplar1AggParam) -> None:
        """Raise ``AggParamError`` unless the level is in ``[0, BITS)`` and
        the prefixes are ``level + 1`` bools each, strictly increasing
        (hence distinct), and at most ``max_prefixes`` of them
        (``TooManyPrefixes``)."""
        level, prefixes = agg_param
        if isinstance(level, bool) or not isinstance(level, int) or level not in range(self.BITS):
            raise AggParamError(f"level must be in [0, {self.BITS}), got {level!r}")
        if len(prefixes) > self.max_prefixes:
            raise TooManyPrefixes(
                f"{len(prefixes)} candidate prefixes; at most {self.max_prefixes} are allowed"
            )
        for prefix in prefixes:
            # (Counted in C: a level-127 parameter may hold 65,536 prefixes.)
            if len(prefix) != level + 1 or prefix.count(True) + prefix.count(False) != level + 1:
                raise AggParamError(f"a prefix at level {level} is {level + 1} bools")
        for i in range(1, len(prefixes)):
            if prefixes[i - 1] >= prefixes[i]:
                raise AggParamError("candidate prefixes must be distinct and in increasing order")

    def check_valid(
        self, agg_param: Poplar1AggParam, previous_agg_params: Sequence[Poplar1AggParam]
    ) -> None:
        """The draft's ``is_valid`` as an exception: ``agg_param`` may follow
        ``previous_agg_params`` (those already used with the same reports,
        in order) only if its level is higher than the last one's and each
        of its prefixes extends one of the last level's prefixes.
        ``AggParamSequenceError`` names the rule broken; ``AggParamError``
        a parameter malformed on its own."""
        self.check_agg_param(agg_param)
        if not previous_agg_params:
            return
        level, prefixes = agg_param
        last_level, last_prefixes = previous_agg_params[-1]
        if level <= last_level:
            raise AggParamSequenceError(
                f"level {level} does not follow level {last_level}: levels must increase"
            )
        known = set(last_prefixes)
        for prefix in prefixes:
            if get_ancestor(prefix, last_level) not in known:
                raise AggParamSequenceError(
                    f"a candidate prefix does not extend any prefix of level {last_level}"
                )

    def is_valid(
        self, agg_param: Poplar1AggParam, previous_agg_params: Sequence[Poplar1AggParam]
    ) -> bool:
        """Whether ``agg_param`` may be used after ``previous_agg_params``
        (draft section 8.2.3; ``check_valid`` says why not)."""
        try:
            self.check_valid(agg_param, previous_agg_params)
        except AggParamError:
            return False
        return True

    # -- verification (aggregators), draft section 8.2.2 --------------

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Poplar1AggParam,
        nonce: bytes,
        public_share: PublicShare,
        input_share: Poplar1InputShare,
    ) -> tuple[Poplar1VerifyState, VerifierShare]:
        """Evaluate the IDPF key at the candidate prefixes and return the
        state and this aggregator's first sketch share (three elements)."""
        if len(verify_key) != self.VERIFY_KEY_SIZE:
            raise ValueError(f"verify_key must be {self.VERIFY_KEY_SIZE} bytes")
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes")
        if agg_id not in range(self.SHARES):
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        self.check_agg_param(agg_param)
        level, prefixes = agg_param
        key, corr_seed, corr_inner, corr_leaf = input_share
        field = self.idpf.current_field(level)
        p = field.MODULUS

        value = self.idpf.eval(agg_id, public_share, key, level, prefixes, ctx, nonce)

        # This aggregator's share of the level's (a, b, c) triple: the
        # level's three elements of its correlated-randomness stream.
        if level < self.BITS - 1:
            corr_xof = self.xof(
                corr_seed,
                self.domain_separation_tag(USAGE_CORR_INNER, ctx),
                bytes([agg_id]) + nonce,
            )
            corr_xof.next_vec(field, 3 * level)  # fast-forward to this level
            a_share, b_share = corr_inner[2 * level : 2 * level + 2]
        else:
            corr_xof = self.xof(
                corr_seed,
                self.domain_separation_tag(USAGE_CORR_LEAF, ctx),
                bytes([agg_id]) + nonce,
            )
            a_share, b_share = corr_leaf
        sketch_share = corr_xof.next_vec(field, 3)

        # The masked inputs of BBCGGI21, Appendix C.4: sum r*data, sum
        # r^2*data and sum r*auth over the prefixes, r from the verify key.
        verify_rand = self.verify_rand(verify_key, ctx, nonce, level, len(prefixes))
        out_share = []
        s0, s1, s2 = sketch_share
        for r, (data_share, auth_share) in zip(verify_rand, value, strict=True):
            s0 += data_share * r
            s1 += data_share * r * r
            s2 += auth_share * r
            out_share.append(data_share)
        verify_mem = FieldVec(field, [a_share, b_share, agg_id, *out_share])
        return (
            Poplar1VerifyState(EVALUATE_SKETCH, level, verify_mem),
            FieldVec(field, [s0 % p, s1 % p, s2 % p]),
        )

    def verify_rand(
        self, verify_key: bytes, ctx: bytes, nonce: bytes, level: int, count: int
    ) -> list[int]:
        """The sketch's random weights of one report at ``level``, one per prefix."""
        xof = self.xof(
            verify_key,
            self.domain_separation_tag(USAGE_VERIFY_RAND, ctx),
            nonce + level.to_bytes(2, "big"),
        )
        return xof.next_vec(self.idpf.current_field(level), count)

    def verifier_shares_to_message(
        self, ctx: bytes, agg_param: Poplar1AggParam, verifier_shares: Sequence[VerifierShare]
    ) -> VerifierMessage:
        """Round 1: the sum of the sketch shares, sent to both. Round 2: None
        if the shares cancel, which is the sketch accepting; ``VerifyError``
        if they do not (the client's values are not one-hot, or not 1)."""
        if len(verifier_shares) != self.SHARES:
            raise ValueError(f"expected {self.SHARES} verifier shares, got {len(verifier_shares)}")
        field = self.idpf.current_field(agg_param.level)
        first, second = verifier_shares
        if len(first) != len(second):
            raise VerifyError("verifier shares of different rounds")
        sketch = FieldVec(field, field.vec_add(first, second))
        if len(sketch) == 3:
            return sketch
        if len(sketch) == 1:
            if sketch == [0]:
                return None
            raise VerifyError("sketch verification failed: the report is not one-hot")
        raise VerifyError(f"a verifier share has {len(sketch)} elements, expected 3 or 1")

    def verify_next(
        self, ctx: bytes, verify_state: Poplar1VerifyState, verifier_message: VerifierMessage
    ) -> tuple[Poplar1VerifyState, VerifierShare] | FieldVec:
        """After round 1: the state and the second sketch share (one
        element). After round 2: the output share (one element per prefix).
        ``VerifyError`` on a message that does not fit the step."""
        step, level, verify_mem = verify_state
        field = self.idpf.current_field(level)
        p = field.MODULUS
        if step == EVALUATE_SKETCH:
            if verifier_message is None or len(verifier_message) != 3:
                raise VerifyError("the first verifier message is the 3-element sketch")
            a_share, b_share, agg_id = verify_mem[:3]
            s0, s1, s2 = verifier_message
            share = (agg_id * (s0 * s0 - s1 - s2) + a_share * s0 + b_share) % p
            out_share = FieldVec(field, verify_mem[3:])
            return Poplar1VerifyState(REVEAL_SKETCH, level, out_share), FieldVec(field, [share])
        if step == REVEAL_SKETCH:
            if verifier_message is not None:
                raise VerifyError("the second verifier message is empty")
            return verify_mem
        raise VerifyError(f"unknown verification step {step!r}")

    # -- aggregation and unsharding, draft sections 8.2.4 and 8.2.5 ---

    def agg_init(self, agg_param: Poplar1AggParam) -> FieldVec:
        """An empty aggregate share: one zero per prefix."""
        return FieldVec(self.idpf.current_field(agg_param.level), [0] * len(agg_param.prefixes))

    def agg_update(
        self, agg_param: Poplar1AggParam, agg_share: Sequence[int], out_share: Sequence[int]
    ) -> FieldVec:
        """``agg_share`` plus one output share."""
        field = self.idpf.current_field(agg_param.level)
        return FieldVec(field, field.vec_add(agg_share, out_share))

    def merge(self, agg_param: Poplar1AggParam, agg_shares: Sequence[Sequence[int]]) -> FieldVec:
        """The sum of aggregate shares."""
        agg = self.agg_init(agg_param)
        for share in agg_shares:
            agg = self.agg_update(agg_param, agg, share)
        return agg

    def unshard(
        self,
        agg_param: Poplar1AggParam,
        agg_shares: Sequence[Sequence[int]],
        num_measurements: int,
    ) -> list[int]:
        """The count of reports under each candidate prefix."""
        return list(self.merge(agg_param, agg_shares))

    # -- codec, draft section 8.2.6 -------------------------------------
    # Every decoder takes exactly the bytes of one message: short input,
    # trailing bytes and unreduced field elements raise CodecError.

    def public_share_size(self) -> int:
        """Bytes of an encoded public share."""
        return self.idpf.public_share_size()

    def input_share_size(self, agg_id: int = 0) -> int:
        """Bytes of an encoded input share (the same for both aggregators)."""
        idpf = self.idpf
        return (
            idpf.KEY_SIZE
            + self.xof.SEED_SIZE
            + 2 * (self.BITS - 1) * idpf.field_inner.ENCODED_SIZE
            + 2 * idpf.field_leaf.ENCODED_SIZE
        )

    def encode_public_share(self, public_share: PublicShare) -> bytes:
        """The IDPF's public share: its correction words, packed."""
        return self.idpf.encode_public_share(public_share)

    def decode_public_share(self, encoded: bytes) -> PublicShare:
        """Inverse of ``encode_public_share``; CodecError on a bad encoding."""
        return self.idpf.decode_public_share(encoded)

    def encode_input_share(self, input_share: Poplar1InputShare) -> bytes:
        """The IDPF key, the correlation seed, then the inner and leaf
        correlation elements."""
        key, seed, inner, leaf = input_share
        idpf = self.idpf
        return key + seed + idpf.field_inner.encode_vec(inner) + idpf.field_leaf.encode_vec(leaf)

    def decode_input_share(self, agg_id: int, encoded: bytes) -> Poplar1InputShare:
        """Aggregator ``agg_id``'s input share; CodecError on a bad encoding."""
        if agg_id not in range(self.SHARES):
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if len(encoded) != self.input_share_size(agg_id):
            raise CodecError(
                f"Poplar1 input share: {len(encoded)} bytes, expected {self.input_share_size()}"
            )
        idpf = self.idpf
        key_end = idpf.KEY_SIZE
        seed_end = key_end + self.xof.SEED_SIZE
        inner_end = seed_end + 2 * (self.BITS - 1) * idpf.field_inner.ENCODED_SIZE
        return Poplar1InputShare(
            encoded[:key_end],
            encoded[key_end:seed_end],
            idpf.field_inner.decode_vec(encoded[seed_end:inner_end]),
            idpf.field_leaf.decode_vec(encoded[inner_end:]),
        )

    def encode_verifier_share(self, verifier_share: VerifierShare) -> bytes:
        """The sketch share's elements (inner or leaf field by its size)."""
        return self._encode_elems(verifier_share)

    def decode_verifier_share(
        self, verify_state: Poplar1VerifyState, encoded: bytes
    ) -> VerifierShare:
        """Three elements of the level's field in the first round, one in
        the second; CodecError otherwise."""
        count = 3 if verify_state.step == EVALUATE_SKETCH else 1
        return self._decode_elems(verify_state.level, count, encoded, "verifier share")

    def encode_verifier_message(self, verifier_message: VerifierMessage) -> bytes:
        """The round-1 sketch, or the empty string after round 2."""
        return b"" if verifier_message is None else self._encode_elems(verifier_message)

    def decode_verifier_message(
        self, verify_state: Poplar1VerifyState, encoded: bytes
    ) -> VerifierMessage:
        """Inverse of ``encode_verifier_message`` for the step of
        ``verify_state``; CodecError on any other length."""
        if verify_state.step == REVEAL_SKETCH:
            if encoded:
                raise CodecError("the second verifier message is empty")
            return None
        return self._decode_elems(verify_state.level, 3, encoded, "verifier message")

    def encode_agg_share(self, agg_share: FieldVec) -> bytes:
        """One element of the level's field per prefix."""
        return self._encode_elems(agg_share)

    def decode_agg_share(self, agg_param: Poplar1AggParam, encoded: bytes) -> FieldVec:
        """One element of the level's field per prefix; CodecError otherwise."""
        return self._decode_elems(
            agg_param.level, len(agg_param.prefixes), encoded, "aggregate share"
        )

    def encode_out_share(self, out_share: FieldVec) -> bytes:
        """One element of the level's field per prefix."""
        return self._encode_elems(out_share)

    def decode_out_share(self, agg_param: Poplar1AggParam, encoded: bytes) -> FieldVec:
        """Inverse of ``encode_out_share`` at ``agg_param``'s level."""
        return self._decode_elems(agg_param.level, len(agg_param.prefixes), encoded, "output share")

    def _encode_elems(self, vec: Sequence[int]) -> bytes:
        if not isinstance(vec, FieldVec):
            raise TypeError("Poplar1 encodes FieldVec values (their field sets the width)")
        return vec.field.encode_vec(vec)

    def _decode_elems(self, level: int, count: int, encoded: bytes, what: str) -> FieldVec:
        if level not in range(self.BITS):
            raise CodecError(f"{what}: level {level} is out of range")
        field = self.idpf.current_field(level)
        if len(encoded) != count * field.ENCODED_SIZE:
            raise CodecError(
                f"Poplar1 {what}: {len(encoded)} bytes, expected {count * field.ENCODED_SIZE}"
            )
        return FieldVec(field, field.decode_vec(encoded))

    def encode_agg_param(self, agg_param: Poplar1AggParam) -> bytes:
        """``level`` (2 bytes) and the prefix count (4 bytes), big-endian,
        then each prefix's bits packed most significant first into
        ``ceil((level + 1) / 8)`` bytes (draft section 8.2.6.6)."""
        self.check_agg_param(agg_param)
        level, prefixes = agg_param
        encoded = level.to_bytes(2, "big") + len(prefixes).to_bytes(4, "big")
        width = (level + 8) // 8
        for prefix in prefixes:
            value = 0
            for bit in prefix:
                value = value << 1 | int(bit)
            encoded += (value << (8 * width - level - 1)).to_bytes(width, "big")
        return encoded

    def decode_agg_param(self, encoded: bytes) -> Poplar1AggParam:
        """Inverse of ``encode_agg_param``; CodecError on a bad length or a
        set padding bit, ``TooManyPrefixes`` or ``AggParamError`` on a
        parameter that ``check_agg_param`` refuses. The count is checked
        against the bound and the length before anything is allocated."""
        if len(encoded) < 6:
            raise CodecError("Poplar1 aggregation parameter: fewer than 6 bytes")
        level = int.from_bytes(encoded[:2], "big")
        count = int.from_bytes(encoded[2:6], "big")
        if level not in range(self.BITS):
            raise AggParamError(f"level must be in [0, {self.BITS}), got {level}")
        if count > self.max_prefixes:
            raise TooManyPrefixes(
                f"{count} candidate prefixes; at most {self.max_prefixes} are allowed"
            )
        width = (level + 8) // 8
        if len(encoded) != 6 + count * width:
            raise CodecError(
                f"Poplar1 aggregation parameter: {len(encoded)} bytes,"
                f" expected {6 + count * width} for {count} prefixes at level {level}"
            )
        pad = 8 * width - level - 1
        prefixes = []
        for i in range(count):
            value = int.from_bytes(encoded[6 + i * width : 6 + (i + 1) * width], "big")
            if value & ((1 << pad) - 1):
                raise CodecError("Poplar1 aggregation parameter: a prefix's padding bits are set")
            value >>= pad
            prefixes.append(tuple(bool(value >> (level - j) & 1) for j in range(level + 1)))
        agg_param = Poplar1AggParam(level, tuple(prefixes))
        self.check_agg_param(agg_param)
        return agg_param
