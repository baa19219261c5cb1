"""The helper's request hash (veil.aggregator.helper.jobs.request_hash): what a
retried job must match. Its digest is stored with each job, so a new way of
computing it must give the same digest as before."""

from __future__ import annotations

import hashlib

from veil.aggregator.core import VerifyInitItem
from veil.aggregator.helper import jobs as helper_module
from veil.aggregator.helper.jobs import request_hash
from veil.messages import Ciphertext


def items(n: int, start: int = 0) -> list[VerifyInitItem]:
    """Items whose variable fields change length from one to the next."""
    return [
        VerifyInitItem(
            bytes([i % 256]) * 16,
            1_700_000_000 + i,
            bytes([i % 256]) * (i % 3),
            Ciphertext(i * 40 % 256, bytes([(i + 1) % 256]) * 32, b"p" * (7 * i)),
            b"v" * (i + 5),
        )
        for i in range(start, start + n)
    ]


def spelled_out(task_id: bytes, job_id: bytes, its: list[VerifyInitItem]) -> bytes:
    """The definition field by field: each of an item's fields after its
    4-byte big-endian length, time and config id as one 9-byte field."""
    h = hashlib.sha256(task_id + job_id)
    for it in its:
        ct = it.encrypted_input_share
        for field in (
            it.report_id,
            it.time.to_bytes(8, "big") + bytes([ct.config_id]),
            it.public_share,
            ct.enc,
            ct.payload,
            it.leader_verifier_share,
        ):
            h.update(len(field).to_bytes(4, "big") + field)
    return h.digest()


def test_digest_of_a_fixed_request_is_unchanged() -> None:
    # Computed by the hash this one replaced (field by field, before the
    # one pack per item): a job stored before must match its retry after.
    assert (
        request_hash(b"t" * 32, b"j" * 16, items(7)).hex()
        == "3b5124bf346b79b313474827aec9a5cd5b9e7bbbb1e008fe94377ab64708942e"
    )
    assert (
        request_hash(b"t" * 32, b"j" * 16, []).hex()
        == "832a96de509ebc571006cf0f16dbd3fb17ea6bca4c0152124cb40c6d3d53b4bc"
    )


def test_digest_follows_the_definition_for_every_shape() -> None:
    # More shapes than the packers' cache holds: those past it are packed
    # without being kept, and hash alike.
    helper_module._ITEM_PACKERS.clear()
    its = items(helper_module._ITEM_PACKERS_MAX + 20, start=3)
    assert request_hash(b"t" * 32, b"j" * 16, its) == spelled_out(b"t" * 32, b"j" * 16, its)
    assert len(helper_module._ITEM_PACKERS) == helper_module._ITEM_PACKERS_MAX
    # Any field changed changes the digest.
    one = items(1)
    base = request_hash(b"t" * 32, b"j" * 16, one)
    it = one[0]
    ct = it.encrypted_input_share
    for other in (
        VerifyInitItem(b"x" * 16, it.time, it.public_share, ct, it.leader_verifier_share),
        VerifyInitItem(it.report_id, it.time + 1, it.public_share, ct, it.leader_verifier_share),
        VerifyInitItem(
            it.report_id,
            it.time,
            it.public_share,
            Ciphertext(ct.config_id + 1, ct.enc, ct.payload),
            it.leader_verifier_share,
        ),
        VerifyInitItem(it.report_id, it.time, it.public_share, ct, it.leader_verifier_share + b"!"),
    ):
        assert request_hash(b"t" * 32, b"j" * 16, [other]) != base
