"""A task file added to a running server's config is served after SIGHUP,
without a restart; until then the refusal says how to load it. A served
task whose file changed is not reloaded (task parameters are immutable)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from veil.aggregator.local import ServerProcess, free_port
from veil.client import Client, UploadError
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task, write_toml

pytestmark = pytest.mark.slow


def write_configs(tmp: Path, leader: str, helper: str, names: list[str]) -> None:
    for role, listen in (("leader", leader), ("helper", helper)):
        write_toml(
            tmp / f"{role}.toml",
            {
                "listen": listen,
                "storage": f"{role}.db",
                "tasks": [f"{n}.{role}.toml" for n in names],
            },
            secret=False,
        )


def test_sighup_serves_added_tasks(tmp_path: Path) -> None:
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    files: dict[str, TaskFiles] = {}
    for name in ("first", "added"):
        files[name] = new_task(
            VdafSpec("count"), leader, helper, min_batch_size=1, dp=DpSpec("geometric", "1")
        )
        for role in ("leader", "helper"):
            task = getattr(files[name], role)
            write_toml(tmp_path / f"{name}.{role}.toml", task.to_dict(), secret=True)
    write_configs(tmp_path, leader, helper, ["first"])
    servers = [
        ServerProcess(role, tmp_path / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    try:
        for server in servers:
            server.start()
        with (
            Client(files["added"].client, retries=0) as client,
            pytest.raises(UploadError, match=r"SIGHUP \(kill -HUP <pid>\)") as refused,
        ):
            client.upload(1)
        # The task id as task files spell it (base64url), not in hex.
        assert files["added"].client.id_text in str(refused.value)
        write_configs(tmp_path, leader, helper, ["first", "added"])
        for server in servers:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while True:
            try:
                with Client(files["added"].client, retries=0) as client:
                    assert client.upload(1).accepted == 1
                break
            except UploadError:
                assert time.monotonic() < deadline, (tmp_path / "leader.log").read_text()[-2000:]
                time.sleep(0.2)
        # The first task is served as before, by the same processes.
        with Client(files["first"].client, retries=0) as client:
            assert client.upload(0).accepted == 1
        assert all(s.proc is not None and s.proc.poll() is None for s in servers)
        assert "SIGHUP: 1 new task(s) served" in (tmp_path / "leader.log").read_text()
    finally:
        for server in servers:
            server.stop()
