"""The helper's side of DAP's leader-selected batch mode (draft-ietf-ppm-dap
section 5.2): a job's reports join the batch its leader_selected_batch_id
extension names, and an AggregateShareReq names the batch by its id; on a
real helper and its store (SQLite and PostgreSQL), with the leader's side
written from the draft (tests.support.dap_helper)."""

from __future__ import annotations

import secrets
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

from tests.support.backends import Backend
from tests.support.dap_helper import INIT, SHARE_REQ, DapHelper, problem
from veil.dap.jobs import (
    AggregateShare,
    AggregateShareReq,
    AggregationJobResp,
    BatchSelector,
    CollectionJobReq,
    Query,
    VerifyResp,
    VerifyRespType,
    batch_id_extension,
)
from veil.dap.messages import (
    LEADER_SELECTED_BATCH_ID_EXTENSION,
    BatchMode,
    Extension,
    Interval,
    TaskConfiguration,
)
from veil.dap.versions import ReportError
from veil.task import DpSpec, b64d

LS = CollectionJobReq(Query(BatchMode.LEADER_SELECTED))


def _job(dap: DapHelper, batch_id: bytes, values: list[int]) -> tuple[list[bytes], list[int]]:
    """One job of `values` into batch `batch_id`: the report ids, and the
    leader's output shares merged."""
    reports = [dap.report(v) for v in values]
    status, headers, answer = dap.post(
        "/aggregation_jobs",
        dap.init_req(*reports, extensions=(batch_id_extension(batch_id),)),
        INIT,
    )
    assert status == 200, answer
    out = dap.out_shares(answer)
    assert len(out) == len(values)
    job_id = headers["location"].rsplit("/", 1)[1]
    assert dap.world.helper_store.helper_job_batch(dap.task_id, b64d(job_id)) == batch_id
    return [r.metadata.report_id for r in reports], dap.vdaf.merge(None, list(out.values()))


def _release(dap: DapHelper, batch_id: bytes, ids: list[bytes]) -> tuple[bytes, list[int]]:
    status, _, body = dap.post(
        "/aggregate_shares", dap.share_req(ids, batch_id=batch_id), SHARE_REQ
    )
    assert status == 200, body
    return body, dap.open_share(AggregateShare.decode(body).encrypted_aggregate_share, LS)


def test_two_batches_are_each_released_once_exactly(tmp_path: Path, backend: Backend) -> None:
    dap = DapHelper(tmp_path, batch_mode="leader-selected", backend=backend)
    config = TaskConfiguration.decode(dap.config.encode(dap.version), dap.version)
    assert config.batch_mode is BatchMode.LEADER_SELECTED and config.batch_config == b""
    first, second = secrets.token_bytes(32), secrets.token_bytes(32)
    # Two jobs into the first batch, one into the second, all of one time.
    ids_a, out_a = _job(dap, first, [0, 1])
    ids_a2, out_a2 = _job(dap, first, [3])
    ids_b, out_b = _job(dap, second, [2, 2, 1])
    batches = {first: (ids_a + ids_a2, [out_a, out_a2], 3), second: (ids_b, [out_b], 3)}
    expected = {first: [1, 1, 0, 1], second: [0, 1, 2, 0]}
    for batch_id, (ids, outs, count) in batches.items():
        share, helper = _release(dap, batch_id, ids)
        total = dap.vdaf.merge(None, [*outs, helper])
        assert dap.vdaf.unshard(None, [total], count) == expected[batch_id]
        # The same request again gets the same bytes; another request for
        # the batch is refused: it was collected.
        assert _release(dap, batch_id, ids)[0] == share
        problem(
            dap.post(
                "/aggregate_shares",
                dap.share_req(ids, batch_id=batch_id, count=count + 1),
                SHARE_REQ,
            ),
            400,
            "batchOverlap",
        )
    # A report sent into a collected batch is refused as collected; into a
    # new batch it is aggregated.
    late = dap.report(1)
    ext = (batch_id_extension(first),)
    _, _, answer = dap.post("/aggregation_jobs", dap.init_req(late, extensions=ext), INIT)
    assert AggregationJobResp.decode(answer, dap.version).verify_resps == (
        VerifyResp(
            late.metadata.report_id, VerifyRespType.REJECT, error=ReportError.BATCH_COLLECTED
        ),
    )
    _job(dap, secrets.token_bytes(32), [1])


def test_each_batch_is_charged_once_and_composes_in_parallel(
    tmp_path: Path, backend: Backend
) -> None:
    # A budget of one collection: two batches of disjoint reports are both
    # released (parallel composition), each noised and charged once.
    dp = DpSpec("geometric", epsilon="1", budget="1")
    dap = DapHelper(tmp_path, batch_mode="leader-selected", backend=backend, dp=dp)
    ledger = dap.helper.privacy.ledger
    task = dap.task.id_text
    for batch_id in (secrets.token_bytes(32), secrets.token_bytes(32)):
        ids, _ = _job(dap, batch_id, [1, 2, 3])
        share = _release(dap, batch_id, ids)[0]
        assert _release(dap, batch_id, ids)[0] == share  # stored, never drawn again
    status = ledger.task_status(task)
    assert (status.spent, status.collections) == (Fraction(1), 2)


def test_the_batch_id_extension_is_required_exactly_where_it_applies(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path, batch_mode="leader-selected")
    reports = [dap.report(v) for v in (0, 1)]
    batch = batch_id_extension(secrets.token_bytes(32))
    # Absent, or not a BatchID: invalidMessage (section 5.2.2).
    problem(dap.post("/aggregation_jobs", dap.init_req(*reports), INIT), 400, "invalidMessage")
    short = Extension(LEADER_SELECTED_BATCH_ID_EXTENSION, bytes(31))
    problem(
        dap.post("/aggregation_jobs", dap.init_req(*reports, extensions=(short,)), INIT),
        400,
        "invalidMessage",
    )
    # Another extension beside it: unsupportedExtension.
    problem(
        dap.post(
            "/aggregation_jobs", dap.init_req(*reports, extensions=(batch, Extension(9))), INIT
        ),
        400,
        "unsupportedExtension",
    )
    assert dap.seen(reports) == set()
    # A time-interval task refuses it.
    (tmp_path / "ti").mkdir()
    interval = DapHelper(tmp_path / "ti")
    problem(
        interval.post(
            "/aggregation_jobs",
            interval.init_req(interval.report(1), extensions=(batch,)),
            INIT,
        ),
        400,
        "unsupportedExtension",
    )
    # The honest job is served after all of them.
    assert (
        dap.post("/aggregation_jobs", dap.init_req(*reports, extensions=(batch,)), INIT)[0] == 200
    )
    assert dap.seen(reports) == {r.metadata.report_id for r in reports}


def test_hostile_aggregate_share_requests_of_a_leader_selected_task(tmp_path: Path) -> None:
    dap = DapHelper(tmp_path, batch_mode="leader-selected")
    batch_id = secrets.token_bytes(32)
    ids, _ = _job(dap, batch_id, [0, 1, 2])
    path = "/aggregate_shares"
    # A batch id of which the helper aggregated nothing: batchInvalid.
    problem(
        dap.post(path, dap.share_req(ids, batch_id=secrets.token_bytes(32)), SHARE_REQ),
        400,
        "batchInvalid",
    )
    # The other batch mode's selector: invalidMessage; a time-interval query
    # beside a batch id: batchInvalid.
    problem(dap.post(path, dap.share_req(ids), SHARE_REQ), 400, "invalidMessage")
    interval_query = CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(1, 1)))
    problem(
        dap.post(path, dap.share_req(ids, interval_query, batch_id=batch_id), SHARE_REQ),
        400,
        "batchInvalid",
    )
    mixed = AggregateShareReq(
        LS, BatchSelector(BatchMode.TIME_INTERVAL, Interval(1, 1)), 3, bytes(32)
    ).encode()
    problem(dap.post(path, mixed, SHARE_REQ), 400, "invalidMessage")
    problem(
        dap.post(path, dap.share_req(ids[:2], batch_id=batch_id), SHARE_REQ), 400, "batchMismatch"
    )
    extended = replace(LS, extensions=(Extension(5),))
    problem(
        dap.post(path, dap.share_req(ids, extended, batch_id=batch_id), SHARE_REQ),
        400,
        "unsupportedExtension",
    )
    # Nothing was released: the honest request is.
    _release(dap, batch_id, ids)
