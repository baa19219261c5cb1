"""A veil leader and helper that serve tasks over DAP, each its own process
(`veil leader`, `veil helper`), for the integration tests that speak DAP to
them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from veil.local.launcher import ServerProcess
from veil.task import TaskFiles, write_toml


@contextmanager
def dap_servers(
    root: Path,
    tasks: dict[str, TaskFiles],
    leader: tuple[str, str],
    helper: tuple[str, str],
    storage: Callable[[str], str] = lambda role: f"{role}.db",
) -> Iterator[None]:
    """The helper, then the leader, started in `root` on their (gRPC, DAP)
    listen addresses `helper` and `leader`, serving `tasks` (each task's
    files written as NAME.ROLE.toml, the config as ROLE.toml) and storing in
    `storage(role)`; exact releases allowed, the leader's driver every 0.2 s.
    Both are stopped, leader first, on leaving."""
    servers = []
    for role, (listen, dap) in (("helper", helper), ("leader", leader)):
        for name, files in tasks.items():
            write_toml(root / f"{name}.{role}.toml", getattr(files, role).to_dict(), secret=True)
        config: dict[str, Any] = {
            "listen": listen,
            "storage": storage(role),
            "tasks": [f"{name}.{role}.toml" for name in tasks],
            "allow_exact_release": True,
            "dap": {"listen": dap},
        }
        if role == "leader":
            config["driver"] = {"interval": 0.2}
        write_toml(root / f"{role}.toml", config, secret=False)
        server = ServerProcess(role, root / f"{role}.toml", root / f"{role}.log", listen)
        server.start()
        servers.append(server)
    try:
        yield
    finally:
        for server in reversed(servers):
            server.stop()
