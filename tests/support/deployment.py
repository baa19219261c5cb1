"""Test access to a real leader and helper in separate processes (veil.local.launcher).

Fixtures always stop the servers in a `finally`; traffic only goes to loopback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veil.aggregator.leader.settings import DEFAULT_LEASE_SECONDS
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import Client
from veil.collector import Collector
from veil.local.launcher import LocalDeployment, ServerProcess, free_port
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

    def _store(self, role: str) -> SqliteDatastore:
        """The server's own database through the store's methods (WAL: the
        server may be writing meanwhile), not through its tables."""
        return SqliteDatastore(self.local.root / f"{role}.db")

    def rejections(self, role: str, name: str) -> dict[str, int]:
        store = self._store(role)
        try:
            return store.rejections(self.tasks[name].client.task_id)
        finally:
            store.close()

    def stored_reports(self, name: str) -> int:
        task = self.tasks[name].client
        store = self._store("leader")
        try:
            counts = store.report_counts(task.task_id, task.time_precision)
        finally:
            store.close()
        return sum(n for by_state in counts.values() for n in by_state.values())

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
    lease_seconds: float = DEFAULT_LEASE_SECONDS,
) -> Deployment:
    return Deployment(
        LocalDeployment.start(
            root,
            tasks,
            job_size=job_size,
            metrics=metrics,
            extra_config=extra_config,
            lease_seconds=lease_seconds,
        )
    )
