"""A real leader and helper, each in its own process, on 127.0.0.1 with free ports.

Tests build the task files with `veil.task.new_task`, write both servers'
configs, start `python -m veil.cli leader|helper --config ...` and always stop
them (a fixture's `finally`). Network traffic only ever goes to loopback.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from veil.client import Client
from veil.collector import Collector
from veil.task import DpSpec, Task, TaskFiles, VdafSpec, new_task, write_toml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    role: str
    config: Path
    log: Path
    address: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "veil.cli", self.role, "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.role} exited: {self.log.read_text()[-2000:]}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.role} did not become healthy: {self.log.read_text()}"
                    )
                time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Stop the process (SIGTERM: graceful; SIGKILL: crash). Returns its exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()
        return proc.returncode


@dataclass
class Deployment:
    root: Path
    tasks: dict[str, TaskFiles]
    leader: Server
    helper: Server
    leader_db: Path
    helper_db: Path
    clients: list[Client] = field(default_factory=list)

    def client(self, name: str, **kwargs: Any) -> Client:
        c = Client(self.tasks[name].client, **kwargs)
        self.clients.append(c)
        return c

    def collector(self, name: str, task: Task | None = None) -> Collector:
        return Collector(task or self.tasks[name].collector)

    def rejections(self, role: str, name: str) -> dict[str, int]:
        db = self.leader_db if role == "leader" else self.helper_db
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT reason, count FROM rejections WHERE task_id = ?",
                (self.tasks[name].client.task_id,),
            ).fetchall()
        return dict(rows)

    def stored_reports(self, name: str) -> int:
        with sqlite3.connect(self.leader_db) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM reports WHERE task_id = ?", (self.tasks[name].client.task_id,)
            ).fetchone()
        return int(row[0])

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.leader.stop()
        self.helper.stop()


def start_deployment(
    root: Path,
    tasks: Mapping[str, tuple[VdafSpec, DpSpec, dict[str, Any]]],
    job_size: int = 500,
) -> Deployment:
    """Write task files and configs under `root` and start both servers.

    `tasks` maps a name to (vdaf, dp, keyword arguments of new_task).
    """
    leader_addr = f"127.0.0.1:{free_port()}"
    helper_addr = f"127.0.0.1:{free_port()}"
    files = {
        name: new_task(vdaf, leader_addr, helper_addr, dp=dp, **kw)
        for name, (vdaf, dp, kw) in tasks.items()
    }
    for name, f in files.items():
        for role in ("leader", "helper", "collector", "client"):
            write_toml(root / f"{name}.{role}.toml", getattr(f, role).to_dict(), secret=True)
    servers = {}
    for role, addr in (("leader", leader_addr), ("helper", helper_addr)):
        config = {
            "listen": addr,
            "storage": f"{role}.db",
            "tasks": [f"{name}.{role}.toml" for name in files],
            "driver": {"interval": 0.1, "job_size": job_size},
            "grace_seconds": 10,
        }
        write_toml(root / f"{role}.toml", config, secret=False)
        servers[role] = Server(role, root / f"{role}.toml", root / f"{role}.log", addr)
    dep = Deployment(
        root, files, servers["leader"], servers["helper"], root / "leader.db", root / "helper.db"
    )
    try:
        dep.helper.start()
        dep.leader.start()
    except BaseException:
        dep.stop()
        raise
    return dep
