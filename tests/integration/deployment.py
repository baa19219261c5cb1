"""Test access to a real leader and helper in separate processes (veil.aggregator.local).

Fixtures always stop the servers in a `finally`; traffic only goes to loopback.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veil.aggregator.local import LocalDeployment, ServerProcess, free_port
from veil.client import Client
from veil.collector import Collector
from veil.task import DpSpec, Task, TaskFiles, VdafSpec

Server = ServerProcess
__all__ = ["Deployment", "Server", "free_port", "start_deployment"]


@dataclass
class Deployment:
    local: LocalDeployment
    clients: list[Client] = field(default_factory=list)

    @property
    def tasks(self) -> dict[str, TaskFiles]:
        return self.local.tasks

    @property
    def leader(self) -> ServerProcess:
        return self.local.leader

    @property
    def helper(self) -> ServerProcess:
        return self.local.helper

    def client(self, name: str, **kwargs: Any) -> Client:
        c = Client(self.tasks[name].client, **kwargs)
        self.clients.append(c)
        return c

    def collector(self, name: str, task: Task | None = None) -> Collector:
        return Collector(task or self.tasks[name].collector)

    def _query(self, role: str, sql: str, name: str) -> list[Any]:
        with sqlite3.connect(self.local.root / f"{role}.db") as conn:
            return conn.execute(sql, (self.tasks[name].client.task_id,)).fetchall()

    def rejections(self, role: str, name: str) -> dict[str, int]:
        rows = self._query(role, "SELECT reason, count FROM rejections WHERE task_id = ?", name)
        return dict(rows)

    def stored_reports(self, name: str) -> int:
        return int(
            self._query("leader", "SELECT COUNT(*) FROM reports WHERE task_id = ?", name)[0][0]
        )

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        self.local.stop()


def start_deployment(
    root: Path,
    tasks: Mapping[str, tuple[VdafSpec, DpSpec, dict[str, Any]]],
    job_size: int = 500,
    metrics: bool = False,
    extra_config: Mapping[str, Any] | None = None,
) -> Deployment:
    return Deployment(
        LocalDeployment.start(
            root, tasks, job_size=job_size, metrics=metrics, extra_config=extra_config
        )
    )
