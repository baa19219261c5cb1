"""The leader's DAP routes (veil.aggregator.run.dap_http over
veil.aggregator.leader.dap), called as an ASGI application in process over a
real leader and its SQLite store: the HPKE config list, uploads stored
through the leader's report writer, and hostile uploads answered with DAP's
problem documents or ReportErrors, nothing stored."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.in_process import NOW, TP, World
from veil.aggregator.errors import InvalidMessage
from veil.aggregator.leader.dap_client import ByProtocol, DapHelperClient
from veil.aggregator.run.dap_helper_http import dap_helper_app
from veil.aggregator.run.dap_http import dap_app
from veil.aggregator.store.records import LEADER_SELECTED_BUCKETS
from veil.dap.jobs import CollectionJobReq, CollectionJobResp, Query
from veil.dap.messages import (
    BatchMode,
    Extension,
    HpkeConfigList,
    Interval,
    Report,
    ReportUploadStatus,
    UploadErrors,
    UploadRequest,
)
from veil.dap.problems import media_type
from veil.dap.report import prepare_report
from veil.dap.shares import open_aggregate_share
from veil.dap.versions import DapVersion, ReportError, Role
from veil.hpke import generate_keypair
from veil.messages import Ciphertext
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task

UPLOAD = "application/ppm-dap;message=upload-req"
COLLECT = "application/ppm-dap;message=collection-job-req"
MAX_BODY = 64 * 1024


def _files(
    version: DapVersion = DapVersion.DAP_19,
    dap: bool = True,
    batch_mode: str = "time-interval",
    min_batch_size: int = 2,
    report_expiry_age: int | None = None,
) -> TaskFiles:
    spec = DapSpec(
        "https://leader.example/",
        "https://helper.example/",
        version.value,
        "t",
        batch_mode=batch_mode,
    )
    return new_task(
        VdafSpec("histogram", length=4, chunk_length=2),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=min_batch_size,
        dp=DpSpec("none"),
        dap=spec if dap else None,
        report_expiry_age=report_expiry_age,
    )


class Dap:
    """A leader serving one DAP task, its routes called in process."""

    def __init__(
        self,
        tmp_path: Path,
        version: DapVersion = DapVersion.DAP_19,
        backend: Backend | None = None,
        clock: Callable[[], float] = lambda: NOW,
        **kw: Any,
    ) -> None:
        self.files = _files(version, **kw)
        self.world = World(backend or Backend(tmp_path, None), self.files, clock)
        self.leader = self.world.leader
        self.app = dap_app(self.leader.dap, MAX_BODY, self.leader.dap_collections)
        self.version = version
        task = self.files.client
        self.task_id = task.task_id
        self.path = f"/tasks/{task.id_text}/reports"
        self.config = task.dap_configuration()
        self.vdaf = task.vdaf.instantiate()

    def report(self, value: int, time: int = NOW // TP - 1, **kw: Any) -> Report:
        return prepare_report(
            self.version,
            self.task_id,
            self.config,
            self.vdaf,
            value,
            time,
            self.leader.current_config,
            self.world.helper.current_config,
            **kw,
        )

    def stored(self) -> int:
        return self.world.leader_store.unaggregated_count(self.task_id, 0, 2**63 - 1)

    def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        return asyncio.run(_asgi(self.app, method, path, body, headers or {}))

    def upload(self, *reports: Report, content_type: str = UPLOAD) -> tuple[int, Any, bytes]:
        body = UploadRequest(reports).encode()
        return self.call("POST", self.path, body, {"content-type": content_type})


async def _asgi(
    app: Any, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request through an ASGI application (what uvicorn does)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)] or [b""]
    inbox = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    got = {k.decode(): v.decode() for k, v in start["headers"]}
    return (
        start["status"],
        got,
        b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"),
    )


def _problem(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers["content-type"] == "application/problem+json"
    doc = json.loads(body)
    assert doc["status"] == status
    return doc


def test_hpke_config_list(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    status, headers, body = dap.call("GET", "/hpke_config")
    assert status == 200
    assert headers["content-type"] == "application/ppm-dap;message=hpke-config-list"
    assert headers["cache-control"] == "max-age=300"
    assert HpkeConfigList.decode(body).first_supported() == dap.leader.current_config


@pytest.mark.parametrize("version", list(DapVersion))
def test_an_upload_is_stored_and_a_retry_acknowledged(tmp_path: Path, version: DapVersion) -> None:
    dap = Dap(tmp_path, version)
    reports = [dap.report(v) for v in (0, 3, 3)]
    assert dap.upload(*reports) == (200, {"content-length": "0"}, b"")
    assert dap.stored() == 3
    # The same upload again (a client's retry): acknowledged, stored once.
    assert dap.upload(*reports)[0] == 200
    assert dap.stored() == 3
    # Another report under a stored report's id is a replay.
    replay = dap.report(1, report_id=reports[0].metadata.report_id)
    status, headers, body = dap.upload(replay, dap.report(2))
    assert status == 200
    assert headers["content-type"] == "application/ppm-dap;message=upload-errors"
    assert UploadErrors.decode(body, version) == UploadErrors(
        (ReportUploadStatus(replay.metadata.report_id, ReportError.REPORT_REPLAYED),)
    )
    assert dap.stored() == 4


def test_reports_refused_one_by_one(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    good = dap.report(1)
    late = dap.report(1, time=(NOW + 3 * TP) // TP)
    other_key = dap.report(2)
    stranger = generate_keypair((dap.leader.current_config.config_id + 1) % 256).config
    unknown_key = replace(
        other_key,
        leader_encrypted_input_share=Ciphertext(
            stranger.config_id,
            other_key.leader_encrypted_input_share.enc,
            other_key.leader_encrypted_input_share.payload,
        ),
    )
    extended = dap.report(0, public_extensions=(Extension(7, b"x"),))
    short = dap.report(3)
    short = replace(
        short,
        leader_encrypted_input_share=replace(
            short.leader_encrypted_input_share,
            payload=short.leader_encrypted_input_share.payload[:-1],
        ),
    )
    status, _, body = dap.upload(late, good, unknown_key, extended, short)
    assert status == 200
    assert [(s.report_id, s.error) for s in UploadErrors.decode(body, dap.version).statuses] == [
        (late.metadata.report_id, ReportError.REPORT_TOO_EARLY),
        (unknown_key.metadata.report_id, ReportError.HPKE_UNKNOWN_CONFIG_ID),
        (extended.metadata.report_id, ReportError.UNSUPPORTED_EXTENSION),
        (short.metadata.report_id, ReportError.INVALID_MESSAGE),
    ]
    assert dap.stored() == 1


def test_dap_18_codes(tmp_path: Path) -> None:
    dap = Dap(tmp_path, DapVersion.DAP_18)
    extended = dap.report(0, public_extensions=(Extension(7, b"x"),))
    status, _, body = dap.upload(extended)
    assert status == 200 and body == extended.metadata.report_id + bytes([8])  # invalid_message


@pytest.mark.parametrize(
    ("content_type", "detail"),
    [
        ("application/octet-stream", "is not application/ppm-dap"),
        ("application/dap-report", "is not application/ppm-dap"),
        ("application/ppm-dap;message=hpke-config-list", "an upload is"),
        ("", "no Content-Type"),
    ],
)
def test_other_media_types_are_refused(tmp_path: Path, content_type: str, detail: str) -> None:
    dap = Dap(tmp_path)
    status, headers, body = dap.upload(dap.report(1), content_type=content_type)
    doc = _problem(status, headers, body)
    assert status == 415 and doc["type"] == "urn:ietf:params:ppm:dap:error:invalidMessage"
    assert detail in doc["detail"]
    assert dap.stored() == 0


def test_malformed_bodies_are_refused_whole(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    encoded = UploadRequest((dap.report(1), dap.report(2))).encode()
    for body, detail in [
        (encoded[:-1], "runs past the end"),
        (encoded + b"\x00", "UploadRequest.Report"),
        (b"", "no report"),
    ]:
        status, headers, got = dap.call("POST", dap.path, body, {"content-type": UPLOAD})
        doc = _problem(status, headers, got)
        assert status == 400 and doc["type"].endswith(":invalidMessage")
        assert detail in doc["detail"]
        assert doc["taskid"] == dap.files.client.id_text
    status, headers, got = dap.call("POST", dap.path, bytes(MAX_BODY + 1), {"content-type": UPLOAD})
    assert status == 413 and _problem(status, headers, got)["type"].endswith(":invalidMessage")
    status, _, _ = dap.call(
        "POST", dap.path, b"", {"content-type": UPLOAD, "content-length": str(MAX_BODY + 1)}
    )
    assert status == 413
    assert dap.stored() == 0


def test_unknown_tasks(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    veil_task = _files(dap=False).client  # not served here, and not a DAP task
    for path in [
        f"/tasks/{base64.urlsafe_b64encode(bytes(32)).rstrip(b'=').decode()}/reports",
        f"/tasks/{veil_task.id_text}/reports",
        "/tasks/short/reports",
        f"/tasks/{dap.files.client.id_text}=/reports",
    ]:
        status, headers, body = dap.call(
            "POST", path, UploadRequest((dap.report(1),)).encode(), {"content-type": UPLOAD}
        )
        doc = _problem(status, headers, body)
        assert status == 404 and doc["type"].endswith(":unrecognizedTask")
    assert dap.call("GET", dap.path)[0] == 405
    assert dap.stored() == 0


def _in_process(app: Any) -> Any:
    """An HTTP client into `app` (the helper's DAP routes) in this process."""

    def send(request: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
        url = urllib.parse.urlsplit(request.full_url)
        path = url.path + (f"?{url.query}" if url.query else "")
        body = request.data if isinstance(request.data, bytes) else b""
        headers = {k.lower(): v for k, v in request.header_items()}
        return asyncio.run(_asgi(app, request.get_method(), path, body, headers))

    return send


def _over_dap(dap: Dap) -> None:
    """The leader's link to the helper as `veil leader` builds it, the DAP
    helper's routes served in process."""
    client = DapHelperClient(send=_in_process(dap_helper_app(dap.world.helper.dap, MAX_BODY)))
    dap.leader.peer.api = ByProtocol(dap.world.link, client)


def _collection_req(start: int, duration: int = 1, **kw: Any) -> bytes:
    return CollectionJobReq(
        Query(BatchMode.TIME_INTERVAL, Interval(start, duration)), **kw
    ).encode()


def _collected(dap: Dap, request: bytes) -> CollectionJobResp:
    """The collector's POST of `request`, the leader's jobs driven until none
    is left, then its GET: the CollectionJobResp."""
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    status, headers, _ = dap.call("POST", jobs, request, auth)
    assert status == 201
    while dap.leader.run_once():
        pass
    status, _, body = dap.call(
        "GET", headers["location"], b"", {"authorization": auth["authorization"]}
    )
    assert status == 200, body
    return CollectionJobResp.decode(body)


def _agg_shares(dap: Dap, request: bytes, resp: CollectionJobResp) -> list[Any]:
    """The leader's and the helper's aggregate shares of `resp`, opened with
    the collector's key for the CollectionJobReq `request`."""
    return [
        dap.vdaf.decode_agg_share(
            None,
            open_aggregate_share(
                dap.version,
                dap.files.collector.collector_hpke_keypair,
                role,
                dap.task_id,
                dap.config,
                CollectionJobReq.decode(request),
                ct,
            ),
        )
        for role, ct in (
            (Role.LEADER, resp.leader_encrypted_agg_share),
            (Role.HELPER, resp.helper_encrypted_agg_share),
        )
    ]


def test_a_dap_task_is_aggregated_and_collected_over_dap_only(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    with pytest.raises(InvalidMessage, match="is served over DAP"):
        dap.leader.upload(dap.task_id, [dap.world.report(1)])
    token = dap.files.collector.collector_token
    with pytest.raises(InvalidMessage, match="is served over DAP"):
        dap.leader.create_collection(dap.task_id, token, bytes(16), NOW - NOW % TP - TP, TP)
    _over_dap(dap)
    when = NOW // TP - 1
    assert dap.upload(*(dap.report(v, when) for v in (1, 2, 2)))[0] == 200
    while dap.leader.run_once():
        pass
    # Aggregated with the DAP helper, nothing over veil's own protocol.
    assert dap.stored() == 0
    assert dap.world.link.calls == 0

    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    request = _collection_req(when)
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    status, headers, _ = dap.call("POST", jobs, request, auth)
    assert status == 201
    location = headers["location"]
    assert dap.call("POST", jobs, request, auth)[1]["location"] == location
    assert dap.call("GET", location, b"", auth)[2] == b""  # not collected yet
    while dap.leader.run_once():
        pass
    status, headers, body = dap.call("GET", location, b"", auth)
    assert status == 200 and headers["content-type"] == media_type("collection-job-resp")
    resp = CollectionJobResp.decode(body)
    assert (resp.report_count, resp.interval) == (3, Interval(when, 1))
    shares = _agg_shares(dap, request, resp)
    assert dap.vdaf.unshard(None, shares, 3) == [0, 1, 2, 0]
    # The batch is collected: another collection of it is refused.
    other = dap.call("POST", jobs, _collection_req(when - 1, 2), auth)
    assert _problem(*other)["type"].endswith(":batchOverlap")


def test_hostile_collection_requests_create_nothing(tmp_path: Path) -> None:
    dap = Dap(tmp_path)
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    when = NOW // TP - 1
    good = _collection_req(when)
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    cases = [
        (good[:-1], auth, 400, "invalidMessage"),
        (good, {**auth, "content-type": UPLOAD}, 415, "invalidMessage"),
        (good, {"content-type": COLLECT}, 401, "about:blank"),
        (good, {**auth, "authorization": "Bearer wrong"}, 401, "about:blank"),
        (_collection_req(when, 0), auth, 400, "batchInvalid"),
        (_collection_req(when, agg_param=b"x"), auth, 400, "invalidAggregationParameter"),
        (_collection_req(when, extensions=(Extension(4),)), auth, 400, "unsupportedExtension"),
        (good + bytes(MAX_BODY), auth, 413, "invalidMessage"),
    ]
    for body, headers, status, kind in cases:
        got = dap.call("POST", jobs, body, headers)
        assert got[0] == status, (kind, got)
        assert json.loads(got[2])["type"].endswith(kind)
    unknown = "/tasks/" + "A" * 43 + "/collection_jobs"
    assert _problem(*dap.call("POST", unknown, good, auth))["type"].endswith(":unrecognizedTask")
    stale = f"{jobs}/{'A' * 22}"
    assert dap.call("GET", stale, b"", auth)[0] == 404
    assert dap.call("GET", stale, b"", {})[0] == 401
    assert _problem(*dap.call("POST", jobs, good, auth))["type"].endswith(":invalidBatchSize")
    # The honest request is taken after all of them, once the batch holds
    # min_batch_size reports.
    assert dap.upload(*(dap.report(v, when) for v in (1, 2)))[0] == 200
    got = dap.call("POST", jobs, good, auth)
    assert got[0] == 201, got


LS_REQUEST = CollectionJobReq(Query(BatchMode.LEADER_SELECTED)).encode()


def test_leader_selected_batches_hold_min_batch_size_after_rejections(tmp_path: Path) -> None:
    """The leader fills each batch to min_batch_size (3): a report the
    helper rejects leaves its batch short, and the batch takes the next
    upload before it is collected; the next batch is another."""
    dap = Dap(tmp_path, batch_mode="leader-selected", min_batch_size=3)
    _over_dap(dap)
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    when = NOW // TP - 1
    # The helper's share of the second report does not open: the helper
    # rejects it, the leader counts it for no batch.
    bad = dap.report(1, when)
    helper_ct = bad.helper_encrypted_input_share
    bad = replace(bad, helper_encrypted_input_share=replace(helper_ct, payload=bytes(16)))
    assert dap.upload(dap.report(0, when), bad, dap.report(3, when))[0] == 200
    while dap.leader.run_once():
        pass
    store = dap.world.leader_store
    assert store.ready_batch(dap.task_id, 3) is None
    assert _problem(*dap.call("POST", jobs, LS_REQUEST, auth))["type"].endswith(":invalidBatchSize")
    # The next uploads: one fills the first batch, three make the second.
    assert dap.upload(*(dap.report(v, when) for v in (3, 2, 2, 1)))[0] == 200
    while dap.leader.run_once():
        pass
    results = []
    for _ in range(2):
        status, headers, _ = dap.call("POST", jobs, LS_REQUEST, auth)
        assert status == 201
        location = headers["location"]
        # Asked again while it is pending: the same job.
        assert dap.call("POST", jobs, LS_REQUEST, auth)[1]["location"] == location
        while dap.leader.run_once():
            pass
        status, headers, body = dap.call("GET", location, b"", auth)
        assert status == 200, body
        resp = CollectionJobResp.decode(body)
        shares = _agg_shares(dap, LS_REQUEST, resp)
        assert resp.report_count == 3
        results.append(dap.vdaf.unshard(None, shares, 3))
    # Between them every report but the rejected one, each once; the first
    # batch holds 0 and 3 and one of the next uploads.
    assert [sum(c) for c in zip(*results, strict=True)] == [1, 1, 2, 2]
    assert all(sum(r) == 3 for r in results)
    assert any(r[0] == 1 and r[3] >= 1 for r in results)
    # Each report in one batch, none left: the next request finds no batch.
    assert _problem(*dap.call("POST", jobs, LS_REQUEST, auth))["type"].endswith(":invalidBatchSize")


def test_a_query_of_the_other_batch_mode_is_refused(tmp_path: Path) -> None:
    chosen = Dap(tmp_path, batch_mode="leader-selected")
    (tmp_path / "ti").mkdir()
    interval = Dap(tmp_path / "ti")
    for dap, body in ((chosen, _collection_req(NOW // TP - 1)), (interval, LS_REQUEST)):
        token = dap.files.collector.collector_token
        jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
        auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
        doc = _problem(*dap.call("POST", jobs, body, auth))
        assert doc["type"].endswith(":invalidMessage") and "batch mode" in doc["detail"]
        assert dap.world.leader_store.collections(dap.task_id) == []


def test_a_collection_job_is_deleted_by_its_collector(tmp_path: Path, backend: Backend) -> None:
    """DELETE of a collection job (section 4.6): a finished job is kept as
    deleted, its poll 404, its batch collected for good (the same request
    and an overlapping one batchOverlap); a pending job that closed nothing
    is discarded whole and the same request makes it again; a repeated
    delete of a kept job is 200 again. Hostile deletions change nothing."""
    dap = Dap(tmp_path, backend=backend)
    _over_dap(dap)
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    bearer = {"authorization": f"Bearer {token}"}
    when = NOW // TP - 2
    assert dap.upload(*(dap.report(v, t) for v in (1, 2) for t in (when, when + 1)))[0] == 200
    while dap.leader.run_once():
        pass
    first = _collection_req(when)
    status, headers, _ = dap.call("POST", jobs, first, auth)
    assert status == 201
    location = headers["location"]
    while dap.leader.run_once():
        pass
    assert dap.call("GET", location, b"", bearer)[0] == 200
    store = dap.world.leader_store
    before = (store.collections(dap.task_id), store.batch_aggregates(dap.task_id, 0, 2**63 - 1))

    # Hostile deletions: refused with the draft's types, nothing changed.
    unknown_task = "/tasks/" + "A" * 43 + "/collection_jobs/" + location.rsplit("/", 1)[1]
    cases = [
        (location, {}, 401, "about:blank"),
        (location, {"authorization": "Bearer wrong"}, 401, "about:blank"),
        (location, {"authorization": f"Bearer {dap.files.leader.aggregator_token}"}, 401, None),
        (unknown_task, bearer, 404, "unrecognizedTask"),
        ("/tasks/not-a-task/collection_jobs/" + "A" * 22, bearer, 404, "unrecognizedTask"),
        (f"{jobs}/{'A' * 22}", bearer, 404, "invalidMessage"),
        (f"{jobs}/{'A' * 21}", bearer, 404, "invalidMessage"),
        (f"{jobs}/{'A' * 21}B", bearer, 404, "invalidMessage"),
        (f"{jobs}/{'%FF' * 22}", bearer, 404, "invalidMessage"),
        (f"{jobs}/{'A' * 300}", bearer, 404, "invalidMessage"),
    ]
    for path, headers, status, kind in cases:
        got = dap.call("DELETE", path, b"", headers)
        assert got[0] == status, (path, got)
        if kind is not None:
            assert json.loads(got[2])["type"].endswith(kind), got
    assert (store.collections(dap.task_id), store.batch_aggregates(dap.task_id, 0, 2**63 - 1)) == (
        before
    )

    # The finished job deleted: kept, its poll 404, its batch collected.
    for _ in range(2):
        assert dap.call("DELETE", location, b"", bearer)[:3:2] == (200, b"")
    (kept,) = store.collections(dap.task_id)
    assert kept.state == "deleted" and kept.leader_ct is not None
    assert store.batch_aggregates(dap.task_id, 0, 2**63 - 1) == before[1]
    gone = _problem(*dap.call("GET", location, b"", bearer))
    assert gone["status"] == 404 and "deleted" in gone["detail"]
    assert _problem(*dap.call("POST", jobs, first, auth))["type"].endswith(":batchOverlap")
    overlap = _collection_req(when, 2)
    assert _problem(*dap.call("POST", jobs, overlap, auth))["type"].endswith(":batchOverlap")
    assert dap.leader.collections.task_info(dap.task_id, token).collections_finished == 1

    # A pending job that has closed nothing yet is discarded whole: the
    # same request makes it again, and it is collected.
    second = _collection_req(when + 1)
    status, headers, _ = dap.call("POST", jobs, second, auth)
    assert status == 201
    pending = headers["location"]
    assert dap.call("DELETE", pending, b"", bearer)[0] == 200
    assert [c.state for c in store.collections(dap.task_id)] == ["deleted"]
    assert dap.call("GET", pending, b"", bearer)[0] == 404
    assert dap.call("DELETE", pending, b"", bearer)[0] == 404
    assert dap.call("POST", jobs, second, auth)[1]["location"] == pending
    while dap.leader.run_once():
        pass
    resp = CollectionJobResp.decode(dap.call("GET", pending, b"", bearer)[2])
    assert resp.report_count == 2


def test_a_pending_collection_job_that_closed_its_batch_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A pending job deleted once it has closed its batch is never driven
    again, and its batch is never collected by another job: a driver's step
    on a read of the job from before the deletion asks the helper nothing,
    and its log does not call the batch collectable."""
    dap = Dap(tmp_path)
    _over_dap(dap)
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    when = NOW // TP - 1
    assert dap.upload(*(dap.report(v, when) for v in (1, 2)))[0] == 200
    while dap.leader.run_once():
        pass
    status, headers, _ = dap.call("POST", jobs, _collection_req(when), auth)
    assert status == 201
    store = dap.world.leader_store
    (record,) = store.collections(dap.task_id)
    # The driver's step, closing the batch for the job, before the deletion.
    store.close_collection_batch(record, TP)
    assert (
        dap.call("DELETE", headers["location"], b"", {"authorization": f"Bearer {token}"})[0] == 200
    )
    with caplog.at_level(logging.INFO, logger="veil.aggregator.leader.collection"):
        assert dap.leader.collections.run_collection(record, "driver", 60.0) is False
    assert "no longer pending" in caplog.text and "collectable" not in caplog.text
    assert dap.world.helper_store.collections(dap.task_id) == []
    while dap.leader.run_once():
        pass
    (kept,) = store.collections(dap.task_id)
    assert (kept.state, kept.leader_ct) == ("deleted", None)
    assert dap.leader.collections.task_info(dap.task_id, token).collections_finished == 0
    refused = dap.call("POST", jobs, _collection_req(when - 1, 2), auth)
    assert _problem(*refused)["type"].endswith(":batchOverlap")


@pytest.mark.parametrize("batch_mode", ["time-interval", "leader-selected"])
def test_a_deletion_racing_the_driver_leaves_no_batch_closed(
    tmp_path: Path, backend: Backend, batch_mode: str
) -> None:
    """The collector deletes a pending job after the driver's pass read it
    and before the driver closes its batch (the steps run in that order):
    the job is discarded, and the driver's step closes nothing and asks
    the helper nothing, so the batch stays collectable: collected exactly
    by the next request, in both batch modes. (The driver once closed the
    batch for the discarded job: collected by nobody, released never.)"""
    dap = Dap(tmp_path, backend=backend, batch_mode=batch_mode)
    _over_dap(dap)
    token = dap.files.collector.collector_token
    jobs = f"/tasks/{dap.files.client.id_text}/collection_jobs"
    auth = {"authorization": f"Bearer {token}", "content-type": COLLECT}
    bearer = {"authorization": f"Bearer {token}"}
    when = NOW // TP - 1
    assert dap.upload(*(dap.report(v, when) for v in (1, 3)))[0] == 200
    while dap.leader.run_once():
        pass
    request = LS_REQUEST if batch_mode == "leader-selected" else _collection_req(when)
    status, headers, _ = dap.call("POST", jobs, request, auth)
    assert status == 201
    leader, helper = dap.world.leader_store, dap.world.helper_store
    (read,) = leader.acquire_collections("driver", 60.0, 16)  # the driver's pass reads it
    assert dap.call("DELETE", headers["location"], b"", bearer)[0] == 200  # discarded
    assert leader.collections(dap.task_id) == []
    assert dap.leader.collections.run_collection(read, "driver", 60.0) is False
    everything = (dap.task_id, 0, 2**63 - 1)
    assert [a.collected_by for a in leader.batch_aggregates(*everything)] == [None]
    assert leader.collections(dap.task_id) == helper.collections(dap.task_id) == []
    # The batch is collected by the next request, exactly.
    resp = _collected(dap, request)
    assert resp.report_count == 2
    assert dap.vdaf.unshard(None, _agg_shares(dap, request, resp), 2) == [0, 1, 0, 1]


def test_leader_selected_batches_go_with_their_reports_expiry(
    tmp_path: Path, backend: Backend
) -> None:
    """Garbage collection takes a leader-selected batch by the rule it takes
    a time bucket by, report expiry: once every report of the batch is past
    the task's report_expiry_age, at the leader (its reports, the batch's
    record, aggregate and collection) and at the helper (its replay
    records, the batch's aggregate and released share), collected or not; a
    batch with a report still young stays whole, and is collected after."""
    dap = Dap(tmp_path, backend=backend, batch_mode="leader-selected", report_expiry_age=4 * TP)
    _over_dap(dap)
    old, young = NOW // TP - 3, NOW // TP - 1
    leader, helper = dap.world.leader_store, dap.world.helper_store

    def collect() -> CollectionJobResp:
        return _collected(dap, LS_REQUEST)

    def batches(store: Any) -> set[int]:
        rows = store.batch_aggregates(dap.task_id, LEADER_SELECTED_BUCKETS, 2**63 - 1)
        return {a.bucket for a in rows}

    # Batch 1 (old reports) collected; batch 2 (old) and 3 (young) not.
    for when in (old, old, young):
        assert dap.upload(dap.report(1, when), dap.report(0, when))[0] == 200
        while dap.leader.run_once():
            pass
        if len(batches(leader)) == 1 and not leader.collections(dap.task_id):
            assert collect().report_count == 2
    assert len(batches(leader)) == len(batches(helper)) == 3
    assert [c.state for c in helper.collections(dap.task_id)] == ["finished"]

    def gc(now: int) -> None:
        # As veil.aggregator.maintenance.gc_task at `now`, but for the helper's
        # job records: they are dated by the wall clock, not by this test's.
        horizon = now - 4 * TP - dap.files.leader.max_clock_skew
        for store in (leader, helper):
            store.collect_garbage(dap.task_id, TP, horizon, None)

    gc(NOW)  # nothing has expired
    assert len(batches(leader)) == len(batches(helper)) == 3
    assert len(leader.collections(dap.task_id)) == 1

    # Two hours on the old reports are past the four hours' expiry (with
    # the task's clock skew), the young ones not.
    gc(NOW + 2 * TP)
    counts = leader.report_counts(dap.task_id, TP)
    assert set(counts) == {young * TP} and sum(counts[young * TP].values()) == 2
    (kept,) = batches(leader)
    assert batches(helper) == {kept}
    assert leader.collections(dap.task_id) == helper.collections(dap.task_id) == []
    batch_id = leader.batch_of_bucket(dap.task_id, kept)
    assert batch_id is not None
    assert leader.ready_batch(dap.task_id, 2) == (batch_id, kept)
    # The young batch, whole at both, is the one collected next, exactly.
    resp = collect()
    assert resp.report_count == 2
    assert dap.vdaf.unshard(None, _agg_shares(dap, LS_REQUEST, resp), 2) == [1, 1, 0, 0]


def test_a_batch_near_expiry_takes_no_fresh_report_after_the_helpers_gc(
    tmp_path: Path, backend: Backend
) -> None:
    """A leader-selected batch retires once its oldest report is within the
    margin of expiry (veil.aggregator.store.batches.joinable_from): after
    the helper's GC took a short batch of old reports, fresh reports go to
    a new batch, which is collected exactly, and the leader's GC then takes
    the old one as the helper's did. Joining the old batch instead (the
    code before) left the leader counting reports the helper had deleted:
    that batch failed collection with batchMismatch, and never went."""
    now = [NOW]
    dap = Dap(
        tmp_path,
        backend=backend,
        clock=lambda: now[0],
        batch_mode="leader-selected",
        min_batch_size=3,
        report_expiry_age=4 * TP,
    )
    _over_dap(dap)
    leader, helper = dap.world.leader_store, dap.world.helper_store

    def batches(store: Any) -> set[int]:
        rows = store.batch_aggregates(dap.task_id, LEADER_SELECTED_BUCKETS, 2**63 - 1)
        return {a.bucket for a in rows}

    def gc(store: Any) -> None:
        horizon = now[0] - 4 * TP - dap.files.leader.max_clock_skew
        store.collect_garbage(dap.task_id, TP, horizon, None)

    # Two reports three hours old: batch B, short of the floor of 3.
    assert dap.upload(*(dap.report(1, NOW // TP - 3) for _ in range(2)))[0] == 200
    while dap.leader.run_once():
        pass
    (old,) = batches(leader)
    assert batches(helper) == {old}
    # Two hours on, the helper's GC runs first: B's reports there expired.
    now[0] = NOW + 2 * TP
    gc(helper)
    assert batches(helper) == set()
    # Three fresh reports: B is retired, they make a new batch of their own.
    fresh = NOW // TP + 1
    assert dap.upload(*(dap.report(v, fresh) for v in (0, 1, 1)))[0] == 200
    while dap.leader.run_once():
        pass
    young = batches(leader) - {old}
    assert len(young) == 1 and batches(helper) == young
    resp = _collected(dap, LS_REQUEST)
    assert resp.report_count == 3
    assert dap.vdaf.unshard(None, _agg_shares(dap, LS_REQUEST, resp), 3) == [1, 2, 0, 0]
    # The leader's GC takes B as the helper's did, and keeps the young one.
    gc(leader)
    assert batches(leader) == young
    (bucket,) = young
    assert leader.batch_of_bucket(dap.task_id, old) is None
    assert leader.batch_of_bucket(dap.task_id, bucket) is not None
