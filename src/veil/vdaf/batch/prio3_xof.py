"""The randomness Prio3 derives through its XOF (draft-irtf-cfrg-vdaf-18,
Section 7.2), one row per report: the helpers' measurement and proof
shares expanded from their seeds, the joint randomness (parts, seed,
values), and the prover's and verifier's randomness. Shared by the shard
side (``veil.vdaf.batch.prio3_shard``) and the verify side
(``veil.vdaf.batch.prio3``) of the batched engine; XofTurboShake128 only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from veil.vdaf.batch.field import Arr, VecField
from veil.vdaf.batch.xof import SEED_SIZE, expand_rows, xof_rows
from veil.vdaf.spec.prio3 import (
    USAGE_JOINT_RAND_PART,
    USAGE_JOINT_RAND_SEED,
    USAGE_JOINT_RANDOMNESS,
    USAGE_MEAS_SHARE,
    USAGE_PROOF_SHARE,
    USAGE_PROVE_RANDOMNESS,
    USAGE_QUERY_RANDOMNESS,
    Prio3,
)


class Prio3Randomness:
    """The XOF derivations of one ``Prio3`` instance over rows of seeds."""

    def __init__(self, vdaf: Prio3[Any, Any], vf: type[VecField]) -> None:
        self.vdaf = vdaf
        self.vf = vf
        self.flp = vdaf.flp
        self.PROOFS = vdaf.PROOFS

    def dst(self, usage: int, ctx: bytes) -> bytes:
        return self.vdaf.domain_separation_tag(usage, ctx)

    def meas_share(self, ctx: bytes, agg_id: int, seeds: Arr, rows: int) -> Arr:
        return expand_rows(
            self.vf,
            seeds,
            self.dst(USAGE_MEAS_SHARE, ctx),
            bytes([agg_id]),
            self.flp.MEAS_LEN,
            rows,
        )

    def proofs_share(self, ctx: bytes, agg_id: int, seeds: Arr, rows: int) -> Arr:
        return expand_rows(
            self.vf,
            seeds,
            self.dst(USAGE_PROOF_SHARE, ctx),
            bytes([self.PROOFS, agg_id]),
            self.flp.PROOF_LEN * self.PROOFS,
            rows,
        )

    def joint_rand_part(
        self,
        ctx: bytes,
        agg_id: int,
        blinds: Arr,
        meas_share: Arr,
        nonces: Arr,
        encoded: Arr | None = None,
    ) -> Arr:
        """Each row's joint randomness part. `encoded`, if given, is the
        measurement share's encoding as received (the leader's, which it
        decoded): not encoded again. Rows whose elements were not reduced
        differ from it, and are rejected whatever their part."""
        rows = nonces.shape[0]
        binders = (
            bytes([agg_id]),
            nonces,
            self.vf.encode(meas_share) if encoded is None else encoded,
        )
        return xof_rows(blinds, self.dst(USAGE_JOINT_RAND_PART, ctx), binders, SEED_SIZE, rows)

    def joint_rand_seed(self, ctx: bytes, parts: Arr) -> Arr:
        rows = parts.shape[0]
        return xof_rows(
            bytes(SEED_SIZE), self.dst(USAGE_JOINT_RAND_SEED, ctx), parts, SEED_SIZE, rows
        )

    def joint_rands(self, ctx: bytes, seeds: Arr) -> Arr:
        return expand_rows(
            self.vf,
            seeds,
            self.dst(USAGE_JOINT_RANDOMNESS, ctx),
            bytes([self.PROOFS]),
            self.flp.JOINT_RAND_LEN * self.PROOFS,
            seeds.shape[0],
        )

    def prove_rands(self, ctx: bytes, seeds: Arr, rows: int) -> Arr:
        return expand_rows(
            self.vf,
            seeds,
            self.dst(USAGE_PROVE_RANDOMNESS, ctx),
            bytes([self.PROOFS]),
            self.flp.PROVE_RAND_LEN * self.PROOFS,
            rows,
        )

    def query_rands(self, verify_key: bytes, ctx: bytes, nonces: Arr) -> Arr:
        rows = nonces.shape[0]
        return expand_rows(
            self.vf,
            verify_key,
            self.dst(USAGE_QUERY_RANDOMNESS, ctx),
            np.concatenate([np.full((rows, 1), self.PROOFS, dtype=np.uint8), nonces], axis=1),
            self.flp.QUERY_RAND_LEN * self.PROOFS,
            rows,
        )
