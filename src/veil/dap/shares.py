"""Sealing and opening DAP's input and aggregate shares: HPKE base mode
with the draft's `info` and its associated data (InputShareAad,
AggregateShareAad), through veil's HPKE (`veil.hpke.seal_with_aad`,
`veil.hpke.open_`).

Every share binds the task's id and its whole TaskConfiguration, so an
aggregator or collector configured with other task bytes (another
endpoint's spelling, another min_batch_size) fails to open it rather than
aggregating under parameters the client did not agree to.
"""

from __future__ import annotations

from collections.abc import Sequence

from veil.dap.codec import put_fixed, put_opaque
from veil.dap.jobs import AggregateShareAad, CollectionJobReq
from veil.dap.messages import (
    TASK_ID_SIZE,
    InputShareAad,
    PlaintextInputShare,
    ReportMetadata,
    TaskConfiguration,
)
from veil.dap.versions import DapVersion, Role, aggregate_share_info, input_share_info
from veil.hpke import Ciphertext, HpkeConfig, HpkeKeypair, open_, seal_with_aad


def seal_input_share(
    version: DapVersion,
    config: HpkeConfig,
    server_role: Role,
    task_id: bytes,
    task: TaskConfiguration,
    metadata: ReportMetadata,
    public_share: bytes,
    share: PlaintextInputShare,
    ephemeral: bytes | None = None,
) -> Ciphertext:
    """A client's SealBase of one aggregator's PlaintextInputShare (section
    4.4.2); `ephemeral` as `veil.hpke.seal_with_aad`'s."""
    aad = InputShareAad(task_id, task, metadata, public_share).encode(version)
    info = input_share_info(version, server_role)
    return seal_with_aad(config, info, aad, share.encode(), ephemeral)


def open_input_share(
    version: DapVersion,
    keypair: HpkeKeypair,
    server_role: Role,
    task_id: bytes,
    task: TaskConfiguration,
    metadata: ReportMetadata,
    public_share: bytes,
    ciphertext: Ciphertext,
) -> PlaintextInputShare:
    """An aggregator's OpenBase of its input share (section 4.5.3.3), decoded.
    Raises veil.hpke.HpkeError (hpke_decrypt_error) or DecodeError
    (invalid_message)."""
    aad = InputShareAad(task_id, task, metadata, public_share).encode(version)
    plaintext = open_(keypair, ciphertext, input_share_info(version, server_role), aad)
    return PlaintextInputShare.decode(plaintext)


def input_share_aads(
    version: DapVersion,
    task_id: bytes,
    task: TaskConfiguration,
    reports: Sequence[tuple[ReportMetadata, bytes]],
) -> list[bytes]:
    """The encoded InputShareAad of each (metadata, public share) of one
    task: the same bytes as `InputShareAad.encode`, the task's part encoded
    once for them all (an aggregation job opens thousands)."""
    head = put_fixed(task_id, TASK_ID_SIZE, "task_id") + task.encode(version)
    return [
        head + meta.encode() + put_opaque(public, 4, "public_share") for meta, public in reports
    ]


def seal_aggregate_share(
    version: DapVersion,
    collector: HpkeConfig,
    server_role: Role,
    task_id: bytes,
    task: TaskConfiguration,
    request: CollectionJobReq,
    agg_share: bytes,
) -> Ciphertext:
    """An aggregator's SealBase of its aggregate share to the collector
    (section 4.6.7)."""
    aad = AggregateShareAad(task_id, task, request).encode(version)
    return seal_with_aad(collector, aggregate_share_info(version, server_role), aad, agg_share)


def open_aggregate_share(
    version: DapVersion,
    keypair: HpkeKeypair,
    server_role: Role,
    task_id: bytes,
    task: TaskConfiguration,
    request: CollectionJobReq,
    ciphertext: Ciphertext,
) -> bytes:
    """The collector's OpenBase of one aggregator's share."""
    aad = AggregateShareAad(task_id, task, request).encode(version)
    return open_(keypair, ciphertext, aggregate_share_info(version, server_role), aad)
