"""Prio3 (draft-irtf-cfrg-vdaf-18, Section 7) over many reports at once.

``BatchPrio3`` wraps a scalar ``Prio3`` and runs the same algorithms with
one NumPy row per report: ``shard_batch`` (clients, simulations),
``verify_init_batch``, ``verifier_shares_to_message_batch``,
``verify_next_batch`` and ``aggregate_batch`` (aggregators). It agrees
with the scalar path byte for byte, report by report.

Messages cross the batch boundary as the scalar path's encodings
(``Prio3.encode_*``), which is what the servers store and send. Scalar
values (``LeaderInputShare``, ``HelperInputShare``, ``VerifierShare``) are
accepted wherever encoded bytes are and encoded on the way in.

A report that fails (bad encoding, rejected proof, joint randomness
mismatch) never raises for the batch: each result carries ``errors``, one
``VdafError`` or ``None`` per report, and ``ok``, a boolean mask; later
steps pass earlier failures through. Only misuse that would be wrong for
every report (a bad verify key, ``agg_id`` or batch lengths) raises.

One aggregation job, both aggregators in one process (in a deployment the
leader and helper each run their half and exchange the encoded shares)::

    batch = BatchPrio3(Prio3Histogram(2, 100, 10))
    sharded = batch.shard_batch(ctx, measurements, nonces, rands)
    inits = [
        batch.verify_init_batch(key, ctx, j, nonces, sharded.public_shares,
                                sharded.input_shares[j])
        for j in (0, 1)
    ]
    msgs = batch.verifier_shares_to_message_batch(
        ctx, [init.verifier_shares for init in inits])
    outs = [batch.verify_next_batch(ctx, init.state, msgs.messages) for init in inits]
    agg_shares = [batch.aggregate_batch(out) for out in outs]  # list[int] each
    rejected = [i for i, e in enumerate(outs[0].errors) if e is not None]

Work is split into sub-batches (``shard_chunk_elements``,
``verify_chunk_elements``) so memory stays bounded however many reports are
passed; throughput-bound processes should also call
``veil.tuning.tune_allocator()`` once at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic

import numpy as np

from veil.vdaf.batch.field import Arr, VecField
from veil.vdaf.batch.flp import BatchFlp
from veil.vdaf.batch.prio3_shard import Prio3Sharder, ShardBatch
from veil.vdaf.batch.prio3_xof import Prio3Randomness
from veil.vdaf.batch.rows import Errors, byte_rows, flag, ok_mask
from veil.vdaf.batch.xof import SEED_SIZE
from veil.vdaf.errors import CodecError, VerifyError
from veil.vdaf.spec.circuits import AggResult, Measurement
from veil.vdaf.spec.prio3 import (
    HelperInputShare,
    LeaderInputShare,
    Prio3,
    PublicShare,
    VerifierShare,
    VerifyState,
)
from veil.vdaf.spec.xof import XofTurboShake128


@dataclass
class BatchVerifyState:
    """Aggregator state between ``verify_init_batch`` and ``verify_next_batch``:
    output shares ``(reports, OUTPUT_LEN)`` as a field array of ``vf``, the
    corrected joint randomness seeds (``(reports, 32)`` bytes, or ``None``
    when the circuit has no joint randomness) and the per-report errors."""

    vf: type[VecField]
    out_shares: Arr
    corrected_seeds: Arr | None
    errors: Errors

    @property
    def ok(self) -> Arr:
        return ok_mask(self.errors)

    def __len__(self) -> int:
        return len(self.errors)

    def state(self, i: int) -> VerifyState:
        """Report i's state as the scalar type (``VerifyError`` if it failed)."""
        error = self.errors[i]
        if error is not None:
            raise error
        out = self.vf.to_ints(self.out_shares[..., i, :])
        seed = None if self.corrected_seeds is None else self.corrected_seeds[i].tobytes()
        return VerifyState(out, seed)


@dataclass
class VerifyInitBatch:
    """Result of ``verify_init_batch``: the state to keep and the encoded
    verifier shares to send (``None`` for failed reports)."""

    state: BatchVerifyState
    verifier_shares: list[bytes | None]

    @property
    def errors(self) -> Errors:
        return self.state.errors

    @property
    def ok(self) -> Arr:
        return self.state.ok


@dataclass
class MessageBatch:
    """Encoded verifier messages (``None`` where the report was rejected)."""

    messages: list[bytes | None]
    errors: Errors

    @property
    def ok(self) -> Arr:
        return ok_mask(self.errors)


@dataclass
class OutShareBatch:
    """Output shares ``(reports, OUTPUT_LEN)``; rows of failed reports are
    zero and excluded by ``ok``."""

    vf: type[VecField]
    out_shares: Arr
    errors: Errors = field(default_factory=list)

    @property
    def ok(self) -> Arr:
        return ok_mask(self.errors)

    def out_share(self, i: int) -> list[int]:
        error = self.errors[i]
        if error is not None:
            raise error
        result: list[int] = self.vf.to_ints(self.out_shares[..., i, :])
        return result


class BatchPrio3(Generic[Measurement, AggResult]):
    """The batched path of one ``Prio3`` instance.

    ``lifted=True`` evaluates the circuit through its scalar code on
    columns of the batch instead of the hand-vectorised form (used by the
    tests to check one against the other; circuits the batch module does
    not know always take that path).
    """

    # Field elements per sub-batch when sharding and when verifying, and
    # reports per sub-batch at most. Measured on 2 cores: the verifier's
    # many per-report steps favour large sub-batches (the field operations
    # block themselves for the caches). The prover's transforms and copies
    # favoured smaller ones until its range-check wires and the Field128
    # codec were compiled; since then 1 << 18 shards SumVec(100,255,30)
    # about 6% faster than 1 << 15 and the others alike.
    shard_chunk_elements = 1 << 18
    verify_chunk_elements = 1 << 18
    max_chunk = 4096

    def __init__(self, vdaf: Prio3[Measurement, AggResult], lifted: bool = False) -> None:
        if vdaf.xof is not XofTurboShake128:
            raise ValueError("the batched path implements XofTurboShake128 only")
        self.vdaf = vdaf
        self.flp = BatchFlp(vdaf.flp, lifted)
        self.vf = self.flp.vf
        self.field = vdaf.field
        scalar = vdaf.flp
        self.MEAS_LEN = scalar.MEAS_LEN
        self.OUTPUT_LEN = scalar.OUTPUT_LEN
        self.PROOF_LEN = scalar.PROOF_LEN
        self.VERIFIER_LEN = scalar.VERIFIER_LEN
        self.JOINT_RAND_LEN = scalar.JOINT_RAND_LEN
        self.PROVE_RAND_LEN = scalar.PROVE_RAND_LEN
        self.QUERY_RAND_LEN = scalar.QUERY_RAND_LEN
        self.SHARES = vdaf.SHARES
        self.PROOFS = vdaf.PROOFS
        self._joint = scalar.JOINT_RAND_LEN > 0
        self.rand = Prio3Randomness(vdaf, self.vf)
        self.sharder: Prio3Sharder[Measurement, AggResult] = Prio3Sharder(self)

    # -- sizes of the encodings ------------------------------------------------

    def input_share_size(self, agg_id: int) -> int:
        size = self.vf.ENCODED_SIZE
        blind = SEED_SIZE if self._joint else 0
        if agg_id == 0:
            return (self.MEAS_LEN + self.PROOF_LEN * self.PROOFS) * size + blind
        return SEED_SIZE + blind

    def verifier_share_size(self) -> int:
        return self.VERIFIER_LEN * self.PROOFS * self.vf.ENCODED_SIZE + (
            SEED_SIZE if self._joint else 0
        )

    # -- sub-batches ------------------------------------------------------------

    def _chunks(self, rows: int, elements: int) -> list[slice]:
        """Sub-batches of about ``elements`` field elements of measurement
        and proof: large enough to amortise the Python work per NumPy call,
        small enough to bound memory (measured best: see the class)."""
        per_report = self.MEAS_LEN + self.PROOF_LEN * self.PROOFS + 4 * self.VERIFIER_LEN
        step = max(8, min(self.max_chunk, elements // per_report))
        return [slice(i, min(rows, i + step)) for i in range(0, rows, step)]

    def shard_batch(
        self,
        ctx: bytes,
        measurements: Sequence[Measurement],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        """``Prio3.shard`` for every report (``Prio3Sharder.shard_batch``)."""
        return self.sharder.shard_batch(ctx, measurements, nonces, rands)

    # -- verification -----------------------------------------------------------

    def verify_init_batch(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | PublicShare],
        input_shares: Sequence[bytes | LeaderInputShare | HelperInputShare],
    ) -> VerifyInitBatch:
        """``Prio3.verify_init`` for aggregator ``agg_id`` on every report."""
        vdaf = self.vdaf
        if len(verify_key) != vdaf.VERIFY_KEY_SIZE:
            raise ValueError(f"verify_key must be {vdaf.VERIFY_KEY_SIZE} bytes")
        if not 0 <= agg_id < self.SHARES:
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        rows = len(nonces)
        if len(public_shares) != rows or len(input_shares) != rows:
            raise ValueError("nonces, public shares and input shares must have the same length")
        vf = self.vf
        outs = [vf.zeros((0, self.OUTPUT_LEN))]
        seeds = [np.zeros((0, SEED_SIZE), dtype=np.uint8)]
        errors: Errors = []
        shares: list[bytes | None] = []
        for s in self._chunks(rows, self.verify_chunk_elements):
            part = self._verify_init_chunk(
                verify_key, ctx, agg_id, nonces[s], public_shares[s], input_shares[s]
            )
            outs.append(part.state.out_shares)
            if part.state.corrected_seeds is not None:
                seeds.append(part.state.corrected_seeds)
            errors += part.state.errors
            shares += part.verifier_shares
        # One concatenation at the end: appending chunk by chunk would copy
        # the growing arrays again and again.
        state = BatchVerifyState(
            vf,
            vf.concat(outs, axis=-2),
            np.concatenate(seeds) if self._joint else None,
            errors,
        )
        return VerifyInitBatch(state, shares)

    def _verify_init_chunk(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | PublicShare],
        input_shares: Sequence[bytes | LeaderInputShare | HelperInputShare],
    ) -> VerifyInitBatch:
        vdaf = self.vdaf
        vf = self.vf
        rows = len(nonces)
        errors: Errors = [None] * rows
        nonce_rows = byte_rows(nonces, vdaf.NONCE_SIZE, "nonce", errors)
        encoded = [s if isinstance(s, bytes) else vdaf.encode_input_share(s) for s in input_shares]
        raw = byte_rows(encoded, self.input_share_size(agg_id), "input share", errors)

        size = vf.ENCODED_SIZE
        proofs_len = self.PROOF_LEN * self.PROOFS
        if agg_id == 0:
            meas_end = self.MEAS_LEN * size
            proofs_end = meas_end + proofs_len * size
            meas_bytes = raw[:, :meas_end]
            meas, ok_meas = vf.decode(meas_bytes)
            proofs, ok_proofs = vf.decode(raw[:, meas_end:proofs_end])
            reduced = ok_meas.all(axis=1) & ok_proofs.all(axis=1)
            flag(errors, ~reduced, CodecError("input share has an unreduced field element"))
            blinds = raw[:, proofs_end:]
        else:
            meas_bytes = None
            seeds = raw[:, :SEED_SIZE]
            meas = self.rand.meas_share(ctx, agg_id, seeds, rows)
            proofs = self.rand.proofs_share(ctx, agg_id, seeds, rows)
            blinds = raw[:, SEED_SIZE:]

        joint_rands = vf.zeros((rows, 0))
        corrected = None
        part = None
        if self._joint:
            public_raw = byte_rows(
                [s if isinstance(s, bytes) else vdaf.encode_public_share(s) for s in public_shares],
                SEED_SIZE * self.SHARES,
                "public share",
                errors,
            )
            # The leader's measurement share hashed as it came (the rows
            # that decoded to reduced elements encode back to those bytes).
            part = self.rand.joint_rand_part(ctx, agg_id, blinds, meas, nonce_rows, meas_bytes)
            parts = public_raw.copy()
            parts[:, agg_id * SEED_SIZE : (agg_id + 1) * SEED_SIZE] = part
            corrected = self.rand.joint_rand_seed(ctx, parts)
            joint_rands = self.rand.joint_rands(ctx, corrected)
        else:
            for i, s in enumerate(public_shares):
                if s not in (b"", None) and errors[i] is None:
                    errors[i] = CodecError("public share must be empty for this circuit")

        query_rands = self.rand.query_rands(verify_key, ctx, nonce_rows)
        verifiers = []
        redo = np.zeros(rows, dtype=bool)
        for i in range(self.PROOFS):
            verifier, bad, node_hit = self.flp.query(
                meas,
                proofs[..., i * self.PROOF_LEN : (i + 1) * self.PROOF_LEN],
                query_rands[..., i * self.QUERY_RAND_LEN : (i + 1) * self.QUERY_RAND_LEN],
                joint_rands[..., i * self.JOINT_RAND_LEN : (i + 1) * self.JOINT_RAND_LEN],
                self.SHARES,
            )
            flag(
                errors,
                bad,
                VerifyError("query point is a root of unity; report cannot be verified"),
            )
            redo |= node_hit & ~bad
            verifiers.append(verifier)
        verifier_all = vf.concat(verifiers)
        out_shares = self.flp.circuit.truncate(meas)

        cols = [vf.encode(verifier_all)]
        if part is not None:
            cols.append(part)
        share_bytes = np.concatenate(cols, axis=1).tobytes()
        share_size = self.verifier_share_size()
        verifier_shares: list[bytes | None] = [
            share_bytes[i * share_size : (i + 1) * share_size] for i in range(rows)
        ]
        for k in np.flatnonzero(redo).tolist():
            verifier_shares[k] = self._scalar_verifier_share(
                verify_key, ctx, agg_id, nonces[k], public_shares[k], encoded[k]
            )
        for i, e in enumerate(errors):
            if e is not None:
                verifier_shares[i] = None
        out_shares = self._zero_failed(out_shares, ok_mask(errors))
        state = BatchVerifyState(vf, out_shares, corrected, errors)
        return VerifyInitBatch(state, verifier_shares)

    def _scalar_verifier_share(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        nonce: bytes,
        public_share: bytes | PublicShare,
        input_share: bytes,
    ) -> bytes:
        """The rare report whose query point is a root of unity of a gadget
        domain (probability about 2^-50): the scalar path handles it."""
        vdaf = self.vdaf
        public = (
            vdaf.decode_public_share(public_share)
            if isinstance(public_share, bytes)
            else public_share
        )
        _, share = vdaf.verify_init(
            verify_key,
            ctx,
            agg_id,
            None,
            nonce,
            public,
            vdaf.decode_input_share(agg_id, input_share),
        )
        return vdaf.encode_verifier_share(share)

    def verifier_shares_to_message_batch(
        self, ctx: bytes, verifier_shares: Sequence[Sequence[bytes | VerifierShare | None]]
    ) -> MessageBatch:
        """``Prio3.verifier_shares_to_message`` for every report;
        ``verifier_shares[j][i]`` is aggregator j's share for report i
        (``None`` if that aggregator already rejected it)."""
        if len(verifier_shares) != self.SHARES:
            raise ValueError(f"expected {self.SHARES} verifier shares per report")
        rows = len(verifier_shares[0])
        if any(len(s) != rows for s in verifier_shares):
            raise ValueError("every aggregator must send one verifier share per report")
        result = MessageBatch([], [])
        for s in self._chunks(rows, self.verify_chunk_elements):
            part = self._message_chunk(ctx, [shares[s] for shares in verifier_shares])
            result.messages += part.messages
            result.errors += part.errors
        return result

    def _message_chunk(
        self, ctx: bytes, verifier_shares: Sequence[Sequence[bytes | VerifierShare | None]]
    ) -> MessageBatch:
        rows = len(verifier_shares[0])
        vf = self.vf
        errors: Errors = [None] * rows
        count = self.VERIFIER_LEN * self.PROOFS
        elems = count * vf.ENCODED_SIZE
        total = None
        parts = []
        for shares in verifier_shares:
            encoded: list[bytes] = []
            for i, s in enumerate(shares):
                if s is None:
                    if errors[i] is None:
                        errors[i] = VerifyError("an aggregator rejected the report")
                    encoded.append(b"")
                elif isinstance(s, bytes):
                    encoded.append(s)
                else:
                    encoded.append(self.vdaf.encode_verifier_share(s))
            raw = byte_rows(encoded, self.verifier_share_size(), "verifier share", errors)
            verifier, reduced = vf.decode(raw[:, :elems])
            flag(errors, ~reduced.all(axis=1), CodecError("verifier share is not reduced"))
            total = verifier if total is None else vf.add(total, verifier)
            parts.append(raw[:, elems:])
        assert total is not None
        accept = np.ones(rows, dtype=bool)
        vlen = self.VERIFIER_LEN
        for i in range(self.PROOFS):
            accept &= self.flp.decide(total[..., i * vlen : (i + 1) * vlen])
        flag(errors, ~accept, VerifyError("proof verifier check failed"))
        if self._joint:
            seeds = self.rand.joint_rand_seed(ctx, np.concatenate(parts, axis=1)).tobytes()
            messages: list[bytes | None] = [
                seeds[i * SEED_SIZE : (i + 1) * SEED_SIZE] for i in range(rows)
            ]
        else:
            messages = [b""] * rows
        for i, e in enumerate(errors):
            if e is not None:
                messages[i] = None
        return MessageBatch(messages, errors)

    def verify_next_batch(
        self, ctx: bytes, state: BatchVerifyState, messages: Sequence[bytes | None]
    ) -> OutShareBatch:
        """``Prio3.verify_next`` for every report: the output shares of the
        reports whose joint randomness checks out."""
        rows = len(state)
        if len(messages) != rows:
            raise ValueError("one verifier message per report is needed")
        errors: Errors = list(state.errors)
        if self._joint:
            assert state.corrected_seeds is not None
            expected = state.corrected_seeds.tobytes()
            for i, msg in enumerate(messages):
                if errors[i] is not None:
                    continue
                if msg is None:
                    errors[i] = VerifyError("the report was rejected")
                elif len(msg) != SEED_SIZE:
                    errors[i] = CodecError(f"verifier message must be {SEED_SIZE} bytes")
                elif msg != expected[i * SEED_SIZE : (i + 1) * SEED_SIZE]:
                    errors[i] = VerifyError("joint randomness check failed")
        else:
            for i, msg in enumerate(messages):
                if errors[i] is not None:
                    continue
                if msg is None:
                    errors[i] = VerifyError("the report was rejected")
                elif msg:
                    errors[i] = CodecError("verifier message must be empty for this circuit")
        out = self._zero_failed(state.out_shares, ok_mask(errors))
        return OutShareBatch(self.vf, out, errors)

    def _zero_failed(self, out_shares: Arr, ok: Arr) -> Arr:
        """Output shares with the rows of failed reports zeroed (a copy only
        if some failed: these arrays are the largest the batch holds)."""
        if ok.all():
            return out_shares
        out = out_shares.copy()
        out[..., ~ok, :] = 0
        return out

    # -- aggregation ------------------------------------------------------------

    def aggregate_batch(self, out_shares: OutShareBatch) -> list[int]:
        """The sum of the accepted output shares (``Prio3.agg_update`` over
        them, from ``agg_init``)."""
        passed = [i for i, error in enumerate(out_shares.errors) if error is None]
        return self.aggregate_rows(out_shares, passed)

    def aggregate_rows(self, out_shares: OutShareBatch, rows: Sequence[int]) -> list[int]:
        """The sum of the output shares of `rows` (reports that passed), added
        in the batch field and converted once: a job's delta to one time
        bucket, without a list of ints per report."""
        for i in rows:
            if out_shares.errors[i] is not None:
                raise ValueError(f"row {i} failed verification: it has no output share")
        if not rows:
            return self.vdaf.agg_init(None)
        vf = self.vf
        picked = out_shares.out_shares[..., list(rows), :]
        result: list[int] = vf.to_ints(vf.sum(vf.moveaxis(picked, -2, -1), axis=-1))
        return result

    # -- interop with the scalar types ------------------------------------------

    def decode_report(
        self, batch: ShardBatch, i: int
    ) -> tuple[PublicShare, list[LeaderInputShare | HelperInputShare]]:
        """Report i of a ``ShardBatch`` as the scalar ``shard`` returns it."""
        vdaf = self.vdaf
        public = vdaf.decode_public_share(batch.public_shares[i])
        shares = [vdaf.decode_input_share(j, batch.input_shares[j][i]) for j in range(self.SHARES)]
        return public, shares
