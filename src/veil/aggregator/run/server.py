"""A running leader or helper: its gRPC server (TLS or loopback), health
service, maintenance thread, the leader's driver thread, and a graceful stop."""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from veil.aggregator.core import AggregatorBase
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.maintenance import advance_keys, collect_garbage
from veil.aggregator.run.backend import open_storage
from veil.aggregator.run.channels import read_pem, server_options
from veil.aggregator.run.config import ConfigError, ServerConfig, reload_tasks, tasks_of_role
from veil.aggregator.run.service import HelperService, LeaderService, add_service
from veil.aggregator.run.signals import Signals
from veil.aggregator.run.transport import RpcServer
from veil.aggregator.run.worker import drive, make_leader
from veil.aggregator.store.records import KEY_STATES
from veil.grpc_util import is_loopback, why_cannot_listen
from veil.metrics import Metrics
from veil.protocol.v1 import helper_pb2, leader_pb2
from veil.task import AggregatorTask, HelperTask, LeaderTask
from veil.tuning import freeze_startup_heap
from veil.vdaf.batch.kernels import kernels

log = logging.getLogger(__name__)

_LEADER_SERVICE = leader_pb2.DESCRIPTOR.services_by_name["Leader"]
_HELPER_SERVICE = helper_pb2.DESCRIPTOR.services_by_name["Helper"]
# The health service name each role reports SERVING for (besides "").
SERVICE_NAMES = {"leader": _LEADER_SERVICE.full_name, "helper": _HELPER_SERVICE.full_name}

# Runs an ASGI application on a bound listener (TLS or not), with at most
# `max_body` bytes a request, until the process ends: what serves the
# leader's and the helper's DAP routes (`veil leader` passes the survey page's guarded
# server, veil.web.guard.serve).
HttpServe = Callable[[Any, socket.socket, "ssl.SSLContext | None", int], None]


class AggregatorServer:
    """A running leader or helper: gRPC server, health service and (leader) driver."""

    def __init__(
        self, role: str, config: ServerConfig, http_serve: HttpServe | None = None
    ) -> None:
        if role not in ("leader", "helper"):
            raise ConfigError(f"unknown role {role!r}")
        if config.dap_listen is not None and http_serve is None:
            raise ConfigError("[dap] listen needs an HTTP server to run the DAP routes")
        self._http_serve = http_serve
        self.role = role
        self.config = config
        # Every task file is this role's, checked before the database is opened.
        leader_tasks = tasks_of_role(config, LeaderTask) if role == "leader" else {}
        helper_tasks = tasks_of_role(config, HelperTask) if role == "helper" else {}
        self.store, self.privacy, self._close_store = open_storage(config)
        self.metrics = Metrics(role)
        self.metrics.track_storage(lambda: float(self.store.size_bytes()))
        self.server = RpcServer(
            server_options(config),
            config.connections,
            lambda reason: self.metrics.calls_unread.labels(reason).inc(),
        )
        server = self.server
        self.metrics.track_waiting(lambda: float(server.waiting))
        self.leader: Leader | None = None
        self.helper: Helper | None = None
        self.logic: AggregatorBase[Any]
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self._maintenance: threading.Thread | None = None
        if role == "leader":
            self.leader = make_leader(
                config, leader_tasks, self.store, self.privacy, self.metrics, self._stop
            )
            self.logic = self.leader
            add_service(self.server, LeaderService(self.leader), _LEADER_SERVICE, self.metrics)
            self.service_name = _LEADER_SERVICE.full_name
        else:
            helper_logic = Helper(
                helper_tasks,
                self.store,
                self.privacy,
                metrics=self.metrics,
                open_threads=config.open_threads,
            )
            self.logic = self.helper = helper_logic
            add_service(self.server, HelperService(helper_logic), _HELPER_SERVICE, self.metrics)
            self.service_name = _HELPER_SERVICE.full_name
        self._bind()
        self.dap_port: int | None = None
        self._dap_listener: socket.socket | None = None
        if config.dap_listen is not None:
            self._dap_listener = self._bind_dap(config.dap_listen)
            self.dap_port = self._dap_listener.getsockname()[1]

    def _bind_dap(self, address: str) -> socket.socket:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            return socket.create_server((host, int(port)), family=family, backlog=1024)
        except OSError as e:
            self.server.stop(None)
            self._close_store()
            raise ConfigError(f"cannot serve DAP on {address}: {e.strerror or e}") from None

    def _dap_tls(self) -> ssl.SSLContext | None:
        tls = self.config.tls
        if tls is None:
            return None
        assert tls.cert is not None and tls.key is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.cert, tls.key)
        return context

    def _bind(self) -> None:
        c = self.config
        if c.tls is None:
            if not is_loopback(c.listen):
                raise ConfigError(
                    f"refusing to listen on {c.listen} without TLS: add a [tls] table with"
                    " cert and key, or listen on a loopback address"
                )
            log.warning("serving %s in plaintext on loopback %s (no [tls])", self.role, c.listen)
            self.port = self._add_port(lambda: self.server.add_insecure_port(c.listen))
        else:
            assert c.tls.cert is not None and c.tls.key is not None
            creds = grpc.ssl_server_credentials(
                [(c.tls.key.read_bytes(), c.tls.cert.read_bytes())],
                root_certificates=read_pem(c.tls.ca),
                require_client_auth=c.tls.ca is not None,
            )
            self.port = self._add_port(lambda: self.server.add_secure_port(c.listen, creds))

    def _add_port(self, add: Callable[[], int]) -> int:
        try:
            port = add()
        except RuntimeError:
            # gRPC says only that the bind failed (address in use, on SQLite
            # where SO_REUSEPORT is off, or not an address of this machine).
            port = 0
        if port == 0:
            self.server.stop(None)
            self._close_store()
            address = self.config.listen
            raise ConfigError(f"cannot listen on {address}: {why_cannot_listen(address)}")
        return port

    def start(self) -> None:
        # Load the compiled field kernels now, beside serving, rather than
        # in the first aggregation job (numba takes about a second, longer
        # the first time on a machine).
        threading.Thread(target=kernels, name="kernels", daemon=True).start()
        self.server.start()
        self.server.set_serving("", self.service_name)
        if self.config.metrics_listen is not None:
            host, _, port = self.config.metrics_listen.rpartition(":")
            bound = self.metrics.serve(host.strip("[]"), int(port))
            log.info("metrics on http://%s:%d/metrics", host, bound)
        if self._dap_listener is not None:
            # Imported here: Starlette and the DAP routes are for a server with
            # [dap] listen, and cost every other start their import.
            from veil.aggregator.run.dap_helper_http import dap_helper_app
            from veil.aggregator.run.dap_http import dap_app

            assert self._http_serve is not None
            if self.leader is not None:
                app = dap_app(
                    self.leader.dap, self.config.max_message_bytes, self.leader.dap_collections
                )
            else:
                assert self.helper is not None
                app = dap_helper_app(self.helper.dap, self.config.max_message_bytes)
            serve, listener, tls = self._http_serve, self._dap_listener, self._dap_tls()
            threading.Thread(
                target=lambda: serve(app, listener, tls, self.config.max_message_bytes),
                name="dap-http",
                daemon=True,
            ).start()
            log.info("DAP over HTTP%s on %s", "S" if tls else "", self.config.dap_listen)
        if self.leader is not None and self.config.driver_enabled:
            leader = self.leader
            self._driver = threading.Thread(
                target=lambda: drive(leader, self.config.driver_interval),
                name="driver",
                daemon=True,
            )
            self._driver.start()
        elif self.leader is not None:
            log.info("driver disabled: aggregation and collection are left to `veil worker`")
        self._maintenance = threading.Thread(target=self._maintain, name="gc", daemon=True)
        self._maintenance.start()
        log.info("%s serving on %s (port %d)", self.role, self.config.listen, self.port)

    def maintain_once(self) -> None:
        """One maintenance pass: key rotation steps, GC, space, gauges."""
        now = self.logic.clock()
        for event in advance_keys(self.store, now, self.config.keys):
            log.info("HPKE keys: %s", event)
        self.logic.refresh_keys()
        keys = self.store.hpke_keys()
        for state in KEY_STATES:
            self.metrics.hpke_keys.labels(state).set(sum(k.state == state for k in keys))
        if self.config.gc_interval > 0:
            began = time.monotonic()
            results = collect_garbage(self.store, self.config.tasks, now)
            self.metrics.gc_runs.inc()
            self.metrics.gc_seconds.observe(time.monotonic() - began)
            for result in results.values():
                for kind, n in dataclasses.asdict(result).items():
                    if n:
                        self.metrics.gc_deleted.labels(kind).inc(n)
        for task in self.config.tasks:
            self.privacy.report_budget(task, self.metrics)
        if self.leader is not None:
            self.metrics.aggregation_jobs_open.set(len(self.store.open_aggregation_jobs()))
            for task in self.config.tasks:
                backlog = self.store.unaggregated_count(task.task_id, 0, 2**63 - 1)
                self.metrics.reports_unaggregated.labels(task.id_text).set(backlog)

    def _maintain(self) -> None:
        # Key promotion happens even with GC off, and no later than one
        # pending period after a key was added.
        period = self.config.gc_interval or 60.0
        if self.config.keys.pending_seconds > 0:
            period = min(period, self.config.keys.pending_seconds)
        period = max(period, 0.1)
        while True:
            try:
                self.maintain_once()
            except Exception:
                log.exception("maintenance pass failed; retrying")
            if self._stop.wait(period):
                return

    def stop(self) -> None:
        """Graceful stop: refuse new calls, let in-flight calls and the driver's
        current step finish (each step is one transaction)."""
        log.info("%s shutting down", self.role)
        self._stop.set()
        self.server.stop(self.config.grace_seconds)
        if self._driver is not None:
            self._driver.join(self.config.grace_seconds)
        if self._maintenance is not None:
            self._maintenance.join(self.config.grace_seconds)
        self.logic.opener.close()
        self.metrics.stop()
        self._close_store()

    def reload_tasks(self, config_path: Path) -> list[AggregatorTask]:
        """Serve the task files added to the config since the server started
        (SIGHUP; see `reload_tasks`). Returns the tasks added."""
        kind = LeaderTask if self.role == "leader" else HelperTask
        self.config, added = reload_tasks(config_path, self.config, kind, self.privacy, self.logic)
        return added

    def serve_forever(self, config_path: Path | None = None) -> None:
        """Start, then block until SIGTERM or SIGINT, then stop gracefully.
        With `config_path`, SIGHUP loads task files added to the config."""
        signals = Signals(config_path)
        self.start()
        # Start-up is over once the kernels are loaded: what this process
        # holds now lives as long as it does (freeze_startup_heap). A thread
        # waits for them, not this one, which takes the signals meanwhile:
        # loading takes turns with every process of the installation under
        # numba's cache lock (veil.vdaf.batch.kernels), which on a fresh
        # machine may be held for minutes of compiling, and a SIGHUP's new
        # tasks need no kernel to be served.
        threading.Thread(target=_finish_startup, name="startup", daemon=True).start()
        signals.wait(self.reload_tasks)
        self.stop()


def _finish_startup() -> None:
    kernels()
    freeze_startup_heap()
