"""The leader's driver: its logic as configured, the loop that runs its
passes, and `veil worker`, that loop without a server.

`veil worker --config leader.toml` runs the leader's driver alone (no gRPC
server): on a shared PostgreSQL, any number of workers on any number of
machines lease aggregation and collection jobs from the database.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Mapping
from pathlib import Path

from veil.aggregator.leader import Leader
from veil.aggregator.leader.control import DriverControl
from veil.aggregator.leader.dap_client import ByProtocol, DapHelperClient
from veil.aggregator.leader.helper_client import GrpcHelperClient
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.backend import open_storage
from veil.aggregator.run.channels import helper_channel_factory
from veil.aggregator.run.config import (
    ServerConfig,
    check_metrics_listen,
    reload_tasks,
    tasks_of_role,
)
from veil.aggregator.run.signals import Signals
from veil.aggregator.store.base import Datastore
from veil.metrics import Metrics
from veil.task import AggregatorTask, LeaderTask
from veil.tuning import freeze_startup_heap
from veil.vdaf.batch.kernels import kernels

log = logging.getLogger(__name__)


def _dap_trust(config: ServerConfig) -> ssl.SSLContext | None:
    """How the leader reaches a DAP helper over https: the [helper_tls] CA
    where one is configured (the one gRPC trusts), else the system's."""
    tls = config.helper_tls
    if tls is None or tls.ca is None:
        return None
    return ssl.create_default_context(cafile=str(tls.ca))


def make_leader(
    config: ServerConfig,
    tasks: Mapping[bytes, LeaderTask],
    store: Datastore,
    privacy: PrivacyEngine,
    metrics: Metrics,
    stop: threading.Event,
) -> Leader:
    """The leader's logic as configured, for the server's driver and `veil worker`
    alike; setting `stop` stops its driver between two steps."""
    return Leader(
        tasks,
        LeaderParts(
            store,
            ByProtocol(
                GrpcHelperClient(helper_channel_factory(config)),
                DapHelperClient(_dap_trust(config)),
            ),
            privacy,
            metrics=metrics,
            control=DriverControl(stop),
        ),
        LeaderSettings(
            job_size=config.job_size,
            # Jobs stay well under what the helper accepts (issue 13).
            max_job_bytes=config.max_message_bytes // 4,
            lease_seconds=config.lease_seconds,
            max_job_attempts=config.max_job_attempts,
            max_helper_clock_lag=config.max_helper_clock_lag,
            admission=config.admission,
            open_threads=config.open_threads,
        ),
    )


def drive(leader: Leader, idle: float) -> None:
    """The leader's driver loop: run passes until its control is stopped."""
    control = leader.control
    backoff = idle
    while not control.stopping:
        try:
            busy = leader.run_once()
        except Exception:
            log.exception("driver pass failed; retrying")
            busy = False
        if control.helper_unreachable:
            # Back off while the helper is away, up to 2 s, so it is
            # neither flooded nor waited for long once it is back.
            backoff = min(backoff * 2, max(idle, 2.0))
            control.wait(backoff)
            continue
        backoff = idle
        if not busy:
            control.wait(idle)


class AggregationWorker:
    """`veil worker`: the leader's aggregation and collection driver without a server.

    Stateless: everything it knows is in the shared store, and every job it
    holds is leased, so it may be killed at any moment; another worker takes
    its jobs over when their leases expire.
    """

    def __init__(self, config: ServerConfig, metrics_listen: str | None = None) -> None:
        self.config = config
        # Its own metrics port (the config's [metrics] is the front end's): the
        # aggregation counters live in the workers.
        if metrics_listen is not None:
            check_metrics_listen(metrics_listen, config.metrics_public)
        self.metrics_listen = metrics_listen
        self.metrics = Metrics("leader")
        tasks = tasks_of_role(config, LeaderTask)
        self.store, self.privacy, self._close_store = open_storage(config)
        self._stop = threading.Event()
        self.leader = make_leader(config, tasks, self.store, self.privacy, self.metrics, self._stop)
        # The compiled field kernels are loaded (or built) at start, not inside
        # the first aggregation job: about half a second of CPU (more on a
        # machine's first start) that the first job's reports paid, and that
        # showed as ~100 µs per report in a run of 6000 (docs/reports/SCALING.md). A
        # worker serves nothing meanwhile, so it need not load them aside.
        kernels()

    def close(self) -> None:
        """Stop the threads opening shares, close the store and the ledger
        (serve_forever does on its way out)."""
        self.leader.opener.close()
        self._close_store()

    def reload_tasks(self, config_path: Path) -> list[AggregatorTask]:
        """Drive the task files added to the config since the worker started."""
        self.config, added = reload_tasks(
            config_path, self.config, LeaderTask, self.privacy, self.leader
        )
        return added

    def serve_forever(self, config_path: Path | None = None) -> None:
        """Drive until SIGTERM or SIGINT; then finish the current step and stop.
        With `config_path`, SIGHUP loads task files added to the config."""
        signals = Signals(config_path)
        if self.metrics_listen is not None:
            host, _, port = self.metrics_listen.rpartition(":")
            bound = self.metrics.serve(host.strip("[]"), int(port))
            log.info("metrics on http://%s:%d/metrics", host, bound)
        # Start-up is over: what this process holds now lives as long as it
        # does (freeze_startup_heap).
        freeze_startup_heap()
        log.info("worker %s started", self.leader.worker_id)
        # The driver runs in its own thread so that a reload (main thread,
        # between signals) never runs inside one of its database steps.
        driver = threading.Thread(
            target=lambda: drive(self.leader, self.config.driver_interval),
            name="driver",
        )
        driver.start()
        try:
            signals.wait(self.reload_tasks)
        finally:
            self._stop.set()
            driver.join()
            log.info("worker %s stopping", self.leader.worker_id)
            self.metrics.stop()
            self.close()
