"""Sealing DAP's shares (draft sections 4.4.2 and 4.6.7) and what is bound to
the draft's version tag."""

from __future__ import annotations

import pytest

from veil.dap.jobs import CollectionJobReq, Query
from veil.dap.messages import (
    BatchMode,
    Extension,
    InputShareAad,
    Interval,
    PlaintextInputShare,
    ReportMetadata,
    TaskConfiguration,
)
from veil.dap.shares import (
    input_share_aads,
    open_aggregate_share,
    open_input_share,
    seal_aggregate_share,
    seal_input_share,
)
from veil.dap.versions import (
    DEFAULT_VERSION,
    DapVersion,
    ReportError,
    Role,
    aggregate_share_info,
    input_share_info,
    report_error_code,
    vdaf_context,
)
from veil.hpke import HpkeError, generate_keypair

TASK_ID = bytes(range(32))
TASK = TaskConfiguration(
    b"t", b"https://l/", b"https://h/", 60, 10, BatchMode.TIME_INTERVAL, 1, b""
)
META = ReportMetadata(b"r" * 16, 27_000_000)
V18, V19 = DapVersion.DAP_18, DapVersion.DAP_19


def test_strings_bound_to_the_version_tag() -> None:
    assert DEFAULT_VERSION is V19
    assert vdaf_context(V19, TASK_ID) == b"dap-19" + TASK_ID
    assert vdaf_context(V18, TASK_ID) == b"dap-18" + TASK_ID
    assert input_share_info(V19, Role.LEADER) == b"dap-19 input share\x01\x02"
    assert input_share_info(V18, Role.HELPER) == b"dap-18 input share\x01\x03"
    assert aggregate_share_info(V19, Role.HELPER) == b"dap-19 aggregate share\x03\x00"
    assert aggregate_share_info(V18, Role.LEADER) == b"dap-18 aggregate share\x02\x00"
    with pytest.raises(ValueError):
        input_share_info(V19, Role.COLLECTOR)
    with pytest.raises(ValueError):
        aggregate_share_info(V19, Role.CLIENT)


def test_report_error_registries() -> None:
    assert [report_error_code(V18, e) for e in list(ReportError)[:12]] == list(range(12))
    assert report_error_code(V19, ReportError.INVALID_MESSAGE) == 7
    assert report_error_code(V19, ReportError.REPORT_TOO_EARLY) == 8
    assert report_error_code(V19, ReportError.UNKNOWN_VERIFICATION_KEY_ID) == 9
    for gone in (
        ReportError.TASK_EXPIRED,
        ReportError.TASK_NOT_STARTED,
        ReportError.OUTDATED_CONFIG,
    ):
        with pytest.raises(ValueError, match="no code in dap-19"):
            report_error_code(V19, gone)


@pytest.mark.parametrize("version", list(DapVersion))
def test_input_share_round_trip_and_binding(version: DapVersion) -> None:
    kp = generate_keypair(4)
    share = PlaintextInputShare((Extension(3, b"private"),), b"the leader's share")
    ct = seal_input_share(version, kp.config, Role.LEADER, TASK_ID, TASK, META, b"ps", share)
    assert ct.config_id == 4
    opened = open_input_share(version, kp, Role.LEADER, TASK_ID, TASK, META, b"ps", ct)
    assert opened == share
    other_version = V18 if version is V19 else V19
    other_task = TaskConfiguration(
        b"t", b"https://l/", b"https://h/", 60, 11, BatchMode.TIME_INTERVAL, 1, b""
    )
    wrong = [
        (other_version, Role.LEADER, TASK_ID, TASK, META, b"ps"),
        (version, Role.HELPER, TASK_ID, TASK, META, b"ps"),
        (version, Role.LEADER, bytes(32), TASK, META, b"ps"),
        (version, Role.LEADER, TASK_ID, other_task, META, b"ps"),
        (version, Role.LEADER, TASK_ID, TASK, ReportMetadata(b"r" * 16, 27_000_001), b"ps"),
        (version, Role.LEADER, TASK_ID, TASK, META, b"pt"),
    ]
    for v, role, task_id, task, meta, public_share in wrong:
        with pytest.raises(HpkeError):
            open_input_share(v, kp, role, task_id, task, meta, public_share, ct)


def test_aggregate_share_round_trip_and_binding() -> None:
    collector = generate_keypair(1)
    request = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(450000, 60)))
    ct = seal_aggregate_share(V19, collector.config, Role.HELPER, TASK_ID, TASK, request, b"sum")
    assert open_aggregate_share(V19, collector, Role.HELPER, TASK_ID, TASK, request, ct) == b"sum"
    for role, req in [
        (Role.LEADER, request),
        (Role.HELPER, CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(450000, 61)))),
    ]:
        with pytest.raises(HpkeError):
            open_aggregate_share(V19, collector, role, TASK_ID, TASK, req, ct)


@pytest.mark.parametrize("version", list(DapVersion))
def test_a_jobs_associated_data_is_each_reports_input_share_aad(version: DapVersion) -> None:
    reports = [
        (META, b""),
        (ReportMetadata(b"s" * 16, 1, (Extension(9, b"x"),)), b"public share"),
    ]
    assert input_share_aads(version, TASK_ID, TASK, reports) == [
        InputShareAad(TASK_ID, TASK, meta, public).encode(version) for meta, public in reports
    ]
