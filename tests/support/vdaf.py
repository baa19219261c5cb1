"""VDAF helpers more than one test module uses: a Prio3 round trip in memory,
a Poplar1 client that cheats at one level, the official Poplar1 vectors
through the batched path (run by the vector tests and again with the AES
fallback forced), and the encodings a dishonest Prio3L1BoundSum client
could send (refused by the spec circuit and by both paths' aggregators)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from veil.vdaf import Field128, Prio3, VerifyError
from veil.vdaf.batch.poplar1 import BatchPoplar1, Poplar1OutShareBatch, VerifyRoundBatch
from veil.vdaf.spec.circuits import encode_range_checked_int
from veil.vdaf.spec.poplar1 import Poplar1
from veil.vdaf.spec.xof import XofTurboShake128

_CTX = b"veil tests"


def prio3_round_trip(vdaf: Prio3[Any, Any], measurements: list[Any]) -> Any:
    """Shard, verify and aggregate in memory, through the byte encodings."""
    verify_key = secrets.token_bytes(vdaf.VERIFY_KEY_SIZE)
    agg_shares = [vdaf.agg_init(None) for _ in range(vdaf.SHARES)]
    for m in measurements:
        nonce = secrets.token_bytes(vdaf.NONCE_SIZE)
        public_share, input_shares = vdaf.shard(_CTX, m, nonce, secrets.token_bytes(vdaf.RAND_SIZE))
        public_share = vdaf.decode_public_share(vdaf.encode_public_share(public_share))
        states, shares = [], []
        for j, s in enumerate(input_shares):
            s = vdaf.decode_input_share(j, vdaf.encode_input_share(s))
            state, share = vdaf.verify_init(verify_key, _CTX, j, None, nonce, public_share, s)
            states.append(state)
            shares.append(vdaf.decode_verifier_share(state, vdaf.encode_verifier_share(share)))
        message = vdaf.verifier_shares_to_message(_CTX, None, shares)
        for j, state in enumerate(states):
            msg = vdaf.decode_verifier_message(state, vdaf.encode_verifier_message(message))
            out = vdaf.verify_next(_CTX, state, msg)
            out = vdaf.decode_out_share(None, vdaf.encode_out_share(out))
            agg_shares[j] = vdaf.agg_update(None, agg_shares[j], out)
    decoded = [vdaf.decode_agg_share(None, vdaf.encode_agg_share(a)) for a in agg_shares]
    return vdaf.unshard(None, decoded, len(measurements))


class CheatingClient(Poplar1):
    """Programs ``count`` instead of 1 along its path at one level (the
    authenticator and the correlated randomness stay honest): a string
    whose counts at that level are not one-hot."""

    def __init__(self, bits: int, level: int, count: int) -> None:
        super().__init__(bits)
        self.level, self.count = level, count

    def programmed_values(self, xof: XofTurboShake128) -> tuple[list[list[int]], list[int]]:
        beta_inner, beta_leaf = super().programmed_values(xof)
        values = beta_inner[self.level] if self.level < self.BITS - 1 else beta_leaf
        values[0] = self.count % self.idpf.current_field(self.level).MODULUS
        return beta_inner, beta_leaf


def poplar1_vectors_through_the_batch(vdaf_vectors: Path) -> None:
    """Every official Poplar1 vector through `BatchPoplar1`, byte for byte:
    shares, both rounds' verifier shares and messages, aggregate shares (the
    negative vector fails its second message)."""
    for path in sorted(vdaf_vectors.glob("Poplar1*.json")):
        tv = json.loads(path.read_text())
        vdaf = Poplar1(tv["bits"])
        batch = BatchPoplar1(vdaf)
        agg_param = vdaf.decode_agg_param(bytes.fromhex(tv["agg_param"]))
        report = tv["reports"][0]
        nonces = [bytes.fromhex(report["nonce"])]
        if report["measurement"] is not None:
            sharded = batch.shard_batch(
                bytes.fromhex(tv["ctx"]),
                [tuple(report["measurement"])],
                nonces,
                [bytes.fromhex(report["rand"])],
            )
            assert sharded.public_shares[0].hex() == report["public_share"]
            assert [s[0].hex() for s in sharded.input_shares] == report["input_shares"]
        key, ctx = bytes.fromhex(tv["verify_key"]), bytes.fromhex(tv["ctx"])
        publics = [bytes.fromhex(report["public_share"])]
        inits = [
            batch.verify_init_batch(
                key, ctx, j, agg_param, nonces, publics, [bytes.fromhex(report["input_shares"][j])]
            )
            for j in (0, 1)
        ]
        assert [i.verifier_shares[0].hex() for i in inits] == report["verifier_shares"][0]
        msgs = batch.verifier_shares_to_message_batch(
            ctx, agg_param, [i.verifier_shares for i in inits]
        )
        assert msgs.messages[0].hex() == report["verifier_messages"][0]
        rounds = [batch.verify_next_batch(ctx, i.state, msgs.messages) for i in inits]
        shares = [r.verifier_shares for r in rounds if isinstance(r, VerifyRoundBatch)]
        assert [s[0].hex() for s in shares] == report["verifier_shares"][1]
        finals = batch.verifier_shares_to_message_batch(ctx, agg_param, shares)
        if "_bad_" in path.name:
            assert isinstance(finals.errors[0], VerifyError), path.name
            continue
        assert finals.ok.all()
        outs = [
            batch.verify_next_batch(ctx, r.state, finals.messages)
            for r in rounds
            if isinstance(r, VerifyRoundBatch)
        ]
        aggs = [batch.aggregate_batch(o) for o in outs if isinstance(o, Poplar1OutShareBatch)]
        assert [vdaf.encode_agg_share(a).hex() for a in aggs] == tv["agg_shares"]


def _bits(values: Sequence[int], max_value: int) -> list[int]:
    return [b for v in values for b in encode_range_checked_int(Field128, v, max_value)]


_P = Field128.MODULUS
# What a dishonest client could send for length 3 and max_value 6 (3 bits a
# value, weights 1, 2, 3): the entries' bits then the claimed sum's.
L1_BOUND_SUM_LIES = {
    "sum over the bound, claimed within it": _bits([6, 6, 0], 6) + _bits([6], 6),
    "claimed sum below the entries'": _bits([1, 2, 0], 6) + _bits([2], 6),
    "claimed sum above the entries'": _bits([1, 2, 0], 6) + _bits([4], 6),
    "a negative entry (a bit p - 1) offsetting another": (
        [_P - 1, 0, 0, *_bits([6, 0], 6), *_bits([5], 6)]
    ),
    "an entry's bit 2 (the entry 2, sum as claimed)": [2, 0, 0, *_bits([0, 0], 6), *_bits([2], 6)],
    "claimed sum with a bit 2": [*_bits([2, 0, 0], 6), 2, 0, 0],
}
