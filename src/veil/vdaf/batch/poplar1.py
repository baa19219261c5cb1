"""Poplar1 (draft-irtf-cfrg-vdaf-20, Section 8) over many reports at once.

``BatchPoplar1`` wraps a scalar ``Poplar1`` and runs the same algorithms
with one NumPy row per report: ``shard_batch`` (clients, simulations),
``verify_init_batch``, ``verifier_shares_to_message_batch``,
``verify_next_batch`` (twice: Poplar1 verifies in two rounds) and
``aggregate_batch``. It agrees with the scalar path byte for byte, report
by report; messages cross the batch boundary as the scalar encodings.

Where the time goes, and what is done about it:

- The IDPF walks a tree of AES-hashed seeds. Every report has its own AES
  key (derived from its nonce), so AES runs per report, through OpenSSL
  (``veil.vdaf.batch.aes``): one call hashes all of a report's nodes at a
  depth, and everything between calls (the correlation-robust hash's
  sigma and xor, control bits, corrections, child selection) is one NumPy
  operation over every report and node.
- The candidate prefixes of one aggregation parameter share ancestors, and
  are the same for every report: each node of their prefix tree is
  computed once per report, not once per prefix.
- Across levels, ``IdpfCache`` keeps each report's nodes at the last level
  evaluated (and its two AES keys): the draft's rule makes every new
  prefix extend a cached one, so the next level costs one step of the
  tree, not a walk from the root.
- Between the two AES passes of a depth, the per-node work is compiled
  loops (``veil.vdaf.batch._idpf_kernels``); the walk
  (``veil.vdaf.batch.idpf``) runs over sub-batches of reports
  (``BatchIdpf.chunk_nodes``) so memory stays bounded with thousands of
  candidates.
- The sketch is Field64 arithmetic over ``(reports, prefixes)`` arrays
  (compiled kernels); the leaf level's Field255 uses Python ints in NumPy
  object arrays (one level of many).

A report that fails (bad encoding, a rejected sketch) never raises for
the batch: each result carries ``errors``, one ``VdafError`` or ``None``
per report, and ``ok``; later steps pass earlier failures through. Misuse
that is wrong for every report (a malformed aggregation parameter, a bad
verify key or ``agg_id``, mismatched lengths) raises.

One level, both aggregators in one process::

    batch = BatchPoplar1(Poplar1(128))
    sharded = batch.shard_batch(ctx, measurements, nonces, rands)
    caches = [None, None]
    agg_param = Poplar1AggParam(0, ((False,), (True,)))
    inits = [
        batch.verify_init_batch(key, ctx, j, agg_param, nonces,
                                sharded.public_shares, sharded.input_shares[j], caches[j])
        for j in (0, 1)
    ]
    caches = [init.cache for init in inits]  # for the next level
    msgs = batch.verifier_shares_to_message_batch(
        ctx, agg_param, [init.verifier_shares for init in inits])
    # (In a deployment each aggregator passes the encoded messages it got,
    # msgs.messages; in one process the MessageBatch keeps its errors too.)
    seconds = [batch.verify_next_batch(ctx, init.state, msgs) for init in inits]
    finals = batch.verifier_shares_to_message_batch(
        ctx, agg_param, [s.verifier_shares for s in seconds])
    outs = [batch.verify_next_batch(ctx, s.state, finals) for s in seconds]
    counts = vdaf.unshard(agg_param, [batch.aggregate_batch(o) for o in outs], n)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from veil.vdaf.batch.field import Arr, VecField64
from veil.vdaf.batch.idpf import (
    MASK255,
    P64,
    P255,
    Arith,
    BatchIdpf,
    IdpfCache,
    IdpfShares,
    Inner,
    Leaf,
    bytes_of,
    encode255,
    ints255,
    u64,
    words,
)
from veil.vdaf.batch.prio3 import MessageBatch
from veil.vdaf.batch.prio3_shard import ShardBatch
from veil.vdaf.batch.rows import Errors, byte_rows, flag, ok_mask
from veil.vdaf.batch.xof import expand_rows, xof_rows
from veil.vdaf.errors import CodecError, VerifyError
from veil.vdaf.spec.field import Field255
from veil.vdaf.spec.poplar1 import (
    EVALUATE_SKETCH,
    REVEAL_SKETCH,
    USAGE_CORR_INNER,
    USAGE_CORR_LEAF,
    USAGE_SHARD_RAND,
    USAGE_VERIFY_RAND,
    FieldVec,
    Poplar1,
    Poplar1AggParam,
)


@dataclass
class _Decoded:
    """One aggregator's reports, decoded: the IDPF's inputs (``idpf``:
    key, correction words by level, nonces); the correlated randomness."""

    idpf: IdpfShares
    corr_seeds: Arr  # (R, 32) uint8
    corr_inner: Arr  # (R, 2 * (BITS - 1)) uint64
    corr_leaf_bytes: Arr  # (R, 64) uint8, checked reduced
    errors: Errors

    @cached_property
    def corr_leaf(self) -> Arr:
        """The leaf's (A, B) shares, ``(R, 2)`` Python ints (only the leaf
        level reads them)."""
        return ints255(self.corr_leaf_bytes)


@dataclass
class BatchVerifyState:
    """An aggregator's state for a batch: the step, the level, the sketch
    memory (``a_share``, ``b_share``: A and B of each report) and the output
    shares ``(reports, prefixes)`` in the level's field."""

    step: bytes
    level: int
    agg_id: int
    a_share: Arr
    b_share: Arr
    out_shares: Arr
    errors: Errors

    @property
    def ok(self) -> Arr:
        return ok_mask(self.errors)

    def __len__(self) -> int:
        return len(self.errors)


@dataclass
class VerifyRoundBatch:
    """A round's result: the state to keep, the encoded verifier shares to
    send (``None`` for failed reports), and after ``verify_init_batch`` the
    IDPF cache for the next level."""

    state: BatchVerifyState
    verifier_shares: list[bytes | None]
    cache: IdpfCache | None = None

    @property
    def errors(self) -> Errors:
        return self.state.errors

    @property
    def ok(self) -> Arr:
        return self.state.ok


@dataclass
class Poplar1OutShareBatch:
    """Output shares ``(reports, prefixes)`` of the level's field; rows of
    failed reports are excluded by ``ok``."""

    level: int
    out_shares: Arr
    errors: Errors

    @property
    def ok(self) -> Arr:
        return ok_mask(self.errors)


class BatchPoplar1:
    """The batched path of one ``Poplar1`` instance; its IDPF is ``walk``
    (``BatchIdpf``, whose ``chunk_nodes`` and ``cache_nodes`` bound the
    walk's memory and the cache it keeps)."""

    def __init__(self, vdaf: Poplar1) -> None:
        self.vdaf = vdaf
        self.walk = BatchIdpf(vdaf.idpf)
        self.BITS = vdaf.BITS
        self.SHARES = vdaf.SHARES

    # -- decoding ----------------------------------------------------------

    def _decode(
        self,
        agg_id: int,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | None],
        input_shares: Sequence[bytes | None],
    ) -> _Decoded:
        rows = len(nonces)
        bits = self.BITS
        errors: Errors = [None] * rows
        nonce_rows = byte_rows(nonces, self.vdaf.NONCE_SIZE, "nonce", errors)
        public = byte_rows(public_shares, self.vdaf.public_share_size(), "public share", errors)
        packed_len = (2 * bits + 7) // 8
        ctrl = np.unpackbits(public[:, :packed_len], axis=1, bitorder="little")
        flag(errors, ctrl[:, 2 * bits :].any(axis=1), CodecError("control bits: padding set"))
        ctrl_cw = ctrl[:, : 2 * bits].reshape(rows, bits, 2).astype(bool)
        offset = packed_len
        seed_cw = words(public[:, offset : offset + 16 * bits]).reshape(rows, bits, 2)
        offset += 16 * bits
        w_inner, ok = Inner.decode(public[:, offset : offset + 16 * (bits - 1)])
        flag(errors, ~ok.all(axis=1), CodecError("public share: Field64 element not reduced"))
        w_inner = w_inner.reshape(rows, bits - 1, 2)
        offset += 16 * (bits - 1)
        w_leaf = public[:, offset:]
        ok = Leaf.reduced(w_leaf)
        flag(errors, ~ok.all(axis=1), CodecError("public share: Field255 element not reduced"))

        shares = byte_rows(input_shares, self.vdaf.input_share_size(agg_id), "input share", errors)
        keys = u64(shares[:, :16])
        corr_seeds = shares[:, 16:48]
        corr_inner, ok = Inner.decode(shares[:, 48 : 48 + 16 * (bits - 1)])
        flag(errors, ~ok.all(axis=1), CodecError("input share: Field64 element not reduced"))
        corr_leaf = shares[:, 48 + 16 * (bits - 1) :]
        ok = Leaf.reduced(corr_leaf)
        flag(errors, ~ok.all(axis=1), CodecError("input share: Field255 element not reduced"))
        return _Decoded(
            IdpfShares(nonce_rows, ctrl_cw, seed_cw, w_inner, w_leaf, keys),
            corr_seeds,
            corr_inner,
            corr_leaf,
            errors,
        )

    # -- sharding ------------------------------------------------------------

    def shard_batch(
        self,
        ctx: bytes,
        measurements: Sequence[Sequence[bool]],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        """``Poplar1.shard`` for every report, encoded. ValueError (naming
        the report) on a bad measurement, nonce or ``rand`` size."""
        vdaf = self.vdaf
        rows = len(measurements)
        if len(nonces) != rows or len(rands) != rows:
            raise ValueError("measurements, nonces and rands must have the same length")
        for i, (m, n, rand) in enumerate(zip(measurements, nonces, rands, strict=True)):
            if len(m) != self.BITS or any(not isinstance(b, bool) for b in m):
                raise ValueError(f"report {i}: a Poplar1({self.BITS}) measurement is bools")
            if len(n) != vdaf.NONCE_SIZE:
                raise ValueError(f"report {i}: nonce must be {vdaf.NONCE_SIZE} bytes")
            if len(rand) != vdaf.RAND_SIZE:
                raise ValueError(f"report {i}: rand must be {vdaf.RAND_SIZE} bytes")
        if rows == 0:
            return ShardBatch([], [[], []])
        bits = self.BITS
        alpha = np.array(measurements, dtype=bool).reshape(rows, bits)
        nonce_rows = np.frombuffer(b"".join(nonces), dtype=np.uint8).reshape(rows, -1)
        rand_rows = np.frombuffer(b"".join(rands), dtype=np.uint8).reshape(rows, -1)
        keys = u64(rand_rows[:, :32]).reshape(rows, 2, 2)
        corr_seeds = [rand_rows[:, 32:64], rand_rows[:, 64:96]]
        shard_seeds = rand_rows[:, 96:128]
        redo = np.zeros(rows, dtype=bool)  # rows a rejected candidate shifted

        # The shard XOF's stream: the authenticators k (inner, then leaf),
        # then two elements per level for the helper's (A, B) shares.
        inner_len, leaf_len = 8 * (bits - 1), 32
        stream = xof_rows(
            shard_seeds,
            vdaf.domain_separation_tag(USAGE_SHARD_RAND, ctx),
            nonce_rows,
            inner_len * 3 + leaf_len * 3,
            rows,
        )
        k_inner = u64(stream[:, :inner_len])
        redo |= (k_inner >= P64).any(axis=1)
        k_leaf = ints255(stream[:, inner_len : inner_len + 32])[:, 0] & MASK255
        redo |= k_leaf >= P255
        offset = inner_len + 32
        corr1_inner = u64(stream[:, offset : offset + 2 * inner_len]).reshape(rows, bits - 1, 2)
        redo |= (corr1_inner >= P64).any(axis=(1, 2))
        corr1_leaf = ints255(stream[:, offset + 2 * inner_len :]) & MASK255
        redo |= (corr1_leaf >= P255).any(axis=1)

        public, redo_gen = self.walk.gen(ctx, alpha, nonce_rows, keys, k_inner, k_leaf)
        redo |= redo_gen

        # The (a, b, c) offsets of both aggregators' seeds, and (A, B).
        offsets = []
        leaf_offsets = []
        for j in (0, 1):
            binders = np.concatenate([np.full((rows, 1), j, np.uint8), nonce_rows], axis=1)
            offsets.append(
                expand_rows(
                    VecField64,
                    corr_seeds[j],
                    vdaf.domain_separation_tag(USAGE_CORR_INNER, ctx),
                    binders,
                    3 * (bits - 1),
                    rows,
                )
            )
            leaf_offsets.append(
                self._expand_leaf(
                    corr_seeds[j], vdaf.domain_separation_tag(USAGE_CORR_LEAF, ctx), binders, 3
                )
            )
        abc = VecField64.add(offsets[0], offsets[1]).reshape(rows, bits - 1, 3)
        a, b, c = abc[..., 0], abc[..., 1], abc[..., 2]
        # A = -2a + k, B = a^2 + b - a*k + c (BBCGGI21, Appendix C.4).
        big_a = VecField64.sub(k_inner, VecField64.add(a, a))
        big_b = VecField64.add(
            VecField64.sub(VecField64.add(VecField64.mul(a, a), b), VecField64.mul(a, k_inner)), c
        )
        corr0_inner = VecField64.sub(np.stack([big_a, big_b], axis=2), corr1_inner)
        la, lb, lc = (Leaf.add(leaf_offsets[0], leaf_offsets[1])[:, i] for i in range(3))
        leaf_a = (k_leaf - 2 * la) % P255
        leaf_b = (la * la + lb - la * k_leaf + lc) % P255
        corr0_leaf = Leaf.sub(np.stack([leaf_a, leaf_b], axis=1), corr1_leaf)

        key_bytes = np.frombuffer(bytes_of(keys), np.uint8).reshape(rows, 2, 16)
        inner_bytes = [
            np.frombuffer(bytes_of(v), np.uint8).reshape(rows, -1)
            for v in (corr0_inner, corr1_inner)
        ]
        input_shares: list[list[bytes]] = [[], []]
        for r in range(rows):
            for j, leaf in enumerate((corr0_leaf, corr1_leaf)):
                input_shares[j].append(
                    key_bytes[r, j].tobytes()
                    + corr_seeds[j][r].tobytes()
                    + inner_bytes[j][r].tobytes()
                    + encode255(leaf[r])
                )
        for row in np.flatnonzero(redo).tolist():
            public_share, shares = vdaf.shard(ctx, measurements[row], nonces[row], rands[row])
            public[row] = vdaf.encode_public_share(public_share)
            for j in (0, 1):
                input_shares[j][row] = vdaf.encode_input_share(shares[j])
        return ShardBatch(public, input_shares)

    # -- verification --------------------------------------------------------

    def verify_init_batch(
        self,
        verify_key: bytes,
        ctx: bytes,
        agg_id: int,
        agg_param: Poplar1AggParam,
        nonces: Sequence[bytes],
        public_shares: Sequence[bytes | None],
        input_shares: Sequence[bytes | None],
        cache: IdpfCache | None = None,
    ) -> VerifyRoundBatch:
        """``Poplar1.verify_init`` for every report, from encoded shares.
        With ``cache`` (this aggregator's cache of the previous level for
        the same reports), the walk starts there; the returned cache serves
        the next level. ``AggParamError`` for a malformed parameter (or,
        with a cache, one that breaks the draft's sequence rule)."""
        vdaf = self.vdaf
        if len(verify_key) != vdaf.VERIFY_KEY_SIZE:
            raise ValueError(f"verify_key must be {vdaf.VERIFY_KEY_SIZE} bytes")
        if agg_id not in range(self.SHARES):
            raise ValueError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if not len(nonces) == len(public_shares) == len(input_shares):
            raise ValueError("nonces, public shares and input shares must have the same length")
        vdaf.check_agg_param(agg_param)
        level, prefixes = agg_param
        d = self._decode(agg_id, nonces, public_shares, input_shares)
        rows = len(nonces)
        arith = self.walk.arith(level)
        data, auth, new_cache = self.walk.eval(agg_id, level, prefixes, ctx, d.idpf, cache)

        # The level's (a, b, c) shares, and (A, B) from the input share.
        binders = np.concatenate(
            [np.full((rows, 1), agg_id, dtype=np.uint8), d.idpf.nonces], axis=1
        )
        if level < self.BITS - 1:
            dst = vdaf.domain_separation_tag(USAGE_CORR_INNER, ctx)
            abc = expand_rows(VecField64, d.corr_seeds, dst, binders, 3 * level + 3, rows)[:, -3:]
            big_a = d.corr_inner[:, 2 * level]
            big_b = d.corr_inner[:, 2 * level + 1]
        else:
            dst = vdaf.domain_separation_tag(USAGE_CORR_LEAF, ctx)
            abc = self._expand_leaf(d.corr_seeds, dst, binders, 3)
            big_a, big_b = d.corr_leaf[:, 0], d.corr_leaf[:, 1]
        verify_rand = self._verify_rand(verify_key, ctx, d.idpf.nonces, level, len(prefixes))
        s0 = arith.add(abc[:, 0], arith.dot(data, verify_rand))
        s1 = arith.add(abc[:, 1], arith.dot(data, arith.mul(verify_rand, verify_rand)))
        s2 = arith.add(abc[:, 2], arith.dot(auth, verify_rand))
        sketch = np.stack([s0, s1, s2], axis=1)
        state = BatchVerifyState(EVALUATE_SKETCH, level, agg_id, big_a, big_b, data, d.errors)
        return VerifyRoundBatch(state, self._encode_rows(arith, sketch, d.errors), new_cache)

    def _verify_rand(
        self, verify_key: bytes, ctx: bytes, nonces: Arr, level: int, count: int
    ) -> Arr:
        rows = nonces.shape[0]
        dst = self.vdaf.domain_separation_tag(USAGE_VERIFY_RAND, ctx)
        binders = np.concatenate(
            [nonces, np.broadcast_to(np.frombuffer(level.to_bytes(2, "big"), np.uint8), (rows, 2))],
            axis=1,
        )
        if level < self.BITS - 1:
            return expand_rows(VecField64, verify_key, dst, binders, count, rows)
        return self._expand_leaf(verify_key, dst, binders, count)

    def _expand_leaf(self, seeds: Arr | bytes, dst: bytes, binders: Arr, count: int) -> Arr:
        """XofTurboShake128.expand_into_vec over Field255 for each row, as
        an object array ``(rows, count)``; a row with a rejected candidate
        (about 2^-251 each) is redone by the scalar sampler."""
        rows = binders.shape[0]
        raw = xof_rows(seeds, dst, binders, 32 * count, rows)
        values = ints255(raw) & MASK255
        for r in np.flatnonzero((values >= P255).any(axis=1)):
            seed = seeds if isinstance(seeds, bytes) else seeds[r].tobytes()
            values[r] = self.vdaf.xof.expand_into_vec(
                Field255, seed, dst, binders[r].tobytes(), count
            )
        return values

    def _encode_rows(self, arith: Arith, values: Arr, errors: Errors) -> list[bytes | None]:
        rows, count = values.shape
        encoded = arith.encode(values)
        width = count * arith.SIZE
        return [
            encoded[r * width : (r + 1) * width] if errors[r] is None else None for r in range(rows)
        ]

    def _decode_rows(
        self, level: int, count: int, encoded: Sequence[bytes | None], what: str, errors: Errors
    ) -> Arr:
        arith = self.walk.arith(level)
        raw = byte_rows(encoded, count * arith.SIZE, what, errors)
        values, ok = arith.decode(raw)
        flag(errors, ~ok.all(axis=1), CodecError(f"{what}: element not reduced"))
        return np.where(ok, values, arith.from_int(0))

    def verifier_shares_to_message_batch(
        self,
        ctx: bytes,
        agg_param: Poplar1AggParam,
        verifier_shares: Sequence[Sequence[bytes | None]],
    ) -> MessageBatch:
        """``Poplar1.verifier_shares_to_message`` for every report: the
        encoded round-1 sketch, or after round 2 ``b""`` for a report the
        sketch accepts and ``VerifyError`` for one it rejects. The round is
        read from the shares' length."""
        if len(verifier_shares) != self.SHARES:
            raise ValueError(f"expected {self.SHARES} lists of verifier shares")
        first, second = verifier_shares
        if len(first) != len(second):
            raise ValueError("the aggregators' verifier shares differ in number")
        level = agg_param.level
        arith = self.walk.arith(level)
        rows = len(first)
        errors: Errors = [
            None if a is not None and b is not None else VerifyError("a verifier share is missing")
            for a, b in zip(first, second, strict=True)
        ]
        lengths = {len(s) for s in (*first, *second) if s is not None}
        count = 3 if 3 * arith.SIZE in lengths else 1
        a = self._decode_rows(level, count, first, "verifier share", errors)
        b = self._decode_rows(level, count, second, "verifier share", errors)
        sketch = arith.add(a, b)
        if count == 3:
            return MessageBatch(self._encode_rows(arith, sketch, errors), errors)
        zero = sketch[:, 0] == arith.from_int(0)
        flag(errors, ~zero, VerifyError("sketch verification failed: the report is not one-hot"))
        return MessageBatch([b"" if errors[r] is None else None for r in range(rows)], errors)

    def verify_next_batch(
        self,
        ctx: bytes,
        state: BatchVerifyState,
        messages: MessageBatch | Sequence[bytes | None],
    ) -> VerifyRoundBatch | Poplar1OutShareBatch:
        """``Poplar1.verify_next`` for every report: after round 1 the second
        sketch shares (a ``VerifyRoundBatch``), after round 2 the output
        shares (a ``Poplar1OutShareBatch``). Given the ``MessageBatch``
        itself (in one process), a report it rejected keeps its error."""
        errors = list(state.errors)
        if isinstance(messages, MessageBatch):
            for r, error in enumerate(messages.errors):
                if errors[r] is None and error is not None:
                    errors[r] = error
            messages = messages.messages
        if len(messages) != len(state):
            raise ValueError("one verifier message per report")
        for r, m in enumerate(messages):
            if errors[r] is None and m is None:
                errors[r] = VerifyError("the report was rejected: no verifier message")
        arith = self.walk.arith(state.level)
        if state.step == EVALUATE_SKETCH:
            sketch = self._decode_rows(state.level, 3, messages, "verifier message", errors)
            s0, s1, s2 = sketch[:, 0], sketch[:, 1], sketch[:, 2]
            share = arith.add(arith.mul(state.a_share, s0), state.b_share)
            if state.agg_id == 1:
                share = arith.add(share, arith.sub(arith.sub(arith.mul(s0, s0), s1), s2))
            revealed = BatchVerifyState(
                REVEAL_SKETCH,
                state.level,
                state.agg_id,
                state.a_share,
                state.b_share,
                state.out_shares,
                errors,
            )
            return VerifyRoundBatch(
                revealed, self._encode_rows(arith, share.reshape(-1, 1), errors)
            )
        for r, m in enumerate(messages):
            if errors[r] is None and m != b"":
                errors[r] = VerifyError("the second verifier message is empty")
        return Poplar1OutShareBatch(state.level, state.out_shares, errors)

    def aggregate_batch(self, out: Poplar1OutShareBatch) -> FieldVec:
        """The aggregate share of the accepted reports' output shares."""
        arith = self.walk.arith(out.level)
        rows = out.out_shares[out.ok]
        if arith is Inner:
            total = VecField64.sum(np.ascontiguousarray(rows.T), axis=-1)
        else:
            total = rows.sum(axis=0) % P255 if len(rows) else arith.zeros(out.out_shares.shape[1:])
        return FieldVec(arith.field, arith.to_ints(np.asarray(total).reshape(-1)))
