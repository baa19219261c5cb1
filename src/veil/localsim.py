"""In-process Prio3 runs: every aggregator of a report simulated in one
process, through the same byte encodings the servers exchange. Used by
``veil demo --local`` and by tests; randomness from ``secrets``."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from veil.vdaf import Prio3, VerifyError


@dataclass(frozen=True)
class LocalRun:
    result: Any
    accepted: int
    rejected: int


def run_local(vdaf: Prio3[Any, Any], measurements: Iterable[Any], ctx: bytes) -> LocalRun:
    """Shard each measurement, verify it with all ``SHARES`` aggregators,
    aggregate the accepted ones and unshard."""
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    agg_shares = [vdaf.agg_init(None) for _ in range(vdaf.SHARES)]
    accepted = rejected = 0
    for measurement in measurements:
        nonce = secrets.token_bytes(vdaf.NONCE_SIZE)
        public_share, input_shares = vdaf.shard(
            ctx, measurement, nonce, secrets.token_bytes(vdaf.RAND_SIZE)
        )
        public = vdaf.encode_public_share(public_share)
        states = []
        verifier_shares = []
        for agg_id, share in enumerate(input_shares):
            state, verifier_share = vdaf.verify_init(
                verify_key,
                ctx,
                agg_id,
                None,
                nonce,
                vdaf.decode_public_share(public),
                vdaf.decode_input_share(agg_id, vdaf.encode_input_share(share)),
            )
            states.append(state)
            verifier_shares.append(verifier_share)
        try:
            message = vdaf.verifier_shares_to_message(ctx, None, verifier_shares)
            outs = [vdaf.verify_next(ctx, state, message) for state in states]
        except VerifyError:
            rejected += 1
            continue
        accepted += 1
        agg_shares = [
            vdaf.agg_update(None, agg, out) for agg, out in zip(agg_shares, outs, strict=True)
        ]
    result = vdaf.unshard(None, agg_shares, accepted) if accepted else None
    return LocalRun(result, accepted, rejected)
