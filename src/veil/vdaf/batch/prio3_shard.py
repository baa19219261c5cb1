"""Prio3's sharding (draft-irtf-cfrg-vdaf-18, Section 7.2.1) over many
reports at once: the client side of ``veil.vdaf.batch.prio3.BatchPrio3``,
which delegates ``shard_batch`` here. Measurements are encoded and proved
a sub-batch at a time; the helpers' shares are their seeds, the leader's
is the measurement and proofs minus the helpers' expanded shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol

import numpy as np

from veil.vdaf.batch.field import VecField
from veil.vdaf.batch.flp import BatchFlp
from veil.vdaf.batch.prio3_xof import Prio3Randomness
from veil.vdaf.batch.xof import SEED_SIZE
from veil.vdaf.spec.circuits import AggResult, Measurement
from veil.vdaf.spec.prio3 import Prio3


@dataclass
class ShardBatch:
    """Sharded reports: ``public_shares[i]`` and ``input_shares[j][i]`` are
    report i's encoded public share and aggregator j's encoded input share."""

    public_shares: list[bytes]
    input_shares: list[list[bytes]]


class _Engine(Protocol):
    """What the sharder reads of its ``BatchPrio3`` (which imports this
    module, so it is named by shape here, not imported)."""

    vdaf: Prio3[Any, Any]
    flp: BatchFlp
    vf: type[VecField]
    rand: Prio3Randomness
    SHARES: int
    PROOFS: int
    PROVE_RAND_LEN: int
    JOINT_RAND_LEN: int
    _joint: bool
    shard_chunk_elements: int

    def _chunks(self, rows: int, elements: int) -> list[slice]: ...

    def input_share_size(self, agg_id: int) -> int: ...


class Prio3Sharder(Generic[Measurement, AggResult]):
    """``shard_batch`` of one ``BatchPrio3`` (its sizes, circuit and
    sub-batches), with the XOF derivations of ``engine.rand``."""

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine
        self.rand = engine.rand

    def shard_batch(
        self,
        ctx: bytes,
        measurements: Sequence[Measurement],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        """``Prio3.shard`` for every report. Raises ``ValueError`` (naming
        the report) on a bad measurement, nonce or ``rand`` size."""
        e = self.engine
        rows = len(measurements)
        if len(nonces) != rows or len(rands) != rows:
            raise ValueError("measurements, nonces and rands must have the same length")
        for i, (n, r) in enumerate(zip(nonces, rands, strict=True)):
            if len(n) != e.vdaf.NONCE_SIZE:
                raise ValueError(f"report {i}: nonce must be {e.vdaf.NONCE_SIZE} bytes")
            if len(r) != e.vdaf.RAND_SIZE:
                raise ValueError(f"report {i}: rand must be {e.vdaf.RAND_SIZE} bytes")
        result = ShardBatch([], [[] for _ in range(e.SHARES)])
        for s in e._chunks(rows, e.shard_chunk_elements):
            part = self._shard_chunk(ctx, measurements[s], nonces[s], rands[s])
            result.public_shares += part.public_shares
            for mine, theirs in zip(result.input_shares, part.input_shares, strict=True):
                mine += theirs
        return result

    def _shard_chunk(
        self,
        ctx: bytes,
        measurements: Sequence[Measurement],
        nonces: Sequence[bytes],
        rands: Sequence[bytes],
    ) -> ShardBatch:
        e = self.engine
        rows = len(measurements)
        vf = e.vf
        meas = e.flp.circuit.encode(measurements)
        nonce_rows = np.frombuffer(b"".join(nonces), dtype=np.uint8).reshape(rows, -1)
        seeds = np.frombuffer(b"".join(rands), dtype=np.uint8).reshape(rows, -1, SEED_SIZE)
        helpers = e.SHARES - 1
        if e._joint:
            helper_seeds = [seeds[:, 2 * j] for j in range(helpers)]
            helper_blinds = [seeds[:, 2 * j + 1] for j in range(helpers)]
            leader_blind = seeds[:, 2 * helpers]
            prove_seed = seeds[:, 2 * helpers + 1]
        else:
            helper_seeds = [seeds[:, j] for j in range(helpers)]
            prove_seed = seeds[:, helpers]

        leader_meas = meas
        parts = []
        for j, seed in enumerate(helper_seeds, start=1):
            share = self.rand.meas_share(ctx, j, seed, rows)
            leader_meas = vf.sub(leader_meas, share)
            if e._joint:
                parts.append(
                    self.rand.joint_rand_part(ctx, j, helper_blinds[j - 1], share, nonce_rows)
                )
        joint_rands = None
        if e._joint:
            parts.insert(
                0, self.rand.joint_rand_part(ctx, 0, leader_blind, leader_meas, nonce_rows)
            )
            public = np.concatenate(parts, axis=1)
            joint_rands = self.rand.joint_rands(ctx, self.rand.joint_rand_seed(ctx, public))
        prove_rands = self.rand.prove_rands(ctx, prove_seed, rows)
        proofs = []
        for i in range(e.PROOFS):
            prove_rand = prove_rands[..., i * e.PROVE_RAND_LEN : (i + 1) * e.PROVE_RAND_LEN]
            joint_rand = (
                joint_rands[..., i * e.JOINT_RAND_LEN : (i + 1) * e.JOINT_RAND_LEN]
                if joint_rands is not None
                else vf.zeros((rows, 0))
            )
            proofs.append(e.flp.prove(meas, prove_rand, joint_rand))
        leader_proofs = vf.concat(proofs)
        for j, seed in enumerate(helper_seeds, start=1):
            leader_proofs = vf.sub(leader_proofs, self.rand.proofs_share(ctx, j, seed, rows))

        leader = [vf.encode(leader_meas), vf.encode(leader_proofs)]
        if e._joint:
            leader.append(leader_blind)
        leader_bytes = np.concatenate(leader, axis=1).tobytes()
        leader_size = e.input_share_size(0)
        input_shares = [
            [leader_bytes[i * leader_size : (i + 1) * leader_size] for i in range(rows)]
        ]
        for j in range(helpers):
            cols = [helper_seeds[j]] + ([helper_blinds[j]] if e._joint else [])
            helper_bytes = np.concatenate(cols, axis=1).tobytes()
            size = e.input_share_size(j + 1)
            input_shares.append([helper_bytes[i * size : (i + 1) * size] for i in range(rows)])
        if e._joint:
            public_bytes = public.tobytes()
            size = SEED_SIZE * e.SHARES
            public_shares = [public_bytes[i * size : (i + 1) * size] for i in range(rows)]
        else:
            public_shares = [b""] * rows
        return ShardBatch(public_shares, input_shares)
