"""A leader and a helper as local processes on loopback, for demos and benchmarks.

`LocalDeployment.start` writes task files and both servers' configs into a
directory, starts `python -m veil.cli leader|helper --config ...` and waits
until both report SERVING through gRPC health checking. Always `stop()` it
(or use it as a context manager). Only loopback addresses are used.

With `storage` URLs the servers use PostgreSQL; with `workers`, the leader is
an upload front end only and that many `veil worker` processes aggregate; with
`helpers` > 1 (PostgreSQL only), that many helper processes serve the one
helper address (SO_REUSEPORT), and with `front_ends` > 1 that many leader
processes the leader's.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from veil.aggregator.leader.settings import DEFAULT_JOB_SIZE, DEFAULT_LEASE_SECONDS
from veil.aggregator.run.server import SERVICE_NAMES
from veil.files import replace_file
from veil.grpc_util import open_channel
from veil.task import DpSpec, TaskFiles, VdafSpec, new_task, write_toml

# Ports this process has handed out. The kernel may give the same free port
# to two binds in a row, and a leader and a helper given one port would
# share it (one of them failing to bind while the other answers for both).
_handed_out: set[int] = set()

# Listening ports are drawn below the kernel's range for outgoing
# connections (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768 and up by
# default). A port from inside it, free when chosen, could be taken by any
# client socket's connect before the server binds it: with many servers and
# connections starting at once (the test suite's parallel workers) that was
# seen to happen. Below the range only another listener can take it.
_LOW_PORT = 10000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")

# The part of that range this process draws from, (index, count): processes
# that choose ports at the same time (the test suite's parallel workers) each
# take their own part, so that no two of them draw one free port, each to
# bind it a moment later (seen once with six workers: "Address already in
# use" for a leader's metrics port).
_part: tuple[int, int] = (0, 1)


def share_ports(index: int, count: int) -> None:
    """From now on, draw ports from the index-th of `count` equal parts of
    the range below outgoing connections' (one per process choosing ports
    at once)."""
    global _part
    if not 0 <= index < count:
        raise ValueError(f"part {index} of {count}: the index must be from 0 to count - 1")
    _part = (index, count)


def _outgoing_range_start() -> int | None:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, that this
    process has not handed out before and, where the kernel says which
    ports outgoing connections use, outside them."""
    start = _outgoing_range_start()
    index, count = _part
    width = (start - _LOW_PORT) // count if start is not None else 0
    while True:
        with socket.socket() as s:
            if width >= 1000:
                try:
                    s.bind(("127.0.0.1", _LOW_PORT + index * width + secrets.randbelow(width)))
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


@dataclass
class ServerProcess:
    role: str
    config: Path
    log: Path
    address: str
    proc: subprocess.Popen[bytes] | None = None
    metrics_address: str | None = None
    # Several processes serve `address` (SO_REUSEPORT).
    shared: bool = False
    # Environment variables set for this process on top of ours (e.g.
    # libfaketime's, to run it with its clock set apart).
    env: Mapping[str, str] | None = None

    def start(
        self,
        # A server starts in about a second on an idle machine; on a loaded
        # one (the test suite's parallel workers beside other work) 20 s
        # was seen to pass before it served.
        timeout: float = 60.0,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
    ) -> None:
        """Start the server and wait until its health check says SERVING for
        its role's service (so another kind of server on the address does not
        pass for it).

        Give `root_certificates` (and a client key and certificate for mTLS)
        when the server uses TLS.
        """
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        # Where this run's lines start: on an address several processes
        # share, another one may answer the health check, so this one also
        # waits for its own "serving" line.
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "veil.cli", self.role, "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + timeout
        service = SERVICE_NAMES[self.role]
        tls = (root_certificates, private_key, certificate_chain)
        with open_channel(self.address, *tls) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.role} exited: {self.log.read_text()[-2000:]}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING and (
                        not self.shared
                        or f"{self.role} serving on".encode() in self.log.read_bytes()[offset:]
                    ):
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    self.stop(signal.SIGKILL)
                    raise RuntimeError(f"{self.role} did not become healthy; see {self.log}")
                time.sleep(0.1)

    def start_worker(self) -> None:
        """Start `veil worker` on this (leader) config; it has no port to wait for."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        with self.log.open("ab") as log:
            metrics = [] if self.metrics_address is None else ["--metrics", self.metrics_address]
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "veil.cli",
                    "worker",
                    "--config",
                    str(self.config),
                    *metrics,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

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


def _copy(server: ServerProcess, i: int) -> ServerProcess:
    """Another process of `server`'s role on its address (SO_REUSEPORT): its
    config, with its own metrics port and log."""
    server.shared = True
    text = server.config.read_text()
    metrics_address = None
    if server.metrics_address is not None:
        metrics_address = f"127.0.0.1:{free_port()}"
        text = text.replace(server.metrics_address, metrics_address)
    config = server.config.with_name(f"{server.role}{i}.toml")
    replace_file(config, text.encode(), 0o600)
    log = server.log.with_name(f"{server.role}{i}.log")
    return ServerProcess(
        server.role, config, log, server.address, None, metrics_address, True, server.env
    )


@dataclass
class LocalDeployment:
    root: Path
    tasks: dict[str, TaskFiles]
    leader: ServerProcess
    helper: ServerProcess
    workers: list[ServerProcess]
    # Further helper processes on the helper's address (after `helper`), and
    # further leader front ends on the leader's.
    more_helpers: list[ServerProcess]
    more_front_ends: list[ServerProcess]

    @property
    def helpers(self) -> list[ServerProcess]:
        return [self.helper, *self.more_helpers]

    @property
    def front_ends(self) -> list[ServerProcess]:
        return [self.leader, *self.more_front_ends]

    @classmethod
    def start(
        cls,
        root: Path,
        tasks: Mapping[str, tuple[VdafSpec, DpSpec, dict[str, Any]]],
        job_size: int = DEFAULT_JOB_SIZE,
        driver_interval: float = 0.1,
        metrics: bool = False,
        storage: Mapping[str, str] | None = None,
        workers: int = 0,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        start_workers: bool = True,
        extra_config: Mapping[str, Any] | None = None,
        helpers: int = 1,
        front_ends: int = 1,
        env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> LocalDeployment:
        """Write task files and configs under `root` and start both servers.

        `tasks` maps a name to (vdaf, dp, keyword arguments of `new_task`).
        `storage` maps "leader" and "helper" to a postgresql:// URL each
        (default: an SQLite file each). With `workers` > 0 the leader's own
        driver is off and that many worker processes run it instead (started
        later with `start_worker()` when `start_workers` is false).
        `extra_config` adds settings (e.g. `gc`, `keys`, `log_format`) to
        both servers' configs. `env` maps "leader" or "helper" to environment
        variables for that server's processes.
        """
        root.mkdir(parents=True, exist_ok=True)
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
            config: dict[str, Any] = {
                "listen": addr,
                "storage": (storage or {}).get(role, f"{role}.db"),
                "tasks": [f"{name}.{role}.toml" for name in files],
                "driver": {
                    "interval": driver_interval,
                    "job_size": job_size,
                    "enabled": not (role == "leader" and workers > 0),
                    "lease_seconds": lease_seconds,
                },
                "grace_seconds": 10,
                # The caller chose mechanism none for a task: both local
                # servers opt in, as each operator would in its own config.
                "allow_exact_release": any(not dp.has_noise for _, dp, _ in tasks.values()),
                **(extra_config or {}),
            }
            metrics_address = f"127.0.0.1:{free_port()}" if metrics else None
            if metrics_address is not None:
                config["metrics"] = {"listen": metrics_address}
            write_toml(root / f"{role}.toml", config, secret=False)
            servers[role] = ServerProcess(
                role,
                root / f"{role}.toml",
                root / f"{role}.log",
                addr,
                None,
                metrics_address,
                env=(env or {}).get(role),
            )
        worker_procs = [
            ServerProcess(
                "worker",
                root / "leader.toml",
                root / f"worker{i}.log",
                "",
                None,
                f"127.0.0.1:{free_port()}" if metrics else None,
            )
            for i in range(workers)
        ]
        more = {
            role: [_copy(servers[role], i) for i in range(1, n)]
            for role, n in (("helper", helpers), ("leader", front_ends))
        }
        dep = cls(
            root,
            files,
            servers["leader"],
            servers["helper"],
            worker_procs,
            more["helper"],
            more["leader"],
        )
        try:
            for h in dep.helpers:
                h.start()
            # The front ends first: they make the HPKE key the workers then read.
            for front_end in dep.front_ends:
                front_end.start()
            for w in worker_procs if start_workers else []:
                w.start_worker()
        except BaseException:
            dep.stop()
            raise
        return dep

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        for front_end in self.front_ends:
            front_end.stop()
        for h in self.helpers:
            h.stop()

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
