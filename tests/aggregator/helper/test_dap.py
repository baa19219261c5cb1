"""The helper's DAP routes (veil.aggregator.run.dap_helper_http over
veil.aggregator.helper.dap), called in process over a real helper and its
SQLite store, with the leader's side written from the draft
(tests.support.dap_helper): a job verified and committed, its answer served
again, the aggregate share released once and opened by the collector, and
hostile requests answered with DAP's problem documents, nothing stored and
the next honest request served."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.dap_helper import CONTINUE, INIT, MAX_BODY, SHARE_REQ, TIME, DapHelper, problem
from veil.aggregator.errors import InvalidMessage
from veil.dap.jobs import (
    AggregateShare,
    AggregationJobContinueReq,
    AggregationJobInitReq,
    AggregationJobResp,
    CollectionJobReq,
    Query,
    VerifyContinue,
    VerifyResp,
    VerifyRespType,
)
from veil.dap.messages import BatchMode, Extension, Interval
from veil.dap.versions import DapVersion, ReportError
from veil.messages import Ciphertext


def _merged(dap: DapHelper, out: dict[bytes, list[int]]) -> list[int]:
    return dap.vdaf.merge(None, list(out.values()))


@pytest.mark.parametrize("version", list(DapVersion))
def test_a_job_is_verified_and_its_share_released_once(tmp_path: Path, version: DapVersion) -> None:
    dap = DapHelper(tmp_path, version)
    values = [0, 3, 3, 1]
    reports = [dap.report(v) for v in values]
    body = dap.init_req(*reports)
    status, headers, answer = dap.post("/aggregation_jobs", body, INIT)
    assert status == 200, answer
    assert headers["content-type"] == "application/ppm-dap;message=aggregation-job-resp"
    location = headers["location"]
    assert location.startswith(dap.tasks + "/aggregation_jobs/")
    resps = AggregationJobResp.decode(answer, version).verify_resps
    assert [r.report_id for r in resps] == [r.metadata.report_id for r in reports]
    assert all(r.type is VerifyRespType.CONTINUE for r in resps)
    leader = dap.out_shares(answer)
    assert len(leader) == 4
    assert dap.seen(reports) == {r.metadata.report_id for r in reports}
    # The same request again (a leader's retry) finds the same job and answer;
    # so does a poll of the job at its step.
    again = dap.post("/aggregation_jobs", body, INIT)
    assert (again[0], again[1]["location"], again[2]) == (200, location, answer)
    polled = dap.call("GET", location + "?step=0", headers=dap.auth)
    assert polled[:1] == (200,) and polled[2] == answer

    ids = [r.metadata.report_id for r in reports]
    status, headers, share = dap.post("/aggregate_shares", dap.share_req(ids), SHARE_REQ)
    assert status == 200, share
    assert headers["content-type"] == "application/ppm-dap;message=aggregate-share"
    helper_share = dap.open_share(AggregateShare.decode(share).encrypted_aggregate_share)
    total = dap.vdaf.merge(None, [_merged(dap, leader), helper_share])
    assert dap.vdaf.unshard(None, [total], len(values)) == [1, 1, 0, 2]
    # Asked again, by POST or by GET of its location: the same bytes, never
    # a new draw; DELETE keeps it.
    assert dap.post("/aggregate_shares", dap.share_req(ids), SHARE_REQ)[2] == share
    where = headers["location"]
    assert dap.call("GET", where, headers=dap.auth)[2] == share
    assert dap.call("DELETE", where, headers=dap.auth)[0] == 200
    assert dap.call("GET", where, headers=dap.auth)[2] == share
    # Deleting the job keeps its replay records: its reports stay refused.
    assert dap.call("DELETE", location, headers=dap.auth)[0] == 200
    assert dap.seen(reports) == set(ids)


def test_reports_refused_one_by_one(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path)
    first = dap.report(1)
    assert dap.post("/aggregation_jobs", dap.init_req(first), INIT)[0] == 200
    good, replayed = dap.report(2), first
    extended = dap.report(0, public_extensions=(Extension(7, b"x"),))
    early = dap.report(1, time=TIME + 3)
    tampered = dap.report(3)
    tampered = replace(
        tampered,
        helper_encrypted_input_share=replace(
            tampered.helper_encrypted_input_share,
            payload=bytes([tampered.helper_encrypted_input_share.payload[0] ^ 1])
            + tampered.helper_encrypted_input_share.payload[1:],
        ),
    )
    unknown = dap.report(0)
    stranger = (dap.helper.current_config.config_id + 1) % 256
    unknown = replace(
        unknown,
        helper_encrypted_input_share=Ciphertext(
            stranger,
            unknown.helper_encrypted_input_share.enc,
            unknown.helper_encrypted_input_share.payload,
        ),
    )
    reports = [good, replayed, extended, early, tampered, unknown]
    body = dap.init_req(*reports)
    status, _, answer = dap.post("/aggregation_jobs", body, INIT)
    assert status == 200, answer
    resps = AggregationJobResp.decode(answer, dap.version).verify_resps
    assert [(r.type, r.error) for r in resps] == [
        (VerifyRespType.CONTINUE, None),
        (VerifyRespType.REJECT, ReportError.REPORT_REPLAYED),
        (VerifyRespType.REJECT, ReportError.UNSUPPORTED_EXTENSION),
        (VerifyRespType.REJECT, ReportError.REPORT_TOO_EARLY),
        (VerifyRespType.REJECT, ReportError.HPKE_DECRYPT_ERROR),
        (VerifyRespType.REJECT, ReportError.HPKE_UNKNOWN_CONFIG_ID),
    ]
    # A poll gets the same answer, the reports refused before the engine too.
    location = dap.post("/aggregation_jobs", body, INIT)[1]["location"]
    assert dap.call("GET", location + "?step=0", headers=dap.auth)[2] == answer
    # The extended report and the early one are not recorded as seen: a
    # too-early report is sent again later.
    assert dap.seen([extended, early]) == set()


def test_a_wrong_verifier_share_or_ping_pong_message_is_a_verify_error(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path)
    wrong, garbled, finish = dap.report(1), dap.report(2), dap.report(0)
    inits = [dap.verify_init(r) for r in (wrong, garbled, finish)]
    share = bytearray(inits[0].payload)
    share[-1] ^= 1  # the leader's verifier share no longer matches its report
    inits[0] = replace(inits[0], payload=bytes(share))
    inits[1] = replace(inits[1], payload=b"\x00\x00")
    inits[2] = replace(inits[2], payload=b"\x02\x00\x00\x00\x00")  # finish, not initialize

    body = AggregationJobInitReq(0, b"", (), tuple(inits)).encode()
    status, _, answer = dap.post("/aggregation_jobs", body, INIT)
    assert status == 200
    assert [r.error for r in AggregationJobResp.decode(answer, dap.version).verify_resps] == [
        ReportError.VDAF_VERIFY_ERROR
    ] * 3


def test_hostile_job_requests_store_nothing_and_stall_nothing(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path)
    reports = [dap.report(v) for v in (0, 1)]
    body = dap.init_req(*reports)
    tid = dap.task_id
    problem(dap.post("/aggregation_jobs", body[:-3], INIT), 400, "invalidMessage")
    problem(dap.post("/aggregation_jobs", body, "application/octet-stream"), 415, "invalidMessage")
    problem(dap.post("/aggregation_jobs", body, CONTINUE), 415, "invalidMessage")
    problem(dap.post("/aggregation_jobs", body + bytes(MAX_BODY), INIT), 413, "invalidMessage")
    problem(dap.post("/aggregation_jobs", body, INIT, auth=False), 401, "about:blank")
    wrong = {"content-type": INIT, "authorization": "Bearer not-the-token"}
    problem(dap.call("POST", dap.tasks + "/aggregation_jobs", body, wrong), 401, "about:blank")
    other = "/tasks/" + "A" * 43 + "/aggregation_jobs"
    doc = problem(
        dap.call("POST", other, body, {"content-type": INIT, **dap.auth}), 404, "unrecognizedTask"
    )
    assert "taskid" in doc
    problem(
        dap.post("/aggregation_jobs", dap.init_req(*reports, extensions=(Extension(9),)), INIT),
        400,
        "unsupportedExtension",
    )
    problem(
        dap.post(
            "/aggregation_jobs",
            dap.init_req(*reports, extensions=(Extension(9), Extension(3))),
            INIT,
        ),
        400,
        "invalidMessage",
    )
    problem(
        dap.post("/aggregation_jobs", dap.init_req(*reports, agg_param=b"\x01"), INIT),
        400,
        "invalidAggregationParameter",
    )
    problem(
        dap.post("/aggregation_jobs", dap.init_req(reports[0], reports[0]), INIT),
        400,
        "invalidMessage",
    )
    assert dap.seen(reports) == set()
    # A verification key id this task does not have: each report refused.
    status, _, answer = dap.post(
        "/aggregation_jobs", dap.init_req(*reports, verification_key_id=1), INIT
    )
    assert [r.error for r in AggregationJobResp.decode(answer, dap.version).verify_resps] == [
        ReportError.UNKNOWN_VERIFICATION_KEY_ID
    ] * 2
    assert dap.seen(reports) == set()
    # The honest request is served after all of them.
    status, headers, answer = dap.post("/aggregation_jobs", body, INIT)
    assert status == 200
    job = headers["location"]
    assert dap.seen(reports) == {r.metadata.report_id for r in reports}
    assert tid == dap.task_id

    # A stale or unknown job, and the wrong step.
    stale = dap.tasks + "/aggregation_jobs/" + "A" * 22
    for method in ("GET", "DELETE"):
        problem(
            dap.call(method, stale + "?step=0", headers=dap.auth), 404, "unrecognizedAggregationJob"
        )
    step = AggregationJobContinueReq(1, (VerifyContinue(reports[0].metadata.report_id, b"\x00"),))
    cont = {"content-type": CONTINUE, **dap.auth}
    problem(dap.call("POST", stale, step.encode(), cont), 404, "unrecognizedAggregationJob")
    problem(dap.call("POST", job, step.encode(), cont), 400, "invalidMessage")
    problem(dap.call("POST", job, replace(step, step=0).encode(), cont), 400, "invalidMessage")
    problem(dap.call("POST", job, replace(step, step=2).encode(), cont), 400, "stepMismatch")
    problem(dap.call("POST", job, b"\x00", cont), 400, "invalidMessage")
    problem(dap.call("GET", job + "?step=1", headers=dap.auth), 400, "stepMismatch")
    problem(dap.call("GET", job, headers=dap.auth), 400, "invalidMessage")
    problem(dap.call("GET", job + "?step=0"), 401, "about:blank")
    assert dap.call("GET", job + "?step=0", headers=dap.auth)[2] == answer


def test_hostile_aggregate_share_requests_release_nothing(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path)
    reports = [dap.report(v) for v in (0, 1, 2)]
    assert dap.post("/aggregation_jobs", dap.init_req(*reports), INIT)[0] == 200
    ids = [r.metadata.report_id for r in reports]
    good = dap.share_req(ids)
    path = "/aggregate_shares"
    problem(dap.post(path, good[:-1], SHARE_REQ), 400, "invalidMessage")
    problem(dap.post(path, good, INIT), 415, "invalidMessage")
    problem(dap.post(path, good, SHARE_REQ, auth=False), 401, "about:blank")
    problem(dap.post(path, dap.share_req(ids, count=2), SHARE_REQ), 400, "batchMismatch")
    problem(dap.post(path, dap.share_req(ids[:2]), SHARE_REQ), 400, "batchMismatch")
    empty = dap.collection(TIME - 5, 1)
    problem(dap.post(path, dap.share_req([], empty), SHARE_REQ), 400, "invalidBatchSize")
    zero = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(TIME, 0)))
    problem(dap.post(path, dap.share_req(ids, zero), SHARE_REQ), 400, "batchInvalid")
    extended = replace(dap.collection(), extensions=(Extension(5),))
    problem(dap.post(path, dap.share_req(ids, extended), SHARE_REQ), 400, "unsupportedExtension")
    unknown = dap.tasks + "/aggregate_shares/" + "A" * 22
    assert dap.call("GET", unknown, headers=dap.auth)[0] == 404
    # The honest request is released after all of them, and only once: an
    # overlapping batch is refused.
    status, _, share = dap.post(path, good, SHARE_REQ)
    assert status == 200, share
    wider = dap.collection(TIME, 2)
    problem(dap.post(path, dap.share_req(ids, wider), SHARE_REQ), 400, "batchOverlap")
    # A report of the collected batch is now refused.
    late = dap.report(3)
    _, _, answer = dap.post("/aggregation_jobs", dap.init_req(late), INIT)
    assert AggregationJobResp.decode(answer, dap.version).verify_resps == (
        VerifyResp(
            late.metadata.report_id, VerifyRespType.REJECT, error=ReportError.BATCH_COLLECTED
        ),
    )


def test_dap_18_names_its_own_errors(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path, DapVersion.DAP_18)
    reports = [dap.report(1), dap.report(0, public_extensions=(Extension(7, b"x"),))]
    _, _, answer = dap.post("/aggregation_jobs", dap.init_req(*reports), INIT)
    assert [r.error for r in AggregationJobResp.decode(answer, dap.version).verify_resps] == [
        None,
        ReportError.INVALID_MESSAGE,
    ]
    problem(
        dap.post("/aggregation_jobs", dap.init_req(dap.report(1), verification_key_id=3), INIT),
        400,
        "invalidMessage",
    )


def test_a_dap_task_is_not_aggregated_over_grpc(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path)
    token = dap.task.aggregator_token
    with pytest.raises(InvalidMessage, match="served over DAP"):
        dap.helper.aggregate(dap.task_id, token, bytes(16), [])
    with pytest.raises(InvalidMessage, match="served over DAP"):
        dap.helper.aggregate_share(dap.task_id, token, bytes(16), 0, 3600, 0, bytes(32))
