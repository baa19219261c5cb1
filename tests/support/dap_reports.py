"""What an honest pair of aggregators makes of DAP reports, in memory: each
report's shares opened with both aggregators' keys under the task's DAP
version and configuration, verified and aggregated, and the aggregate
unsharded. Used to check what a DAP client (Python or JavaScript) sealed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from veil.dap.messages import Report
from veil.dap.shares import open_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.hpke import HpkeKeypair
from veil.task import Task


def dap_aggregate(
    task: Task,
    version: DapVersion,
    leader: HpkeKeypair,
    helper: HpkeKeypair,
    reports: Sequence[Report],
) -> Any:
    """The unsharded aggregate of `reports`; raises veil.hpke.HpkeError where
    a share does not open, VerifyError where a report does not verify."""
    vdaf = task.vdaf.instantiate()
    ctx = vdaf_context(version, task.task_id)
    verify_key = bytes(vdaf.VERIFY_KEY_SIZE)
    agg = [vdaf.agg_init(None) for _ in range(2)]
    for report in reports:
        public = vdaf.decode_public_share(report.public_share)
        nonce = report.metadata.report_id
        states, shares = [], []
        for j, (keypair, role, ct) in enumerate(
            (
                (leader, Role.LEADER, report.leader_encrypted_input_share),
                (helper, Role.HELPER, report.helper_encrypted_input_share),
            )
        ):
            plain = open_input_share(
                version, keypair, role, task.task_id, task.dap_configuration(),
                report.metadata, report.public_share, ct,
            )  # fmt: skip
            share = vdaf.decode_input_share(j, plain.payload)
            state, verifier = vdaf.verify_init(verify_key, ctx, j, None, nonce, public, share)
            states.append(state)
            shares.append(verifier)
        message = vdaf.verifier_shares_to_message(ctx, None, shares)
        for j, state in enumerate(states):
            agg[j] = vdaf.agg_update(None, agg[j], vdaf.verify_next(ctx, state, message))
    return vdaf.unshard(None, agg, len(reports))
