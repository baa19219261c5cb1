"""A task file added to a running server's config is served after SIGHUP,
without a restart; until then the refusal says how to load it. A served
task whose file changed beyond its window is not reloaded (a task's other
parameters are immutable; its window: test_survey_lifecycle.py)."""

from __future__ import annotations

import secrets
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from veil.client import Client, UploadError
from veil.local.launcher import ServerProcess, free_port
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task, write_toml

pytestmark = pytest.mark.slow


def write_tasks(tmp: Path, leader: str, helper: str) -> dict[str, TaskFiles]:
    """Two Count tasks, "first" and "added", each as a leader and a helper file."""
    files: dict[str, TaskFiles] = {}
    for name in ("first", "added"):
        files[name] = new_task(
            VdafSpec("count"), leader, helper, min_batch_size=1, dp=DpSpec("geometric", "1")
        )
        for role in ("leader", "helper"):
            task = getattr(files[name], role)
            write_toml(tmp / f"{name}.{role}.toml", task.to_dict(), secret=True)
    return files


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
    files = write_tasks(tmp_path, leader, helper)
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
        # ... and aggregated by the leader's driver, which sizes its jobs. Its
        # first job waits for the field kernels, loaded in turn with every
        # other process of the installation (veil.vdaf.batch.kernels): beside
        # two CPU-bound processes and another suite, 25 s passed before the
        # leader's first call to the helper. An honest margin of its own.
        from veil.aggregator.store.records import AGGREGATED

        deadline = time.monotonic() + 120
        while True:
            with sqlite3.connect(tmp_path / "leader.db") as db:
                done = db.execute(
                    "SELECT COUNT(*) FROM reports WHERE task_id = ? AND state = ?",
                    (files["added"].client.task_id, AGGREGATED),
                ).fetchone()[0]
            if done == 1:
                break
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


@pytest.mark.postgres
def test_sighup_reaches_aggregation_workers(tmp_path: Path, postgres_server: str) -> None:
    """A leader front end without a driver, one `veil worker` (both on
    PostgreSQL) and the helper: after SIGHUP to all three, a task added to the
    configs is aggregated."""
    from bench.postgres import as_url, with_schema
    from veil.aggregator.store.postgres import PostgresDatastore

    leader_db = with_schema(postgres_server, f"leader_{secrets.token_hex(4)}")

    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    files = write_tasks(tmp_path, leader, helper)

    def configs(names: list[str]) -> None:
        write_configs(tmp_path, leader, helper, names)
        text = (
            (tmp_path / "leader.toml").read_text().replace('"leader.db"', repr(as_url(leader_db)))
        )
        (tmp_path / "leader.toml").write_text(text + "\n[driver]\nenabled = false\n")

    configs(["first"])
    helper_p = ServerProcess("helper", tmp_path / "helper.toml", tmp_path / "helper.log", helper)
    leader_p = ServerProcess("leader", tmp_path / "leader.toml", tmp_path / "leader.log", leader)
    worker = ServerProcess("leader", tmp_path / "leader.toml", tmp_path / "worker.log", leader)
    processes = [helper_p, leader_p, worker]
    try:
        helper_p.start()
        leader_p.start()
        worker.start_worker()
        # A process takes SIGHUP once its handlers are installed (before, the
        # signal's default action ends it): a server before it reports
        # SERVING, which start() waited for, and a worker before it says it
        # started.
        deadline = time.monotonic() + 60
        while "started" not in (tmp_path / "worker.log").read_text():
            assert time.monotonic() < deadline and worker.proc is not None
            assert worker.proc.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        configs(["first", "added"])
        for p in processes:
            assert p.proc is not None
            p.proc.send_signal(signal.SIGHUP)
        added = files["added"].client
        # Each process takes the reload in its main thread at once (the
        # field kernels load in another), then the worker aggregates, which
        # waits for its kernels: on a loaded machine with numba's cache cold,
        # behind every other process's turn at the cache lock. An honest
        # margin for both.
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(added, retries=0) as client:
                    client.upload_batch([1, 0, 1])
                break
            except UploadError:
                assert time.monotonic() < deadline, (tmp_path / "leader.log").read_text()[-2000:]
                time.sleep(0.2)
        store = PostgresDatastore(leader_db, pool_size=1)
        try:
            while store.has_unaggregated(added.task_id, 0, 2**62):
                assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()[-2000:]
                time.sleep(0.2)
        finally:
            store.close()
        assert "SIGHUP: 1 new task(s) served" in (tmp_path / "worker.log").read_text()
    finally:
        for p in processes:
            p.stop()
