"""`veil survey deploy`: permissions, refusal to overwrite, and a deployment
that really runs (plaintext on loopback) from the written files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from veil.aggregator.local import ServerProcess, free_port
from veil.client import Client
from veil.collector import Collector
from veil.deploy import DeployError, deploy_survey
from veil.survey import parse_survey
from veil.task import load_task

SURVEY = """\
[survey]
name = "deploy test"
epsilon = 1
mechanism = "none"
min_batch_size = 5

[[question]]
id = "likes"
kind = "yes_no"

[[question]]
id = "score"
kind = "integer"
max = 10
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_are_owner_only_except_client(tmp_path: Path) -> None:
    survey = parse_survey(SURVEY)
    dep = deploy_survey(survey, SURVEY, tmp_path / "out", "a.example:443", "b.example:443")
    for party in ("leader", "helper", "collector"):
        assert mode(tmp_path / "out" / party) == 0o700
        for f in (tmp_path / "out" / party).rglob("*"):
            assert mode(f) == (0o700 if f.is_dir() else 0o600), f
    for f in dep.client_dir.iterdir():
        assert mode(f) == 0o644
        task = load_task(f)
        assert task.verify_key is None and task.collector_hpke_keypair is None
    assert load_task(dep.collector_dir / "likes.toml").collector_hpke_keypair is not None
    assert "[tls]" in dep.leader_config.read_text()


def test_refuses_existing_directory_and_bad_addresses(tmp_path: Path) -> None:
    survey = parse_survey(SURVEY)
    (tmp_path / "taken").mkdir()
    with pytest.raises(DeployError, match="already exists"):
        deploy_survey(survey, SURVEY, tmp_path / "taken", "a:1", "b:2")
    with pytest.raises(DeployError, match="host:port"):
        deploy_survey(survey, SURVEY, tmp_path / "new", "a", "b:2")
    assert not (tmp_path / "new").exists()


def test_written_deployment_runs(tmp_path: Path) -> None:
    survey = parse_survey(SURVEY)
    leader_addr = f"127.0.0.1:{free_port()}"
    helper_addr = f"127.0.0.1:{free_port()}"
    dep = deploy_survey(
        survey, SURVEY, tmp_path / "out", leader_addr, helper_addr, tls=False, time_precision=60
    )
    servers = [
        ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper_addr),
        ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader_addr),
    ]
    try:
        for s in servers:
            s.start()
        with Client(load_task(dep.client_dir / "score.toml")) as client:
            t = client.report_time()
            client.upload_batch([1, 2, 3, 4, 10], t)
        with Collector(load_task(dep.collector_dir / "score.toml")) as collector:
            result = collector.collect(t, 60, wait=60)
        assert result.report_count == 5 and result.estimate == 20
    finally:
        for s in servers:
            s.stop()
