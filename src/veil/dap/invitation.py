"""An invitation token in a DAP report (docs/DAP.md, "Invitations over
DAP"): veil's report extension, public to both aggregators, carrying the
report's token (veil.invite.token) and what the helper needs of the
leader's sealed share to rebuild the token's challenge.

    struct {
        uint8 token[TOKEN_SIZE];          // RFC 9578 type 0x0002
        uint8 leader_key_digest[32];      // SHA-256(config_id || enc) of
                                          // the leader's HpkeCiphertext
    } InvitationExtension;                // extension_type 0xFF56

A public extension is part of the InputShareAad both input shares are
sealed with, so the token cannot commit to the sealed shares' bytes as it
does over gRPC (it would be inside what it commits to). It commits instead
to each share's HPKE config id and encapsulated key, which the client draws
before it seals (`veil.hpke.seal_with_aad`'s `ephemeral`): an encapsulated
key fixes the AEAD key under the aggregator's key, so no party but the
client and that aggregator can seal another share under it, and a share
sealed under it with other associated data (another token, another
report) does not open. The challenge's redemption context is veil's own
(`redemption_context` with DAP_CONTEXT_LABEL): the task, the report's id
and time (seconds), the public share's digest and the two key digests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from veil.dap.messages import Extension
from veil.invite.token import DIGEST_SIZE, TOKEN_SIZE, TokenError, redemption_context

# A codepoint of the Report Extension Identifiers registry's top, which the
# draft assigns from the bottom (it sets no range aside for private use:
# docs/DAP.md says which and why).
INVITATION_EXTENSION = 0xFF56
DAP_CONTEXT_LABEL = b"veil-invitation-dap-report-v1"
# The bytes of an InvitationExtension's data.
INVITATION_DATA_SIZE = TOKEN_SIZE + DIGEST_SIZE


@dataclass(frozen=True)
class InvitationExtension:
    """The data of an INVITATION_EXTENSION: the report's token and the
    digest of the leader's config id and encapsulated key."""

    token: bytes
    leader_key_digest: bytes

    def encode(self) -> bytes:
        return self.token + self.leader_key_digest

    def extension(self) -> Extension:
        return Extension(INVITATION_EXTENSION, self.encode())

    @staticmethod
    def decode(data: bytes) -> InvitationExtension:
        """Raises TokenError unless `data` has exactly the extension's size
        (the token's own fields are read by its check)."""
        if len(data) != INVITATION_DATA_SIZE:
            raise TokenError(
                f"the invitation extension is {INVITATION_DATA_SIZE} bytes, not {len(data)}"
            )
        return InvitationExtension(data[:TOKEN_SIZE], data[TOKEN_SIZE:])


def sealed_key_digest(config_id: int, enc: bytes) -> bytes:
    """SHA-256 of a sealed share's HPKE config id (one byte) and encapsulated key."""
    return hashlib.sha256(bytes([config_id]) + enc).digest()


def dap_redemption_context(
    task_id: bytes,
    report_id: bytes,
    time: int,
    public_share: bytes,
    leader_key_digest: bytes,
    helper_key_digest: bytes,
) -> bytes:
    """The redemption context of a DAP report's token: `time` in seconds,
    the key digests (`sealed_key_digest`) of its two sealed shares."""
    return redemption_context(
        task_id,
        report_id,
        time,
        public_share,
        leader_key_digest,
        helper_key_digest,
        label=DAP_CONTEXT_LABEL,
    )
