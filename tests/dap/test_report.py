"""veil's DAP client report (veil.dap.report): what it seals opens at each
aggregator under the task's configuration, and verifies and aggregates
with the VDAF under DAP's context."""

from __future__ import annotations

import secrets

import pytest

from veil.dap.messages import (
    REPORT_ID_SIZE,
    BatchMode,
    Extension,
    Report,
    TaskConfiguration,
    VdafConfig,
)
from veil.dap.report import prepare_report
from veil.dap.shares import open_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.hpke import HpkeError, generate_keypair
from veil.vdaf.spec.prio3 import Prio3Histogram

TASK_ID = secrets.token_bytes(32)
VDAF = Prio3Histogram(2, 5, 2)
CONFIG = TaskConfiguration(
    b"i",
    b"https://l/",
    b"https://h/",
    60,
    2,
    BatchMode.TIME_INTERVAL,
    4,
    VdafConfig("Prio3Histogram", (("length", 5), ("chunk_length", 2))).encode(),
)


@pytest.mark.parametrize("version", list(DapVersion))
def test_reports_open_verify_and_aggregate(version: DapVersion) -> None:
    leader, helper = generate_keypair(1), generate_keypair(2)
    measurements = [0, 4, 4, 2]
    reports = [
        prepare_report(version, TASK_ID, CONFIG, VDAF, m, 1000, leader.config, helper.config)
        for m in measurements
    ]
    ctx = vdaf_context(version, TASK_ID)
    key = secrets.token_bytes(VDAF.VERIFY_KEY_SIZE)
    sums = [VDAF.agg_init(None), VDAF.agg_init(None)]
    for r in reports:
        assert Report.decode(r.encode()) == r
        meta = r.metadata
        assert len(meta.report_id) == REPORT_ID_SIZE and meta.time == 1000
        public = VDAF.decode_public_share(r.public_share)
        steps = []
        for agg_id, (kp, role, ct) in enumerate(
            [
                (leader, Role.LEADER, r.leader_encrypted_input_share),
                (helper, Role.HELPER, r.helper_encrypted_input_share),
            ]
        ):
            plain = open_input_share(version, kp, role, TASK_ID, CONFIG, meta, r.public_share, ct)
            assert plain.private_extensions == ()
            share = VDAF.decode_input_share(agg_id, plain.payload)
            steps.append(VDAF.verify_init(key, ctx, agg_id, None, meta.report_id, public, share))
        message = VDAF.verifier_shares_to_message(ctx, None, [s[1] for s in steps])
        for i in range(2):
            sums[i] = VDAF.agg_update(None, sums[i], VDAF.verify_next(ctx, steps[i][0], message))
    assert VDAF.unshard(None, sums, len(reports)) == [1, 0, 1, 0, 2]


def test_the_report_is_bound_to_its_public_extensions_and_draft() -> None:
    leader, helper = generate_keypair(1), generate_keypair(2)
    r = prepare_report(
        DapVersion.DAP_19,
        TASK_ID,
        CONFIG,
        VDAF,
        3,
        7,
        leader.config,
        helper.config,
        public_extensions=(Extension(9, b"e"),),
    )
    args = (TASK_ID, CONFIG, r.metadata, r.public_share, r.leader_encrypted_input_share)
    open_input_share(DapVersion.DAP_19, leader, Role.LEADER, *args)
    with pytest.raises(HpkeError):
        open_input_share(DapVersion.DAP_18, leader, Role.LEADER, *args)
    stripped = (TASK_ID, CONFIG, r.metadata.__class__(r.metadata.report_id, 7), *args[3:])
    with pytest.raises(HpkeError):
        open_input_share(DapVersion.DAP_19, leader, Role.LEADER, *stripped)
