"""Secrets at rest and in logs, over a full run of real servers at debug level.

At rest: every file holding a secret (task files with the verify key, tokens
or the collector's HPKE private key; each aggregator's database with its HPKE
private key, and its WAL) is owner-only. In logs: no secret appears in the
servers' logs or in what the client and collector log, in any of the
encodings a careless log line would use (raw, hex, base64, base64url, repr).
"""

from __future__ import annotations

import base64
import logging
import secrets
import signal
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.deployment import start_deployment
from tests.support.reliability import TP, bucket, query, record
from tests.support.reports import forged_report
from veil.client import UploadError
from veil.collector import CollectionError
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]


def _forms(secret: bytes | str) -> set[bytes]:
    """How a secret could show up in a log line."""
    if isinstance(secret, str):
        return {secret.encode()}
    return {
        secret,
        secret.hex().encode(),
        secret.hex().upper().encode(),
        base64.b64encode(secret).rstrip(b"="),
        base64.urlsafe_b64encode(secret).rstrip(b"="),
        repr(secret)[2:-1].encode(),
    }


def _secrets(root: Path, dep: Any) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for name, files in dep.tasks.items():
        assert files.leader.verify_key and files.leader.aggregator_token
        assert files.collector.collector_token and files.collector.collector_hpke_keypair
        found[f"{name} verify key"] = files.leader.verify_key
        found[f"{name} aggregator token"] = files.leader.aggregator_token
        found[f"{name} collector token"] = files.collector.collector_token
        found[f"{name} collector HPKE key"] = files.collector.collector_hpke_keypair.private_key
    for role in ("leader", "helper"):
        for (sk,) in query(root / f"{role}.db", "SELECT private_key FROM hpke_keys"):
            found[f"{role} HPKE key {bytes(sk)[:2].hex()}"] = bytes(sk)
    return found


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_owner_only_and_never_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VEIL_LOG_LEVEL", "debug")
    caplog.set_level(logging.DEBUG)
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "plain": (VdafSpec("sum", max_measurement=10), DpSpec("none"), {"min_batch_size": 1}),
        "noisy": (VdafSpec("count"), DpSpec("geometric", epsilon="1"), {"min_batch_size": 3}),
    }
    # A 5 s lease: the leader killed below may hold a job, which its restart
    # (another driver) takes over only once the lease has run out.
    dep = start_deployment(tmp_path, tasks, metrics=True, lease_seconds=5.0)
    root = dep.local.root
    try:
        t = bucket(2)
        # A full run with its error paths: honest and forged reports, refused
        # uploads and collections, wrong tokens, a crash and a restart.
        client = dep.client("plain")
        client.upload_reports([*[client.build_report(v, t) for v in (1, 2, 3)],
                               forged_report(client, 4, t)])  # fmt: skip
        with pytest.raises(UploadError):
            client.upload(1, bucket(-24))
        dep.client("noisy").upload_batch([1, 0, 1, 1], report_time=t)
        wrong = replace(dep.tasks["plain"].collector, collector_token=secrets.token_urlsafe(32))
        with dep.collector("plain", wrong) as c, pytest.raises(CollectionError):
            c.collect(t, TP, wait=10)
        # Files while the servers run (the WAL files exist now).
        for role in ("leader", "helper"):
            for suffix in ("", "-wal", "-shm"):
                db = root / f"{role}.db{suffix}"
                if db.exists():
                    assert _mode(db) == 0o600, db
        dep.leader.stop(signal.SIGKILL)
        dep.leader.start()
        with dep.collector("plain") as c:
            assert c.collect(t, TP, wait=60).estimate == 6
        with dep.collector("noisy") as c:
            assert c.collect(t, TP, wait=60).report_count == 4
            with pytest.raises(CollectionError):
                c.collect(t, TP, wait=10)
        import urllib.request

        metrics = b""
        for server in (dep.leader, dep.helper):
            with urllib.request.urlopen(
                f"http://{server.metrics_address}/metrics", timeout=10
            ) as r:
                metrics += r.read()
    finally:
        dep.stop()

    secret_files = [p for p in root.iterdir() if p.suffix == ".toml" and ".client." not in p.name]
    secret_files = [p for p in secret_files if p.name not in ("leader.toml", "helper.toml")]
    secret_files += [p for p in root.iterdir() if ".db" in p.name]
    loose = {p.name: oct(_mode(p)) for p in secret_files if _mode(p) & 0o077}
    assert not loose, f"secret files readable by others: {loose}"

    found = _secrets(root, dep)
    logs = {p.name: p.read_bytes() for p in root.glob("*.log")}
    logs["client and collector (this process)"] = caplog.text.encode()
    logs["metrics"] = metrics
    assert sum(len(v) for v in logs.values()) > 1000  # there was something to scan
    leaks = [
        (what, where)
        for what, value in found.items()
        for where, text in logs.items()
        if any(form in text for form in _forms(value))
    ]
    record(
        "secrets",
        secrets_checked=len(found),
        encodings_per_secret=6,
        log_bytes_scanned=sum(len(v) for v in logs.values()),
        files_checked=len(secret_files),
        leaks=len(leaks),
    )
    assert not leaks, leaks
