"""Prio3 (draft-irtf-cfrg-vdaf-18, Section 7): a VDAF from a fully linear
proof, one round of verification, and additive secret sharing.

Method names, argument order and constants mirror the draft so that the
code can be held against the text. Randomness enters only as arguments
(``nonce``, ``rand``, ``verify_key``); callers draw it with ``secrets``.
Field elements are canonical ints; ``agg_param`` is always ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Generic, NamedTuple

from veil.vdaf.errors import CodecError, VerifyError
from veil.vdaf.spec import circuits
from veil.vdaf.spec.circuits import AggResult, Measurement
from veil.vdaf.spec.field import Field, Field64, Field128
from veil.vdaf.spec.flp import FlpBBCGGI19
from veil.vdaf.spec.xof import Xof, XofTurboShake128

# Version byte of the domain-separation tags: drafts 18 to 20 share it.
VERSION = 18

USAGE_MEAS_SHARE = 1
USAGE_PROOF_SHARE = 2
USAGE_JOINT_RANDOMNESS = 3
USAGE_PROVE_RANDOMNESS = 4
USAGE_QUERY_RANDOMNESS = 5
USAGE_JOINT_RAND_SEED = 6
USAGE_JOINT_RAND_PART = 7


class LeaderInputShare(NamedTuple):
    meas_share: list[int]
    proofs_share: list[int]
    blind: bytes | None


class HelperInputShare(NamedTuple):
    # Expands into both the measurement share and the proofs share.
    share: bytes
    blind: bytes | None


InputShare = LeaderInputShare | HelperInputShare
PublicShare = list[bytes] | None  # the joint randomness parts, if used
VerifierMessage = bytes | None  # the joint randomness seed, if used


class VerifyState(NamedTuple):
    out_share: list[int]
    corrected_joint_rand_seed: bytes | None


class VerifierShare(NamedTuple):
    verifiers_share: list[int]
    joint_rand_part: bytes | None


def format_dst(algo_class: int, algo: int, usage: int) -> bytes:
    """``VERSION || algo_class || algo (4 bytes) || usage (2 bytes)``, big-endian."""
    return (
        VERSION.to_bytes(1, "big")
        + algo_class.to_bytes(1, "big")
        + algo.to_bytes(4, "big")
        + usage.to_bytes(2, "big")
    )


class Prio3(Generic[Measurement, AggResult]):
    """Prio3 over a validity circuit, with ``SHARES`` aggregators and
    ``PROOFS`` independent proofs."""

    ID: ClassVar[int]
    xof: ClassVar[type[Xof]] = XofTurboShake128
    VERIFY_KEY_SIZE: ClassVar[int] = XofTurboShake128.SEED_SIZE
    NONCE_SIZE: ClassVar[int] = 16
    ROUNDS: ClassVar[int] = 1

    def __init__(
        self, shares: int, valid: circuits.Valid[Measurement, AggResult], num_proofs: int
    ) -> None:
        circuits._require_int("shares", shares, 2, 255)
        circuits._require_int("num_proofs", num_proofs, 1, 255)
        self.SHARES = shares
        self.PROOFS = num_proofs
        self.flp = FlpBBCGGI19(valid)
        self.field: type[Field] = valid.field
        seed = self.xof.SEED_SIZE
        joint = self.flp.JOINT_RAND_LEN > 0
        # One seed per helper share and the prove seed, plus one blind per
        # aggregator when the circuit uses joint randomness.
        self.RAND_SIZE = shares * seed * (2 if joint else 1)
        self._dst_prefix = {u: format_dst(0, self.ID, u) for u in range(1, 8)}

    # -- sharding (client) ----------------------------------------------

    def shard(
        self, ctx: bytes, measurement: Measurement, nonce: bytes, rand: bytes
    ) -> tuple[PublicShare, list[InputShare]]:
        """Split ``measurement`` into ``SHARES`` input shares and a public share.
        Raises ``ValueError`` on a bad measurement or argument sizes."""
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes, got {len(nonce)}")
        if len(rand) != self.RAND_SIZE:
            raise ValueError(f"rand must be {self.RAND_SIZE} bytes, got {len(rand)}")
        size = self.xof.SEED_SIZE
        seeds = [rand[i : i + size] for i in range(0, self.RAND_SIZE, size)]
        meas = self.flp.encode(measurement)
        if self.flp.JOINT_RAND_LEN > 0:
            return self._shard_with_joint_rand(ctx, meas, nonce, seeds)
        return self._shard_without_joint_rand(ctx, meas, seeds)

    def _shard_without_joint_rand(
        self, ctx: bytes, meas: list[int], seeds: list[bytes]
    ) -> tuple[PublicShare, list[InputShare]]:
        helper_shares, prove_seed = seeds[: self.SHARES - 1], seeds[self.SHARES - 1]
        leader_meas_share = meas
        for j, share in enumerate(helper_shares, start=1):
            leader_meas_share = self.field.vec_sub(
                leader_meas_share, self.helper_meas_share(ctx, j, share)
            )
        leader_proofs_share = self._prove_all(meas, self.prove_rands(ctx, prove_seed), None)
        for j, share in enumerate(helper_shares, start=1):
            leader_proofs_share = self.field.vec_sub(
                leader_proofs_share, self.helper_proofs_share(ctx, j, share)
            )
        input_shares: list[InputShare] = [
            LeaderInputShare(leader_meas_share, leader_proofs_share, None)
        ]
        input_shares += [HelperInputShare(share, None) for share in helper_shares]
        return None, input_shares

    def _shard_with_joint_rand(
        self, ctx: bytes, meas: list[int], nonce: bytes, seeds: list[bytes]
    ) -> tuple[PublicShare, list[InputShare]]:
        n_helpers = self.SHARES - 1
        helper_shares = seeds[0 : 2 * n_helpers : 2]
        helper_blinds = seeds[1 : 2 * n_helpers : 2]
        leader_blind, prove_seed = seeds[2 * n_helpers], seeds[2 * n_helpers + 1]

        leader_meas_share = meas
        joint_rand_parts = []
        for j in range(n_helpers):
            helper_meas_share = self.helper_meas_share(ctx, j + 1, helper_shares[j])
            leader_meas_share = self.field.vec_sub(leader_meas_share, helper_meas_share)
            joint_rand_parts.append(
                self.joint_rand_part(ctx, j + 1, helper_blinds[j], helper_meas_share, nonce)
            )
        joint_rand_parts.insert(
            0, self.joint_rand_part(ctx, 0, leader_blind, leader_meas_share, nonce)
        )

        joint_rands = self.joint_rands(ctx, self.joint_rand_seed(ctx, joint_rand_parts))
        leader_proofs_share = self._prove_all(meas, self.prove_rands(ctx, prove_seed), joint_rands)
        for j in range(n_helpers):
            leader_proofs_share = self.field.vec_sub(
                leader_proofs_share, self.helper_proofs_share(ctx, j + 1, helper_shares[j])
            )
        input_shares: list[InputShare] = [
            LeaderInputShare(leader_meas_share, leader_proofs_share, leader_blind)
        ]
        input_shares += [
            HelperInputShare(share, blind)
            for share, blind in zip(helper_shares, helper_blinds, strict=True)
        ]
        return joint_rand_parts, input_shares

    def _prove_all(
        self, meas: list[int], prove_rands: list[int], joint_rands: list[int] | None
    ) -> list[int]:
        flp = self.flp
        proofs: list[int] = []
        for i in range(self.PROOFS):
            prove_rand = prove_rands[i * flp.PROVE_RAND_LEN : (i + 1) * flp.PROVE_RAND_LEN]
            joint_rand = (
                joint_rands[i * flp.JOINT_RAND_LEN : (i + 1) * flp.JOINT_RAND_LEN]
                if joint_rands is not None
                else []
            )
            proofs += flp.prove(meas, prove_rand, joint_rand)
        return proofs

    # -- verification (aggregators) ------------------------------------

    def verify_init(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: None,
        nonce: bytes,
        public_share: PublicShare,
        input_share: InputShare,
    ) -> tuple[VerifyState, VerifierShare]:
        """Aggregator ``agg_id``'s first step: expand its input share, compute
        its share of the verifier and its joint randomness part."""
        if len(verify_key) != self.VERIFY_KEY_SIZE:
            raise ValueError(f"verify_key must be {self.VERIFY_KEY_SIZE} bytes")
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be {self.NONCE_SIZE} bytes")
        if not 0 <= agg_id < self.SHARES:
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        meas_share, proofs_share, blind = self.expand_input_share(ctx, agg_id, input_share)
        flp = self.flp
        out_share = flp.truncate(meas_share)

        joint_rands: list[int] = []
        corrected_seed = None
        joint_rand_part = None
        if flp.JOINT_RAND_LEN > 0:
            if blind is None or public_share is None or len(public_share) != self.SHARES:
                raise VerifyError("joint randomness blind or parts missing from the report")
            joint_rand_part = self.joint_rand_part(ctx, agg_id, blind, meas_share, nonce)
            parts = list(public_share)
            parts[agg_id] = joint_rand_part
            corrected_seed = self.joint_rand_seed(ctx, parts)
            joint_rands = self.joint_rands(ctx, corrected_seed)

        query_rands = self.query_rands(verify_key, ctx, nonce)
        verifiers_share: list[int] = []
        for i in range(self.PROOFS):
            verifiers_share += flp.query(
                meas_share,
                proofs_share[i * flp.PROOF_LEN : (i + 1) * flp.PROOF_LEN],
                query_rands[i * flp.QUERY_RAND_LEN : (i + 1) * flp.QUERY_RAND_LEN],
                joint_rands[i * flp.JOINT_RAND_LEN : (i + 1) * flp.JOINT_RAND_LEN],
                self.SHARES,
            )
        return (
            VerifyState(out_share, corrected_seed),
            VerifierShare(verifiers_share, joint_rand_part),
        )

    def verifier_shares_to_message(
        self, ctx: bytes, agg_param: None, verifier_shares: Sequence[VerifierShare]
    ) -> VerifierMessage:
        """Combine every aggregator's verifier share and decide. Raises
        ``VerifyError`` if any proof rejects."""
        if len(verifier_shares) != self.SHARES:
            raise ValueError(f"expected {self.SHARES} verifier shares, got {len(verifier_shares)}")
        flp = self.flp
        verifiers = self.field.zeros(flp.VERIFIER_LEN * self.PROOFS)
        joint_rand_parts = []
        for share in verifier_shares:
            verifiers = self.field.vec_add(verifiers, share.verifiers_share)
            if flp.JOINT_RAND_LEN > 0:
                if share.joint_rand_part is None:
                    raise VerifyError("a verifier share lacks its joint randomness part")
                joint_rand_parts.append(share.joint_rand_part)
        for i in range(self.PROOFS):
            if not flp.decide(verifiers[i * flp.VERIFIER_LEN : (i + 1) * flp.VERIFIER_LEN]):
                raise VerifyError("proof verifier check failed")
        if flp.JOINT_RAND_LEN > 0:
            return self.joint_rand_seed(ctx, joint_rand_parts)
        return None

    def verify_next(
        self, ctx: bytes, verify_state: VerifyState, verifier_message: VerifierMessage
    ) -> list[int]:
        """Check the joint randomness the client used against the one the
        aggregators derived; return the output share."""
        if verifier_message != verify_state.corrected_joint_rand_seed:
            raise VerifyError("joint randomness check failed")
        return verify_state.out_share

    # -- aggregation and collection ------------------------------------

    def agg_init(self, agg_param: None) -> list[int]:
        """An empty aggregate share: OUTPUT_LEN zeros (draft section 7.2.4)."""
        return self.field.zeros(self.flp.OUTPUT_LEN)

    def agg_update(self, agg_param: None, agg_share: list[int], out_share: list[int]) -> list[int]:
        """`agg_share` plus one output share (draft section 7.2.4)."""
        return self.field.vec_add(agg_share, out_share)

    def merge(self, agg_param: None, agg_shares: Sequence[list[int]]) -> list[int]:
        """The sum of aggregate shares (draft section 7.2.4)."""
        agg = self.agg_init(agg_param)
        for share in agg_shares:
            agg = self.field.vec_add(agg, share)
        return agg

    def unshard(
        self, agg_param: None, agg_shares: Sequence[list[int]], num_measurements: int
    ) -> AggResult:
        """The aggregate result from all aggregators' shares of `num_measurements` reports (draft
        section 7.2.5)."""
        if num_measurements < 1:
            raise ValueError("num_measurements must be at least 1")
        return self.flp.decode(self.merge(agg_param, agg_shares), num_measurements)

    # -- derivations -----------------------------------------------------

    def domain_separation_tag(self, usage: int, ctx: bytes) -> bytes:
        """The XOF domain separation tag of `usage` under `ctx` (draft section 7.2.7)."""
        return self._dst_prefix[usage] + ctx

    def helper_meas_share(self, ctx: bytes, agg_id: int, share: bytes) -> list[int]:
        """A helper's measurement share expanded from its seed (draft section 7.2.7)."""
        return self.xof.expand_into_vec(
            self.field,
            share,
            self.domain_separation_tag(USAGE_MEAS_SHARE, ctx),
            bytes([agg_id]),
            self.flp.MEAS_LEN,
        )

    def helper_proofs_share(self, ctx: bytes, agg_id: int, share: bytes) -> list[int]:
        """A helper's proofs share expanded from its seed (draft section 7.2.7)."""
        return self.xof.expand_into_vec(
            self.field,
            share,
            self.domain_separation_tag(USAGE_PROOF_SHARE, ctx),
            bytes([self.PROOFS, agg_id]),
            self.flp.PROOF_LEN * self.PROOFS,
        )

    def expand_input_share(
        self, ctx: bytes, agg_id: int, input_share: InputShare
    ) -> tuple[list[int], list[int], bytes | None]:
        """An aggregator's (measurement share, proofs share) from its input share (draft section
        7.2.7)."""
        if agg_id == 0:
            if not isinstance(input_share, LeaderInputShare):
                raise ValueError("aggregator 0 needs a leader input share")
            return input_share.meas_share, input_share.proofs_share, input_share.blind
        if not isinstance(input_share, HelperInputShare):
            raise ValueError(f"aggregator {agg_id} needs a helper input share")
        return (
            self.helper_meas_share(ctx, agg_id, input_share.share),
            self.helper_proofs_share(ctx, agg_id, input_share.share),
            input_share.blind,
        )

    def prove_rands(self, ctx: bytes, prove_seed: bytes) -> list[int]:
        """The prover randomness for every proof, from `prove_seed` (draft section 7.2.7)."""
        return self.xof.expand_into_vec(
            self.field,
            prove_seed,
            self.domain_separation_tag(USAGE_PROVE_RANDOMNESS, ctx),
            bytes([self.PROOFS]),
            self.flp.PROVE_RAND_LEN * self.PROOFS,
        )

    def query_rands(self, verify_key: bytes, ctx: bytes, nonce: bytes) -> list[int]:
        """The query randomness for every proof, from the verify key and nonce (draft section
        7.2.7)."""
        return self.xof.expand_into_vec(
            self.field,
            verify_key,
            self.domain_separation_tag(USAGE_QUERY_RANDOMNESS, ctx),
            bytes([self.PROOFS]) + nonce,
            self.flp.QUERY_RAND_LEN * self.PROOFS,
        )

    def joint_rand_part(
        self, ctx: bytes, agg_id: int, blind: bytes, meas_share: list[int], nonce: bytes
    ) -> bytes:
        """One aggregator's part of the joint randomness seed (draft section 7.2.7)."""
        return self.xof.derive_seed(
            blind,
            self.domain_separation_tag(USAGE_JOINT_RAND_PART, ctx),
            bytes([agg_id]) + nonce + self.field.encode_vec(meas_share),
        )

    def joint_rand_seed(self, ctx: bytes, joint_rand_parts: Sequence[bytes]) -> bytes:
        """The joint randomness seed from all parts (draft section 7.2.7)."""
        return self.xof.derive_seed(
            bytes(self.xof.SEED_SIZE),
            self.domain_separation_tag(USAGE_JOINT_RAND_SEED, ctx),
            b"".join(joint_rand_parts),
        )

    def joint_rands(self, ctx: bytes, joint_rand_seed: bytes) -> list[int]:
        """The joint randomness for every proof, from its seed (draft section 7.2.7)."""
        return self.xof.expand_into_vec(
            self.field,
            joint_rand_seed,
            self.domain_separation_tag(USAGE_JOINT_RANDOMNESS, ctx),
            bytes([self.PROOFS]),
            self.flp.JOINT_RAND_LEN * self.PROOFS,
        )

    # -- codec -----------------------------------------------------------
    # Every decoder takes exactly the bytes of one message: short input,
    # trailing bytes and unreduced field elements raise CodecError.

    def _take(self, encoded: bytes, offset: int, length: int, what: str) -> bytes:
        if offset + length > len(encoded):
            raise CodecError(f"{what} is truncated: needs {offset + length} bytes")
        return encoded[offset : offset + length]

    def _done(self, encoded: bytes, offset: int, what: str) -> None:
        if offset != len(encoded):
            raise CodecError(f"{what} has {len(encoded) - offset} trailing bytes")

    def _decode_elems(self, encoded: bytes, offset: int, count: int, what: str) -> list[int]:
        size = self.field.ENCODED_SIZE
        return self.field.decode_vec(self._take(encoded, offset, count * size, what))

    # The encodings below have fixed lengths for a given instance (draft
    # section 7.2.6): these are those lengths, so that a server can refuse a
    # message of any other size before it stores or decrypts anything.

    def public_share_size(self) -> int:
        """Bytes of an encoded public share: one joint randomness part per share, if any."""
        return self.SHARES * self.xof.SEED_SIZE if self.flp.JOINT_RAND_LEN > 0 else 0

    def input_share_size(self, agg_id: int) -> int:
        """Bytes of aggregator `agg_id`'s encoded input share: the leader's measurement
        and proofs shares, a helper's seed; plus a blind with joint randomness."""
        blind = self.xof.SEED_SIZE if self.flp.JOINT_RAND_LEN > 0 else 0
        if agg_id == 0:
            elems = self.flp.MEAS_LEN + self.flp.PROOF_LEN * self.PROOFS
            return elems * self.field.ENCODED_SIZE + blind
        return self.xof.SEED_SIZE + blind

    def verifier_share_size(self) -> int:
        """Bytes of an encoded verifier share (with its joint randomness part, if any)."""
        part = self.xof.SEED_SIZE if self.flp.JOINT_RAND_LEN > 0 else 0
        return self.flp.VERIFIER_LEN * self.PROOFS * self.field.ENCODED_SIZE + part

    def encode_public_share(self, public_share: PublicShare) -> bytes:
        """The public share's bytes: the joint randomness parts, if any (draft section 7.2.6)."""
        return b"" if public_share is None else b"".join(public_share)

    def decode_public_share(self, encoded: bytes) -> PublicShare:
        """Inverse of `encode_public_share`; raises CodecError on any other length (draft section
        7.2.6)."""
        if self.flp.JOINT_RAND_LEN == 0:
            self._done(encoded, 0, "public share")
            return None
        size = self.xof.SEED_SIZE
        parts = [self._take(encoded, i * size, size, "public share") for i in range(self.SHARES)]
        self._done(encoded, self.SHARES * size, "public share")
        return parts

    def encode_input_share(self, input_share: InputShare) -> bytes:
        """An input share's bytes (draft section 7.2.6)."""
        if isinstance(input_share, LeaderInputShare):
            encoded = self.field.encode_vec(input_share.meas_share) + self.field.encode_vec(
                input_share.proofs_share
            )
        else:
            encoded = input_share.share
        return encoded + (input_share.blind or b"")

    def decode_input_share(self, agg_id: int, encoded: bytes) -> InputShare:
        """Aggregator `agg_id`'s input share; raises CodecError on a bad encoding (draft section
        7.2.6)."""
        if not 0 <= agg_id < self.SHARES:
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        seed = self.xof.SEED_SIZE
        size = self.field.ENCODED_SIZE
        joint = self.flp.JOINT_RAND_LEN > 0
        what = "input share"
        if agg_id == 0:
            meas_len = self.flp.MEAS_LEN
            proofs_len = self.flp.PROOF_LEN * self.PROOFS
            meas = self._decode_elems(encoded, 0, meas_len, what)
            proofs = self._decode_elems(encoded, meas_len * size, proofs_len, what)
            offset = (meas_len + proofs_len) * size
            blind = self._take(encoded, offset, seed, what) if joint else None
            self._done(encoded, offset + (seed if joint else 0), what)
            return LeaderInputShare(meas, proofs, blind)
        share = self._take(encoded, 0, seed, what)
        blind = self._take(encoded, seed, seed, what) if joint else None
        self._done(encoded, seed * (2 if joint else 1), what)
        return HelperInputShare(share, blind)

    def encode_verifier_share(self, verifier_share: VerifierShare) -> bytes:
        """A verifier share's bytes (draft section 7.2.6)."""
        return self.field.encode_vec(verifier_share.verifiers_share) + (
            verifier_share.joint_rand_part or b""
        )

    def decode_verifier_share(self, verify_state: VerifyState, encoded: bytes) -> VerifierShare:
        """Inverse of `encode_verifier_share`; raises CodecError on a bad encoding (draft section
        7.2.6)."""
        what = "verifier share"
        count = self.flp.VERIFIER_LEN * self.PROOFS
        verifiers = self._decode_elems(encoded, 0, count, what)
        offset = count * self.field.ENCODED_SIZE
        part = None
        if self.flp.JOINT_RAND_LEN > 0:
            part = self._take(encoded, offset, self.xof.SEED_SIZE, what)
            offset += self.xof.SEED_SIZE
        self._done(encoded, offset, what)
        return VerifierShare(verifiers, part)

    def encode_verifier_message(self, verifier_message: VerifierMessage) -> bytes:
        """The verifier message as bytes: the joint randomness seed or b"" (draft 7.2.6)."""
        return verifier_message or b""

    def decode_verifier_message(self, verify_state: VerifyState, encoded: bytes) -> VerifierMessage:
        """Inverse of `encode_verifier_message`; raises CodecError on a bad encoding (draft section
        7.2.6)."""
        if self.flp.JOINT_RAND_LEN == 0:
            self._done(encoded, 0, "verifier message")
            return None
        seed = self._take(encoded, 0, self.xof.SEED_SIZE, "verifier message")
        self._done(encoded, self.xof.SEED_SIZE, "verifier message")
        return seed

    def encode_agg_share(self, agg_share: list[int]) -> bytes:
        """An aggregate share's bytes (draft section 7.2.6)."""
        return self.field.encode_vec(agg_share)

    def decode_agg_share(self, agg_param: None, encoded: bytes) -> list[int]:
        """Inverse of `encode_agg_share`; raises CodecError if malformed (draft section 7.2.6)."""
        return self._decode_output(encoded, "aggregate share")

    def encode_out_share(self, out_share: list[int]) -> bytes:
        """An output share's bytes (draft section 7.2.6)."""
        return self.field.encode_vec(out_share)

    def decode_out_share(self, agg_param: None, encoded: bytes) -> list[int]:
        """Inverse of `encode_out_share` (draft section 7.2.6)."""
        return self._decode_output(encoded, "output share")

    def _decode_output(self, encoded: bytes, what: str) -> list[int]:
        vec = self._decode_elems(encoded, 0, self.flp.OUTPUT_LEN, what)
        self._done(encoded, self.flp.OUTPUT_LEN * self.field.ENCODED_SIZE, what)
        return vec

    def encode_agg_param(self, agg_param: None) -> bytes:
        """Prio3 has no aggregation parameter: the empty string."""
        return b""

    def decode_agg_param(self, encoded: bytes) -> None:
        """Prio3 has no aggregation parameter: accepts only the empty string."""
        if encoded:
            raise CodecError("Prio3 has no aggregation parameter; expected empty bytes")


# -- instantiations (Section 7.4) -----------------------------------------


class Prio3Count(Prio3[int, int]):
    """Counts: each measurement is 0 or 1 (draft section 7.4.1).

    >>> Prio3Count(2).flp.MEAS_LEN
    1
    """

    ID = 0x00000001

    def __init__(self, shares: int) -> None:
        super().__init__(shares, circuits.Count(Field64), 1)


class Prio3Sum(Prio3[int, int]):
    """Sums of integers in [0, max_measurement] (draft section 7.4.2)."""

    ID = 0x00000002

    def __init__(self, shares: int, max_measurement: int) -> None:
        super().__init__(shares, circuits.Sum(Field64, max_measurement), 1)


class Prio3SumVec(Prio3[Sequence[int], list[int]]):
    """Element-wise sums of `length` integers, each in [0, max_measurement]
    (draft section 7.4.3)."""

    ID = 0x00000003

    def __init__(self, shares: int, length: int, max_measurement: int, chunk_length: int) -> None:
        super().__init__(
            shares, circuits.SumVec(Field128, length, max_measurement, chunk_length), 1
        )


class Prio3Histogram(Prio3[int, list[int]]):
    """Histograms: each measurement is one bucket index in [0, length)
    (draft section 7.4.4)."""

    ID = 0x00000004

    def __init__(self, shares: int, length: int, chunk_length: int) -> None:
        super().__init__(shares, circuits.Histogram(Field128, length, chunk_length), 1)


class Prio3MultihotCountVec(Prio3[Sequence[bool], list[int]]):
    """Per-option counts: each measurement is `length` booleans with at most
    `max_weight` set (draft section 7.4.5)."""

    ID = 0x00000005

    def __init__(self, shares: int, length: int, max_weight: int, chunk_length: int) -> None:
        super().__init__(
            shares, circuits.MultihotCountVec(Field128, length, max_weight, chunk_length), 1
        )


class Prio3L1BoundSum(Prio3[Sequence[int], list[int]]):
    """Element-wise sums of `length` non-negative integers whose sum is at
    most `max_value` (draft-ietf-ppm-l1-bound-sum-02, Section 3)."""

    ID = 0x00000007

    def __init__(self, shares: int, length: int, max_value: int, chunk_length: int) -> None:
        super().__init__(shares, circuits.L1BoundSum(Field128, length, max_value, chunk_length), 1)


class Prio3SumVecWithMultiproof(Prio3[Sequence[int], list[int]]):
    """Prio3SumVec with several proofs over a smaller field (Section 7.4.5);
    ``ID`` is the draft's test-only codepoint."""

    ID = 0xFFFFFFFF

    def __init__(
        self,
        shares: int,
        field: type[Field],
        num_proofs: int,
        length: int,
        max_measurement: int,
        chunk_length: int,
    ) -> None:
        super().__init__(
            shares, circuits.SumVec(field, length, max_measurement, chunk_length), num_proofs
        )


def prio3_with_circuit(
    vdaf_id: int, shares: int, valid: circuits.Valid[Any, Any], num_proofs: int = 1
) -> Prio3[Any, Any]:
    """Prio3 over a caller-supplied circuit (e.g. the draft's test-only
    ``HigherDegree``), with the given codepoint."""

    class _Custom(Prio3[Any, Any]):
        ID = vdaf_id

    return _Custom(shares, valid, num_proofs)
