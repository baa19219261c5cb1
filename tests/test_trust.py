"""Separate trust per aggregator (veil.trust): one certificate trusted for both,
a CA the task does not pin, malformed PEM and the retired `--ca` are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from tests.support.tls import new_ca, pem
from veil.cli import main
from veil.collector import Collector
from veil.task import DpSpec, TaskError, VdafSpec, load_task, new_task, write_toml
from veil.trust import TrustError, check_roots, fingerprint, normalise_fingerprint

_, LEADER_CA = new_ca("leader CA")
_, HELPER_CA = new_ca("helper CA")
LEADER_PEM = LEADER_CA.public_bytes(serialization.Encoding.PEM)
HELPER_PEM = HELPER_CA.public_bytes(serialization.Encoding.PEM)


def test_separate_roots_accepted() -> None:
    check_roots(LEADER_PEM, HELPER_PEM)
    check_roots(LEADER_PEM, HELPER_PEM, fingerprint(LEADER_CA), fingerprint(HELPER_CA))
    check_roots(None, None)


def test_one_certificate_for_both_refused() -> None:
    both = LEADER_PEM + HELPER_PEM
    with pytest.raises(TrustError, match="either could pose as the other"):
        check_roots(both, both)
    with pytest.raises(TrustError, match="either could pose as the other"):
        check_roots(LEADER_PEM, HELPER_PEM + LEADER_PEM)


def test_pins() -> None:
    with pytest.raises(TrustError, match="give that certificate"):
        check_roots(None, HELPER_PEM, fingerprint(LEADER_CA))
    with pytest.raises(TrustError, match="not the CA its task pins"):
        check_roots(HELPER_PEM, LEADER_PEM, fingerprint(LEADER_CA))
    # The pinned CA plus another one is not the pinned CA.
    with pytest.raises(TrustError, match="not the CA its task pins"):
        check_roots(LEADER_PEM + pem(new_ca("x")[1]),
                    None, fingerprint(LEADER_CA))  # fmt: skip


@pytest.mark.parametrize(
    "pem",
    [b"", b"not a certificate", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"],
)
def test_malformed_pem_refused(pem: bytes) -> None:
    with pytest.raises(TrustError, match="the leader's root certificates"):
        check_roots(pem, HELPER_PEM)


def test_fingerprint_spellings() -> None:
    fp = fingerprint(LEADER_CA)
    openssl = "SHA256:" + ":".join(fp[i : i + 2] for i in range(0, 64, 2)).upper()
    assert normalise_fingerprint(openssl) == fp
    for bad in ("", "abc", fp[:-1] + "g", fp + "00"):
        with pytest.raises(TrustError):
            normalise_fingerprint(bad)


def test_task_file_pins(tmp_path: Path) -> None:
    files = new_task(
        VdafSpec("count"),
        "127.0.0.1:1",
        "127.0.0.1:2",
        min_batch_size=1,
        dp=DpSpec("none"),
        leader_ca_sha256=fingerprint(LEADER_CA),
        helper_ca_sha256=fingerprint(HELPER_CA).upper(),
    )
    write_toml(tmp_path / "c.toml", files.client.to_dict(), secret=False)
    task = load_task(tmp_path / "c.toml")
    assert (task.leader_ca_sha256, task.helper_ca_sha256) == (
        fingerprint(LEADER_CA),
        fingerprint(HELPER_CA),
    )
    # A pinned task refuses plaintext even on loopback: no certificate, no channel.
    with pytest.raises(TrustError, match="pins the leader's CA"):
        Collector(files.collector)
    d = files.client.to_dict()
    d["helper_ca_sha256"] = "zz"
    write_toml(tmp_path / "bad.toml", d, secret=False)
    with pytest.raises(TaskError, match="helper_ca_sha256"):
        load_task(tmp_path / "bad.toml")
    d["helper_ca_sha256"] = d["leader_ca_sha256"]
    write_toml(tmp_path / "same.toml", d, secret=False)
    with pytest.raises(TaskError, match="pin the same certificate"):
        load_task(tmp_path / "same.toml")


def test_cli_refuses_shared_and_bad_trust(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none")
    )
    write_toml(tmp_path / "client.toml", files.client.to_dict(), secret=False)
    write_toml(tmp_path / "collector.toml", files.collector.to_dict(), secret=True)
    (tmp_path / "both.pem").write_bytes(LEADER_PEM + HELPER_PEM)
    (tmp_path / "junk.pem").write_text("junk")
    client, collector = str(tmp_path / "client.toml"), str(tmp_path / "collector.toml")
    both, junk = str(tmp_path / "both.pem"), str(tmp_path / "junk.pem")
    cases = [
        (["upload", "--task", client, "--ca", both, "1"], "veil upload: --ca is gone"),
        (["collect", "--task", collector, "--ca", both], "veil collect: --ca is gone"),
        (
            ["survey", "respond", "--survey-dir", str(tmp_path), "--ca", both],
            "veil survey respond: --ca is gone",
        ),
        (
            ["survey", "collect", "--survey-dir", str(tmp_path), "--out", junk, "--ca", both],
            "veil survey collect: --ca is gone",
        ),
        (
            ["upload", "--task", client, "--leader-ca", both, "--helper-ca", both, "1"],
            "veil upload: the same certificate is trusted for the leader and for the helper",
        ),
        (["upload", "--task", client, "--leader-ca", junk, "1"], "veil upload: the leader's"),
        (["collect", "--task", collector, "--leader-ca", junk], "veil collect: the leader's"),
        (
            ["upload", "--task", client, "--helper-ca", str(tmp_path / "missing.pem"), "1"],
            "veil upload: [Errno 2]",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, (argv, err)


def test_plaintext_only_on_loopback() -> None:
    """What held up in issue 13's review: no plaintext channel leaves loopback."""
    from veil.grpc_util import is_loopback, open_channel

    for address in ("10.0.0.1:443", "leader.example.org:443", "[2001:db8::1]:443"):
        assert not is_loopback(address)
        with pytest.raises(ValueError, match="refusing plaintext"):
            open_channel(address, insecure=True)
    for address in ("127.0.0.1:1", "localhost:1", "[::1]:1"):
        assert is_loopback(address)
