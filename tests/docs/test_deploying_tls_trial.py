"""docs/DEPLOYING.md's one-machine TLS trial, run as written: each organisation's CA,
`veil survey deploy` pinning both, leaf certificates with IP SANs. Then both
servers start from the written configs and a client that trusts each CA for
its own aggregator only reaches both over TLS (issue 13, item 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.support.docs import section_blocks
from veil.client import Client
from veil.hpke import ROLE_HELPER, ROLE_LEADER
from veil.local.launcher import ServerProcess, free_port
from veil.task import load_task
from veil.trust import TrustError, fingerprint

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def tls_trial() -> str:
    """The document's shell block that deploys with pinned CAs."""
    blocks = section_blocks(
        "docs/DEPLOYING.md", "Deploying a survey across two organisations", "sh"
    )
    found = [b.code for b in blocks if "--leader-ca leader-ca.crt" in b.code]
    assert len(found) == 1 and "openssl req" in found[0], "the TLS trial block is missing"
    return found[0]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_trial_runs_as_written(tmp_path: Path) -> None:
    leader_addr, helper_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    script = tls_trial()
    assert "127.0.0.1:7001" in script and "127.0.0.1:7002" in script
    script = script.replace("127.0.0.1:7001", leader_addr).replace("127.0.0.1:7002", helper_addr)
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "survey.toml", tmp_path / "examples" / "survey.toml")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    # The block runs in its own directory (it writes the CAs' private keys).
    trial = tmp_path / "trial"
    out = trial / "deployment"
    # Nothing beside it: in a checkout, the keys stay under the ignored trial/.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["examples", "trial"]
    cas = {}
    for role in ("leader", "helper"):
        ca = x509.load_pem_x509_certificate((trial / f"{role}-ca.crt").read_bytes())
        leaf = x509.load_pem_x509_certificate((out / role / "tls" / f"{role}.crt").read_bytes())
        cas[role] = ca
        assert leaf.issuer == ca.subject
        assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).critical
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    task = load_task(out / "client" / "remote.toml")
    assert task.leader_ca_sha256 == fingerprint(cas["leader"])
    assert task.helper_ca_sha256 == fingerprint(cas["helper"])
    pem = {r: (out / "client" / f"{r}-ca.pem").read_bytes() for r in ("leader", "helper")}
    assert (out / "leader" / "tls" / "helper-ca.crt").read_bytes() == pem["helper"]
    # Listen on loopback only in the test (the deployment listens on 0.0.0.0).
    servers = []
    for role, addr in (("helper", helper_addr), ("leader", leader_addr)):
        config = out / role / f"{role}.toml"
        config.write_text(config.read_text().replace("0.0.0.0:", "127.0.0.1:"))
        servers.append(ServerProcess(role, config, tmp_path / f"{role}.log", addr))
    try:
        for s, role in zip(servers, ("helper", "leader"), strict=True):
            s.start(root_certificates=pem[role])
        with Client(
            task, leader_root_certificates=pem["leader"], helper_root_certificates=pem["helper"]
        ) as client:
            assert client.hpke_config(ROLE_LEADER) != client.hpke_config(ROLE_HELPER)
        # The pins refuse the CAs swapped, before any connection.
        with pytest.raises(TrustError, match="not the CA its task pins"):
            Client(
                task,
                leader_root_certificates=pem["helper"],
                helper_root_certificates=pem["leader"],
            )
    finally:
        for s in servers:
            s.stop()
