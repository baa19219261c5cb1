"""A DAP client's report (draft-ietf-ppm-dap section 4.4.2, "Client
Behavior"): the measurement sharded under the context ``tag || task_id``
with the report id as nonce, each input share wrapped in a
PlaintextInputShare and sealed to its aggregator with the draft's `info`
and the report's InputShareAad. One report at a time, over the scalar Prio3
of `veil.vdaf.spec`; randomness comes in as arguments (`rand`,
`report_id`) or from `secrets` when not given.
"""

from __future__ import annotations

import secrets
from typing import Any

from veil.dap.messages import (
    REPORT_ID_SIZE,
    Extension,
    PlaintextInputShare,
    Report,
    ReportMetadata,
    TaskConfiguration,
)
from veil.dap.shares import seal_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.hpke import HpkeConfig
from veil.vdaf.spec.prio3 import Prio3


def prepare_report(
    version: DapVersion,
    task_id: bytes,
    task: TaskConfiguration,
    vdaf: Prio3[Any, Any],
    measurement: Any,
    time: int,
    leader: HpkeConfig,
    helper: HpkeConfig,
    *,
    report_id: bytes | None = None,
    rand: bytes | None = None,
    public_extensions: tuple[Extension, ...] = (),
    ephemerals: tuple[bytes, bytes] | None = None,
    leader_private_extensions: tuple[Extension, ...] = (),
) -> Report:
    """The Report of `measurement` at `time` (in the task's time precision,
    as DAP counts it), sealed to the `leader` and `helper` configs;
    `ephemerals`, the leader's and the helper's HPKE ephemeral keys
    (`veil.hpke.new_ephemeral`) where the caller needs their encapsulated
    keys first (an invitation token commits to them: veil.dap.invitation);
    `leader_private_extensions` in the leader's PlaintextInputShare."""
    report_id = secrets.token_bytes(REPORT_ID_SIZE) if report_id is None else report_id
    rand = secrets.token_bytes(vdaf.RAND_SIZE) if rand is None else rand
    public_share, input_shares = vdaf.shard(
        vdaf_context(version, task_id), measurement, report_id, rand
    )
    encoded_public = vdaf.encode_public_share(public_share)
    metadata = ReportMetadata(report_id, time, public_extensions)
    sealed = [
        seal_input_share(
            version,
            config,
            role,
            task_id,
            task,
            metadata,
            encoded_public,
            PlaintextInputShare(private, vdaf.encode_input_share(share)),
            ephemeral,
        )
        for config, role, share, ephemeral, private in zip(
            (leader, helper),
            (Role.LEADER, Role.HELPER),
            input_shares,
            ephemerals or (None, None),
            (leader_private_extensions, ()),
            strict=True,
        )
    ]
    return Report(metadata, encoded_public, sealed[0], sealed[1])
