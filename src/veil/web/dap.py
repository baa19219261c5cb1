"""The survey page over DAP (docs/DAP.md, "A survey over DAP"): what the
page needs of a DAP task to seal its reports (`page_part`), and the checks
`veil survey serve` makes of a DAP report the page sealed before relaying it
to the leader in an UploadRequest (`check_report`).

A survey with invitations carries each report's token in veil's invitation
extension (veil.dap.invitation): a public extension, which the relay reads
and checks as each aggregator will (its form, the leader key digest against
the leader's share, the token against the report's redemption context and
the question's issuer key), so that a report either aggregator would refuse
for its token is refused here, named, with nothing sent. Where the helper
is another implementation the extension rides in the leader's share
(`Task.invitation_private`), sealed: the relay checks only that share's size,
and the leader checks the token.
"""

from __future__ import annotations

import hmac
from typing import Any

from veil.dap.invitation import (
    INVITATION_DATA_SIZE,
    INVITATION_EXTENSION,
    InvitationExtension,
    dap_redemption_context,
    sealed_key_digest,
)
from veil.dap.messages import Report
from veil.invite.token import TokenError, Verifier
from veil.task import Task, b64e

# A DAP PlaintextInputShare's two length prefixes: its extensions' and its
# payload's (draft-ietf-ppm-dap section 4.4.2).
SHARE_PREFIXES = 2 + 4
# veil's invitation extension encoded (type, data length, data), where the
# leader's share holds it.
LEADER_EXTENSION_BYTES = 2 + 2 + INVITATION_DATA_SIZE


class ReportRefused(ValueError):
    """A DAP report the relay refuses; the message says why."""


def page_part(task: Task) -> dict[str, Any]:
    """What the page needs of a DAP task to seal its reports: the draft, the
    encoded TaskConfiguration every share binds and, for a task with
    invitations, where its invitation extension goes ("public", or "leader":
    in the leader's share); nothing without DAP."""
    if task.dap is None:
        return {}
    configuration = task.dap_configuration().encode(task.dap.dap_version)
    part: dict[str, Any] = {"version": task.dap.version, "configuration": b64e(configuration)}
    if task.issuer_public_key is not None:
        part["invitation"] = "leader" if task.invitation_private else "public"
    return {"dap": part}


def share_overhead(task: Task) -> tuple[int, int]:
    """The bytes a DAP task's sealed leader and helper shares carry beyond
    veil's own ciphertext of the same share: the PlaintextInputShare's
    prefixes and, in the leader's where the task puts it there, the
    invitation extension."""
    leader = LEADER_EXTENSION_BYTES if task.invitation_private else 0
    return SHARE_PREFIXES + leader, SHARE_PREFIXES


def check_report(task: Task, report: Report) -> None:
    """Raises ReportRefused unless `report`'s public extensions are what the
    task takes: none, or for a task with invitations whose extension is
    public, exactly veil's invitation extension, of its size, with the
    leader's key digest and a token valid for this report under the
    question's issuer key."""
    extensions = report.metadata.public_extensions
    if task.issuer_public_key is None or task.invitation_private:
        if extensions:
            raise ReportRefused("the page's reports carry no extension")
        return
    if [e.extension_type for e in extensions] != [INVITATION_EXTENSION]:
        raise ReportRefused(
            "a report of this survey carries one extension, its invitation"
            f" ({INVITATION_EXTENSION:#06x}), and no other"
        )
    try:
        invitation = InvitationExtension.decode(extensions[0].extension_data)
    except TokenError as e:
        raise ReportRefused(str(e)) from None
    leader = report.leader_encrypted_input_share
    helper = report.helper_encrypted_input_share
    if not hmac.compare_digest(
        invitation.leader_key_digest, sealed_key_digest(leader.config_id, leader.enc)
    ):
        raise ReportRefused(
            "the invitation extension's leader key digest is not that of the leader's share"
        )
    meta = report.metadata
    try:
        context = dap_redemption_context(
            task.task_id,
            meta.report_id,
            meta.time * task.time_precision,
            report.public_share,
            invitation.leader_key_digest,
            sealed_key_digest(helper.config_id, helper.enc),
        )
        Verifier(task.issuer_public_key).check(invitation.token, context)
    except TokenError as e:
        raise ReportRefused(f"invalid invitation token: {e}") from None
