"""A `veil leader` process serving DAP over HTTP on loopback beside gRPC
([dap] listen): a DAP client fetches its HPKE config list and uploads
reports, which the leader stores; hostile requests (another media type, a
truncated body, an unknown task, a replayed report id) are answered with
DAP's problem documents or ReportErrors and store nothing."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.tls import write_ca, write_server_cert
from veil.aggregator.run.backend import open_backend
from veil.aggregator.run.config import load_config
from veil.dap.messages import HpkeConfigList, ReportUploadStatus, UploadErrors, UploadRequest
from veil.dap.report import prepare_report
from veil.dap.versions import DapVersion, ReportError
from veil.hpke import generate_keypair
from veil.local.launcher import ServerProcess, free_port
from veil.task import DapSpec, DpSpec, VdafSpec, new_task, write_toml

UPLOAD = "application/ppm-dap;message=upload-req"


def _request(
    trust: ssl.SSLContext | None,
    url: str,
    body: bytes | None = None,
    content_type: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if content_type is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=30, context=trust) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_leader_serves_dap_uploads_on_loopback(tmp_path: Path, tls: bool) -> None:
    dap_address = f"127.0.0.1:{free_port()}"
    scheme = "https" if tls else "http"
    files = new_task(
        VdafSpec("count"),
        f"127.0.0.1:{free_port()}",
        f"127.0.0.1:{free_port()}",
        min_batch_size=2,
        dp=DpSpec("none"),
        dap=DapSpec(f"{scheme}://{dap_address}/", "https://helper.example/", task_info="loopback"),
    )
    write_toml(tmp_path / "task.leader.toml", files.leader.to_dict(), secret=True)
    config: dict[str, Any] = {
        "listen": files.leader.leader_address,
        "storage": "leader.db",
        "tasks": ["task.leader.toml"],
        "allow_exact_release": True,
        "dap": {"listen": dap_address},
    }
    start: dict[str, Any] = {}
    trust = None
    if tls:
        # The same certificate serves gRPC and DAP's HTTPS.
        ca_key, ca_cert = write_ca(tmp_path / "ca.pem", "leader-ca")
        write_server_cert(
            tmp_path / "leader.pem", tmp_path / "leader.key", "localhost", ca_key, ca_cert.subject
        )
        config["tls"] = {"cert": "leader.pem", "key": "leader.key"}
        start["root_certificates"] = (tmp_path / "ca.pem").read_bytes()
        trust = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    write_toml(tmp_path / "leader.toml", config, secret=False)
    leader = ServerProcess(
        "leader", tmp_path / "leader.toml", tmp_path / "leader.log", files.leader.leader_address
    )
    leader.start(**start)
    try:
        base = f"{scheme}://{dap_address}"
        status, headers, body = _request(trust, f"{base}/hpke_config")
        assert status == 200
        assert headers["content-type"] == "application/ppm-dap;message=hpke-config-list"
        leader_config = HpkeConfigList.decode(body).first_supported()
        assert leader_config is not None

        task = files.client
        version = DapVersion.DAP_19
        helper_config = generate_keypair(1).config  # the helper is not asked here
        now = int(time.time()) // task.time_precision

        def report(value: int, report_id: bytes | None = None) -> bytes:
            return prepare_report(
                version,
                task.task_id,
                task.dap_configuration(),
                task.vdaf.instantiate(),
                value,
                now,
                leader_config,
                helper_config,
                report_id=report_id,
            ).encode()

        uploads = f"{base}/tasks/{task.id_text}/reports"
        first, second = report(1), report(0)
        assert _request(trust, uploads, first + second, UPLOAD)[:1] == (200,)

        # Hostile requests: each refused, nothing stored.
        status, headers, body = _request(trust, uploads, report(1), "application/octet-stream")
        assert status == 415 and json.loads(body)["type"].endswith(":invalidMessage")
        status, headers, body = _request(trust, uploads, first[:-3], UPLOAD)
        assert status == 400 and json.loads(body)["type"].endswith(":invalidMessage")
        unknown = f"{base}/tasks/{'A' * 43}/reports"
        status, headers, body = _request(trust, unknown, report(1), UPLOAD)
        assert status == 404 and json.loads(body)["type"].endswith(":unrecognizedTask")
        replay_id = UploadRequest.decode(first).reports[0].metadata.report_id
        status, headers, body = _request(trust, uploads, report(0, replay_id), UPLOAD)
        assert status == 200
        assert headers["content-type"] == "application/ppm-dap;message=upload-errors"
        assert UploadErrors.decode(body, version).statuses == (
            ReportUploadStatus(replay_id, ReportError.REPORT_REPLAYED),
        )

        backend = open_backend(load_config(tmp_path / "leader.toml"), create=False)
        try:
            assert backend.store.unaggregated_count(task.task_id, 0, 2**63 - 1) == 2
        finally:
            backend.close()
        line = b"DAP over HTTPS on" if tls else b"DAP over HTTP on"
        assert line in (tmp_path / "leader.log").read_bytes()
    finally:
        leader.stop()
