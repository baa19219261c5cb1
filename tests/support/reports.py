"""Reports built by hand for tests that need one a client would not send."""

from __future__ import annotations

import secrets
from typing import Any

from veil.client import seal_report
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.messages import vdaf_ctx
from veil.vdaf.spec.circuits import Valid
from veil.vdaf.spec.prio3 import prio3_with_circuit


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


class _Sends(Valid[Any, Any]):
    """A client's circuit that encodes any measurement as the one it chose."""

    def __init__(self, honest: Valid[Any, Any], encoded: list[int]) -> None:
        self.honest = honest
        self.encoded = encoded
        self.field = honest.field
        self.MEAS_LEN = honest.MEAS_LEN
        self.JOINT_RAND_LEN = honest.JOINT_RAND_LEN
        self.OUTPUT_LEN = honest.OUTPUT_LEN
        self.EVAL_OUTPUT_LEN = honest.EVAL_OUTPUT_LEN
        self.GADGETS = honest.GADGETS
        self.GADGET_CALLS = honest.GADGET_CALLS

    def encode(self, measurement: Any) -> list[int]:
        return list(self.encoded)

    def eval(self, meas: Any, joint_rand: Any, num_shares: int, gadgets: Any) -> list[int]:
        return self.honest.eval(meas, joint_rand, num_shares, gadgets)

    def truncate(self, meas: Any) -> list[int]:
        return self.honest.truncate(meas)

    def decode(self, output: Any, num_measurements: int) -> Any:
        return self.honest.decode(output, num_measurements)


def encoded_report(client: Any, encoded: list[int], t: int) -> Any:
    """A report of a client that proves `encoded` (field elements) as its encoded
    measurement, whatever its type's encoder allows; correctly sealed."""
    honest = client.vdaf
    liar = prio3_with_circuit(honest.ID, honest.SHARES, _Sends(honest.flp.valid, encoded))
    report_id = secrets.token_bytes(16)
    ctx = vdaf_ctx(client.task.task_id)
    public_share, shares = liar.shard(ctx, None, report_id, secrets.token_bytes(liar.RAND_SIZE))
    return seal_report(
        client.task.task_id,
        report_id,
        t,
        liar.encode_public_share(public_share),
        liar.encode_input_share(shares[0]),
        liar.encode_input_share(shares[1]),
        client.hpke_config(ROLE_LEADER),
        client.hpke_config(ROLE_HELPER),
    )
