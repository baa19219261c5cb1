"""A veil helper serving one DAP task, its routes called in process
(veil.aggregator.run.dap_helper_http over a real Helper and its SQLite
store), and the leader's side of a Prio3 aggregation job written from the
draft's text (draft-ietf-ppm-dap section 4.5.2.1 with the VDAF's ping-pong
of section 5.7): the leader opens its own share, runs its verify_init under
the context ``"dap-19" || task_id`` and sends its verifier share in an
`initialize` message; on the helper's `finish` it runs verify_next."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.support.backends import Backend
from tests.support.in_process import NOW, TP, World
from veil.aggregator.run.dap_helper_http import dap_helper_app
from veil.dap.jobs import (
    AggregateShareReq,
    AggregationJobInitReq,
    AggregationJobResp,
    BatchSelector,
    CollectionJobReq,
    Query,
    ReportShare,
    VerifyInit,
    VerifyRespType,
)
from veil.dap.messages import BatchMode, Interval, Report, batch_checksum
from veil.dap.pingpong import MessageType, PingPong, initialize
from veil.dap.report import prepare_report
from veil.dap.shares import open_aggregate_share, open_input_share
from veil.dap.versions import DapVersion, Role, vdaf_context
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task

MAX_BODY = 256 * 1024
INIT = "application/ppm-dap;message=aggregation-job-init-req"
CONTINUE = "application/ppm-dap;message=aggregation-job-continue-req"
SHARE_REQ = "application/ppm-dap;message=aggregate-share-req"
# The report time the tests use, in the task's time precision.
TIME = NOW // TP - 1


def dap_files(
    version: DapVersion,
    min_batch_size: int = 2,
    batch_mode: str = "time-interval",
    dp: DpSpec | None = None,
) -> TaskFiles:
    return new_task(
        VdafSpec("histogram", length=4, chunk_length=2),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=min_batch_size,
        dp=dp or DpSpec("none"),
        dap=DapSpec(
            "https://leader.example/",
            "https://helper.example/",
            version.value,
            "t",
            batch_mode=batch_mode,
        ),
    )


class DapHelper:
    """A helper serving one DAP Histogram(4) task (no DP), with the leader's
    side of its jobs."""

    def __init__(
        self,
        tmp_path: Path,
        version: DapVersion = DapVersion.DAP_19,
        batch_mode: str = "time-interval",
        backend: Backend | None = None,
        dp: DpSpec | None = None,
    ) -> None:
        self.version = version
        self.files = dap_files(version, batch_mode=batch_mode, dp=dp)
        self.world = World(backend or Backend(tmp_path, None), self.files)
        self.helper = self.world.helper
        self.app = dap_helper_app(self.helper.dap, MAX_BODY)
        task = self.files.leader
        self.task = task
        self.task_id = task.task_id
        self.tasks = f"/tasks/{task.id_text}"
        self.config = task.dap_configuration()
        self.vdaf = task.vdaf.instantiate()
        self.context = vdaf_context(version, self.task_id)
        self.auth = {"authorization": f"Bearer {task.aggregator_token}"}
        # Each report's leader state, by report id.
        self.states: dict[bytes, Any] = {}

    def report(self, value: int, time: int = TIME, **kw: Any) -> Report:
        return prepare_report(
            self.version,
            self.task_id,
            self.config,
            self.vdaf,
            value,
            time,
            self.world.leader.current_config,
            self.helper.current_config,
            **kw,
        )

    def verify_init(self, report: Report) -> VerifyInit:
        """The leader's VerifyInit of `report` (its state kept)."""
        meta = report.metadata
        keypair = self.world.leader.keys.keypair(report.leader_encrypted_input_share.config_id)
        assert keypair is not None
        share = open_input_share(
            self.version,
            keypair,
            Role.LEADER,
            self.task_id,
            self.config,
            meta,
            report.public_share,
            report.leader_encrypted_input_share,
        )
        vdaf = self.vdaf
        state, verifier_share = vdaf.verify_init(
            self.task.verify_key,
            self.context,
            0,
            None,
            meta.report_id,
            vdaf.decode_public_share(report.public_share),
            vdaf.decode_input_share(0, share.payload),
        )
        self.states[meta.report_id] = state
        return VerifyInit(
            ReportShare(meta, report.public_share, report.helper_encrypted_input_share),
            initialize(vdaf.encode_verifier_share(verifier_share)),
        )

    def init_req(self, *reports: Report, **kw: Any) -> bytes:
        fields: dict[str, Any] = {"verification_key_id": 0, "agg_param": b"", "extensions": ()}
        fields.update(kw)
        inits = tuple(self.verify_init(r) for r in reports)
        return AggregationJobInitReq(verify_inits=inits, **fields).encode()

    def out_shares(self, body: bytes) -> dict[bytes, list[int]]:
        """The leader's output share of each report the helper continued."""
        out = {}
        for resp in AggregationJobResp.decode(body, self.version).verify_resps:
            if resp.type is not VerifyRespType.CONTINUE:
                continue
            message = PingPong.decode(resp.payload)
            assert message.type is MessageType.FINISH
            state = self.states[resp.report_id]
            decoded = self.vdaf.decode_verifier_message(state, message.verifier_message)
            out[resp.report_id] = self.vdaf.verify_next(self.context, state, decoded)
        return out

    def collection(self, start: int = TIME, duration: int = 1) -> CollectionJobReq:
        return CollectionJobReq(Query(BatchMode.TIME_INTERVAL, Interval(start, duration)))

    def share_req(
        self,
        ids: list[bytes],
        request: CollectionJobReq | None = None,
        count: int | None = None,
        batch_id: bytes | None = None,
    ) -> bytes:
        """An AggregateShareReq of the batch of `ids`: the collection's
        interval, or the leader-selected batch `batch_id` (the query empty)."""
        if batch_id is not None:
            request = request or CollectionJobReq(Query(BatchMode.LEADER_SELECTED))
            selector = BatchSelector(BatchMode.LEADER_SELECTED, batch_id=batch_id)
        else:
            request = request or self.collection()
            assert request.query.batch_interval is not None
            selector = BatchSelector(BatchMode.TIME_INTERVAL, request.query.batch_interval)
        return AggregateShareReq(
            request, selector, len(ids) if count is None else count, batch_checksum(ids)
        ).encode()

    def open_share(self, ciphertext: Any, request: CollectionJobReq | None = None) -> list[int]:
        plain = open_aggregate_share(
            self.version,
            self.files.collector.collector_hpke_keypair,
            Role.HELPER,
            self.task_id,
            self.config,
            request or self.collection(),
            ciphertext,
        )
        return self.vdaf.decode_agg_share(None, plain)

    def call(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        return asyncio.run(asgi(self.app, method, path, body, headers or {}))

    def post(
        self, path: str, body: bytes, content_type: str, auth: bool = True
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"content-type": content_type, **(self.auth if auth else {})}
        return self.call("POST", self.tasks + path, body, headers)

    def seen(self, reports: list[Report]) -> set[bytes]:
        return self.world.helper_store.seen_reports(
            self.task_id, [r.metadata.report_id for r in reports]
        )


async def asgi(
    app: Any, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request through an ASGI application (what uvicorn does)."""
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
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


def problem(response: tuple[int, dict[str, str], bytes], status: int, kind: str) -> dict[str, Any]:
    """The problem document of `response`, checked to be `kind` with `status`."""
    got_status, headers, body = response
    assert got_status == status, body
    assert headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = json.loads(body)
    assert doc["status"] == status
    assert doc["type"] == (
        "about:blank" if kind == "about:blank" else f"urn:ietf:params:ppm:dap:error:{kind}"
    )
    return doc
