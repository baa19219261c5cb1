"""TLS to both servers, each with its own CA; mTLS on the helper (leader→helper with a
client certificate); an aggregator posing as the other is refused."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.support.deployment import Server, free_port
from tests.support.tls import write_ca, write_server_cert
from veil.client import AsyncClient, Client, UploadError
from veil.collector import Collector
from veil.grpc_util import open_channel
from veil.hpke import ROLE_HELPER
from veil.local.launcher import ServerProcess
from veil.protocol.v1 import helper_pb2_grpc, messages_pb2
from veil.task import DpSpec, VdafSpec, new_task, write_toml
from veil.trust import TrustError, fingerprint

pytestmark = pytest.mark.slow


def _write(path: Path, cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name) -> None:
    write_server_cert(path.with_suffix(".pem"), path.with_suffix(".key"), cn, ca_key, ca_name)


def _server_config(
    tmp_path: Path, role: str, listen: str, cert: str, client_ca: str | None = None, **extra: Any
) -> ServerProcess:
    tls = {"cert": f"{cert}.pem", "key": f"{cert}.key"}
    if client_ca is not None:
        tls["client_ca"] = client_ca
    write_toml(
        tmp_path / f"{role}.toml",
        {
            "listen": listen,
            "storage": f"{role}.db",
            "tasks": [f"{role}.task.toml"],
            "tls": tls,
            # The tasks here publish exact sums (mechanism none).
            "allow_exact_release": True,
            **extra,
        },
        secret=False,
    )
    return Server(role, tmp_path / f"{role}.toml", tmp_path / f"{role}.log", listen)


def test_tls_and_mtls(tmp_path: Path) -> None:
    """Each organisation has its own CA; clients trust each for its aggregator only."""
    leader_ca_key, leader_ca = write_ca(tmp_path / "leader-ca.pem", "leader CA")
    helper_ca_key, helper_ca = write_ca(tmp_path / "helper-ca.pem", "helper CA")
    client_ca_key, client_ca = write_ca(tmp_path / "client-ca.pem", "client CA")
    _write(tmp_path / "leader", "leader", leader_ca_key, leader_ca.subject)
    _write(tmp_path / "helper", "helper", helper_ca_key, helper_ca.subject)
    for name in ("leader-client", "client"):
        _write(tmp_path / name, name, client_ca_key, client_ca.subject)

    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    files = new_task(
        VdafSpec("count"), leader_addr, helper_addr, min_batch_size=1, dp=DpSpec("none")
    )
    for role in ("leader", "helper"):
        write_toml(tmp_path / f"{role}.task.toml", getattr(files, role).to_dict(), secret=True)
    helper = _server_config(tmp_path, "helper", helper_addr, "helper", client_ca="client-ca.pem")
    leader = _server_config(
        tmp_path,
        "leader",
        leader_addr,
        "leader",
        helper_tls={"ca": "helper-ca.pem", "cert": "leader-client.pem", "key": "leader-client.key"},
        driver={"interval": 0.1},
    )
    pem = {name: (tmp_path / f"{name}.pem").read_bytes() for name in ("leader-ca", "helper-ca")}
    client_cert = {
        "private_key": (tmp_path / "client.key").read_bytes(),
        "certificate_chain": (tmp_path / "client.pem").read_bytes(),
    }
    trust = {
        "leader_root_certificates": pem["leader-ca"],
        "helper_root_certificates": pem["helper-ca"],
    }
    try:
        helper.start(root_certificates=pem["helper-ca"], **client_cert)
        leader.start(root_certificates=pem["leader-ca"])
        now = int(time.time())
        t = now - now % 3600 - 3600
        # Without a client certificate the helper (mTLS) refuses the client.
        with Client(files.client, retries=0, **trust) as plain:
            with pytest.raises(UploadError) as e:
                plain.upload(1, report_time=t)
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
        with Client(files.client, **trust, **client_cert) as client:
            assert client.upload_batch([1, 1, 0], report_time=t).accepted == 3

        async def upload_async() -> None:
            # The asyncio client: the same trust, the same refusal without a certificate.
            async with AsyncClient(files.client, retries=0, **trust) as plain:
                with pytest.raises(UploadError) as e:
                    await plain.upload(1, report_time=t)
                assert e.value.code == grpc.StatusCode.UNAVAILABLE
            async with AsyncClient(files.client, **trust, **client_cert) as client:
                assert (await client.upload_batch([1, 0], report_time=t)).accepted == 2

        asyncio.run(upload_async())
        with Collector(files.collector, leader_root_certificates=pem["leader-ca"]) as collector:
            r = collector.collect(t, 3600, wait=60)
        assert (r.report_count, r.estimate) == (5, 3)
    finally:
        for s in (leader, helper):
            s.stop()


def test_leader_cannot_pose_as_the_helper(tmp_path: Path) -> None:
    """Issue 13 item 2: with the leader's CA key one mints a certificate for the
    helper's address and runs a fake helper serving an attacker's HPKE key.
    Before, clients trusted one bundle for both aggregators and sealed the
    helper's share to the attacker; now each aggregator has its own trust,
    and the fake helper's certificate fails the handshake."""
    leader_ca_key, leader_ca = write_ca(tmp_path / "leader-ca.pem", "leader CA")
    _, helper_ca = write_ca(tmp_path / "helper-ca.pem", "helper CA")
    # The fake helper's certificate: signed with the leader's CA key, for 127.0.0.1.
    _write(tmp_path / "fake", "helper", leader_ca_key, leader_ca.subject)
    fake_addr = f"127.0.0.1:{free_port()}"
    files = new_task(
        VdafSpec("count"),
        f"127.0.0.1:{free_port()}",
        fake_addr,
        min_batch_size=1,
        dp=DpSpec("none"),
    )
    write_toml(tmp_path / "helper.task.toml", files.helper.to_dict(), secret=True)
    fake = _server_config(tmp_path, "helper", fake_addr, "fake")
    pem = {name: (tmp_path / f"{name}.pem").read_bytes() for name in ("leader-ca", "helper-ca")}
    try:
        fake.start(root_certificates=pem["leader-ca"])
        # The attack as it worked before: the fake helper's HPKE key was
        # fetched over a channel trusting the leader's CA for the helper.
        with open_channel(fake_addr, pem["leader-ca"]) as channel:
            stub = helper_pb2_grpc.HelperStub(channel)  # type: ignore[no-untyped-call]
            reply = stub.GetHpkeConfig(
                messages_pb2.HpkeConfigRequest(task_id=files.client.task_id), timeout=10
            )
            assert reply.configs
        # Separate trust: the client never gets the attacker's key.
        with Client(
            files.client,
            leader_root_certificates=pem["leader-ca"],
            helper_root_certificates=pem["helper-ca"],
            retries=0,
            timeout=5,
        ) as client:
            with pytest.raises(UploadError) as e:
                client.hpke_config(ROLE_HELPER)
            assert e.value.code == grpc.StatusCode.UNAVAILABLE

        async def fetch_async() -> None:
            async with AsyncClient(
                files.client,
                leader_root_certificates=pem["leader-ca"],
                helper_root_certificates=pem["helper-ca"],
                retries=0,
                timeout=5,
            ) as client:
                with pytest.raises(UploadError) as e:
                    await client.hpke_config(ROLE_HELPER)
                assert e.value.code == grpc.StatusCode.UNAVAILABLE

        asyncio.run(fetch_async())
        # One bundle for both aggregators is refused before any connection.
        both = pem["leader-ca"] + pem["helper-ca"]
        with pytest.raises(TrustError, match="either could pose as the other"):
            Client(files.client, leader_root_certificates=both, helper_root_certificates=both)
        with pytest.raises(TrustError, match="either could pose as the other"):
            AsyncClient(files.client, leader_root_certificates=both, helper_root_certificates=both)
        # A task that pins the helper's CA refuses any other certificate for it.
        pinned = replace(files.client, helper_ca_sha256=fingerprint(helper_ca))
        with pytest.raises(TrustError, match="not the CA its task pins"):
            Client(
                pinned,
                leader_root_certificates=pem["helper-ca"],
                helper_root_certificates=pem["leader-ca"],
            )
    finally:
        fake.stop()
