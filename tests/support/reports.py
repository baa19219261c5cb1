"""Reports built by hand for tests that need one a client would not send."""

from __future__ import annotations

import secrets
from typing import Any

from veil.client import seal_report
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.messages import vdaf_ctx


def forged_report(client: Any, value: int, t: int) -> Any:
    """A report whose leader input share was changed after sharding, correctly sealed."""
    vdaf = client.vdaf
    report_id = secrets.token_bytes(16)
    ctx = vdaf_ctx(client.task.task_id)
    public_share, shares = vdaf.shard(ctx, value, report_id, secrets.token_bytes(vdaf.RAND_SIZE))
    ps = vdaf.encode_public_share(public_share)
    leader = bytearray(vdaf.encode_input_share(shares[0]))
    leader[0] ^= 1  # first measurement-share element, still a valid field element
    return seal_report(
        client.task.task_id,
        report_id,
        t,
        ps,
        bytes(leader),
        vdaf.encode_input_share(shares[1]),
        client.hpke_config(ROLE_LEADER),
        client.hpke_config(ROLE_HELPER),
    )
