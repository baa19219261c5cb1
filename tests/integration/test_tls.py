"""TLS to both servers, mTLS on the helper (leader→helper with a client certificate)."""

from __future__ import annotations

import datetime
import ipaddress
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.integration.deployment import Server, free_port
from veil.client import Client, UploadError
from veil.collector import Collector
from veil.task import DpSpec, VdafSpec, new_task, write_toml

pytestmark = pytest.mark.slow


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert(cn, key, ca_name, ca_key, ca=False)
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def test_tls_and_mtls(tmp_path: Path) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("veil test CA", ca_key, _name("veil test CA"), ca_key, ca=True)
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name in ("leader", "helper", "leader-client", "client"):
        _write(tmp_path / name, name, ca_key, ca.subject)

    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    files = new_task(VdafSpec("count"), leader_addr, helper_addr, dp=DpSpec("none"))
    for role in ("leader", "helper"):
        write_toml(tmp_path / f"{role}.task.toml", getattr(files, role).to_dict(), secret=True)
    write_toml(
        tmp_path / "helper.toml",
        {
            "listen": helper_addr,
            "storage": "helper.db",
            "tasks": ["helper.task.toml"],
            "tls": {"cert": "helper.pem", "key": "helper.key", "client_ca": "ca.pem"},
        },
        secret=False,
    )
    write_toml(
        tmp_path / "leader.toml",
        {
            "listen": leader_addr,
            "storage": "leader.db",
            "tasks": ["leader.task.toml"],
            "tls": {"cert": "leader.pem", "key": "leader.key"},
            "helper_tls": {"ca": "ca.pem", "cert": "leader-client.pem", "key": "leader-client.key"},
            "driver": {"interval": 0.1},
        },
        secret=False,
    )
    servers = [
        Server("helper", tmp_path / "helper.toml", tmp_path / "helper.log", helper_addr),
        Server("leader", tmp_path / "leader.toml", tmp_path / "leader.log", leader_addr),
    ]
    ca_pem = (tmp_path / "ca.pem").read_bytes()
    try:
        for s in servers:
            s.start(
                root_certificates=ca_pem,
                private_key=(tmp_path / "client.key").read_bytes(),
                certificate_chain=(tmp_path / "client.pem").read_bytes(),
            )
        now = int(time.time())
        t = now - now % 3600 - 3600
        # Without a client certificate the helper (mTLS) refuses the client.
        with Client(files.client, root_certificates=ca_pem, retries=0) as plain:
            with pytest.raises(UploadError) as e:
                plain.upload(1, report_time=t)
            assert e.value.code == grpc.StatusCode.UNAVAILABLE
        with Client(
            files.client,
            root_certificates=ca_pem,
            private_key=(tmp_path / "client.key").read_bytes(),
            certificate_chain=(tmp_path / "client.pem").read_bytes(),
        ) as client:
            assert client.upload_batch([1, 1, 0], report_time=t).accepted == 3
        with Collector(files.collector, root_certificates=ca_pem) as collector:
            r = collector.collect(t, 3600, wait=60)
        assert (r.report_count, r.estimate) == (3, 2)
    finally:
        for s in servers:
            s.stop()
