"""Running an aggregator: configuration, TLS, health, driver and shutdown.

Configuration is one TOML file (paths in it are relative to the file):

    listen = "127.0.0.1:7001"          # host:port to serve on
    storage = "leader.db"              # SQLite database (created if missing), or
                                       # "postgresql://veil@db/leader" (schema migrated
                                       # at start), or a [storage] table (below)
    tasks = ["demo.leader.toml"]       # task files written by `veil task new`
    max_message_bytes = 16777216       # largest request or response accepted (an upload
                                       # also holds at most 10,000 reports)
    allow_exact_release = false        # true: allow tasks with [dp] mechanism = "none"
                                       # (exact, un-noised shares); refused otherwise
    log_level = "info"                 # VEIL_LOG_LEVEL overrides
    log_format = "text"                # or "json" (JSON lines)
    [tls]                              # optional; required off loopback
    cert = "server.pem"
    key = "server.key"
    client_ca = "clients-ca.pem"       # optional: require client certificates (mTLS)
    [helper_tls]                       # leader only: how to reach the helper over TLS
    ca = "helper-ca.pem"
    cert = "leader-client.pem"         # optional client certificate for mTLS
    key = "leader-client.key"
    [metrics]                          # optional Prometheus endpoint
    listen = "127.0.0.1:9101"          # loopback only, unless:
    public = false                     # true: serve off loopback (no TLS, no auth)
    [driver]                           # leader only
    interval = 0.5                     # seconds between idle passes
    job_size = 500                     # reports per aggregation job (fewer where a job
                                       # would exceed max_message_bytes / 4)
    enabled = true                     # false: an upload front end only; `veil
                                       # worker` processes aggregate and collect
    lease_seconds = 60                 # a crashed worker's job is retried after this
    max_job_attempts = 10              # a failing aggregation job is retried with backoff,
                                       # then given up: its reports rejected as job_failed
    max_helper_clock_lag = 3600        # a report the helper finds too early (its clock
                                       # behind) is sent again until this long after its
                                       # time, then rejected as report_too_early
    [admission]                        # leader only: the bounded backlog
    max_pending_reports = 1000000      # reports waiting for aggregation, over all tasks,
                                       # above which uploads are refused (UNAVAILABLE,
                                       # retryable, kind overloaded); 0: no limit
    max_pending_per_task = 500000      # the same for each task; 0: no limit
    retry_after_seconds = 2            # the wait a refused client is advised
    recount_seconds = 0.5              # how often the backlog is counted, at most (0: at
                                       # every upload)
    [gc]                               # background maintenance (both roles)
    interval = 60                      # seconds between passes; 0 turns it off
    [keys]                             # HPKE key rotation (veil.aggregator.maintenance)
    pending_seconds = 60               # a pending key becomes active this long after it was added
    grace_seconds = 86400              # an expired key still opens reports this long
    [storage]                          # instead of `storage = ...`, to size the pool:
    url = "postgresql://veil@db/leader"
    pool_size = 8
    [connections]                      # what idle or slow clients can hold (transport.py)
    receive_seconds = 30               # a call's request must arrive this soon after its
                                       # headers (else DEADLINE_EXCEEDED, retryable)
    max_waiting_calls = 1000           # calls waiting for their requests; one more ends
                                       # the longest waiting (UNAVAILABLE, retryable)
    max_calls_per_connection = 100     # concurrent calls on one HTTP/2 connection
    idle_seconds = 300                 # a connection without calls is closed after this
    max_age_seconds = 3600             # a connection is asked to reconnect after this
    keepalive_seconds = 60             # a silent connection is pinged after this
    workers = 8                        # threads running calls whose request has arrived
    max_queued_calls = 16              # such calls waiting for a thread; one more is
                                       # refused unserved (UNAVAILABLE, retryable)

Every table is read strictly (veil.settings): an unknown setting or a value
of the wrong type is refused with its file and line.

Without [tls] the server only listens on a loopback address, and says so.

`veil worker --config leader.toml` runs the leader's driver alone (no gRPC
server): on a shared PostgreSQL, any number of workers on any number of
machines lease aggregation and collection jobs from the database.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import grpc

from veil.aggregator.admission import (
    DEFAULT_MAX_PENDING_PER_TASK,
    DEFAULT_MAX_PENDING_REPORTS,
    DEFAULT_RECOUNT_SECONDS,
    DEFAULT_RETRY_AFTER_SECONDS,
    AdmissionLimits,
)
from veil.aggregator.core import AggregatorBase
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.control import DriverControl
from veil.aggregator.leader.settings import (
    DEFAULT_JOB_SIZE,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_HELPER_CLOCK_LAG,
    DEFAULT_MAX_JOB_ATTEMPTS,
    LeaderParts,
    LeaderSettings,
)
from veil.aggregator.maintenance import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_PENDING_SECONDS,
    KeyPolicy,
    advance_keys,
    collect_garbage,
)
from veil.aggregator.postgres import (
    PostgresDatastore,
    PostgresLedgerStore,
    is_postgres_url,
)
from veil.aggregator.privacy import PrivacyEngine, refuse_exact_release
from veil.aggregator.service import GrpcHelperClient, HelperService, LeaderService, add_service
from veil.aggregator.storage import SqliteDatastore
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.ledger import sqlite_ledger
from veil.aggregator.store.records import KEY_STATES, StoreInUse
from veil.aggregator.transport import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_MAX_AGE_SECONDS,
    DEFAULT_MAX_CALLS_PER_CONNECTION,
    DEFAULT_MAX_QUEUED_CALLS,
    DEFAULT_MAX_WAITING_CALLS,
    DEFAULT_RECEIVE_SECONDS,
    DEFAULT_WORKERS,
    ConnectionLimits,
    RpcServer,
)
from veil.dp import BudgetLedger, LedgerStore
from veil.grpc_util import MAX_MESSAGE_BYTES, is_loopback, warn_plaintext, why_cannot_listen
from veil.metrics import Metrics
from veil.protocol.v1 import helper_pb2, leader_pb2
from veil.settings import SettingsError, Table, read_toml
from veil.task import (
    AggregatorTask,
    HelperTask,
    LeaderTask,
    TaskError,
    expect_role,
    load_task,
)
from veil.vdaf.batch.kernels import kernels

log = logging.getLogger(__name__)

_LEADER_SERVICE = leader_pb2.DESCRIPTOR.services_by_name["Leader"]
_HELPER_SERVICE = helper_pb2.DESCRIPTOR.services_by_name["Helper"]
# The health service name each role reports SERVING for (besides "").
SERVICE_NAMES = {"leader": _LEADER_SERVICE.full_name, "helper": _HELPER_SERVICE.full_name}


class ConfigError(SettingsError):
    """The server configuration is unusable; the message says what to fix."""


@dataclass(frozen=True)
class TlsFiles:
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None


# Each default once: the dataclass, the reader and the docs above agree.
DEFAULT_MAX_MESSAGE_BYTES = MAX_MESSAGE_BYTES
DEFAULT_DRIVER_INTERVAL = 0.5
DEFAULT_GRACE_SECONDS_STOP = 30.0
DEFAULT_LOG_FORMAT = "text"
DEFAULT_POOL_SIZE = 8
DEFAULT_GC_INTERVAL = 60.0


@dataclass(frozen=True)
class ServerConfig:
    listen: str
    storage: Path | str  # an SQLite file, or a PostgreSQL URL
    tasks: list[AggregatorTask]
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls: TlsFiles | None = None
    helper_tls: TlsFiles | None = None
    driver_interval: float = DEFAULT_DRIVER_INTERVAL
    job_size: int = DEFAULT_JOB_SIZE
    grace_seconds: float = DEFAULT_GRACE_SECONDS_STOP
    log_level: str | None = None
    log_format: str = DEFAULT_LOG_FORMAT
    metrics_listen: str | None = None
    # The metrics endpoint has no TLS and no authentication: off loopback only
    # with [metrics] public = true (see check_metrics_listen).
    metrics_public: bool = False
    driver_enabled: bool = True
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_job_attempts: int = DEFAULT_MAX_JOB_ATTEMPTS
    max_helper_clock_lag: float = DEFAULT_MAX_HELPER_CLOCK_LAG
    pool_size: int = DEFAULT_POOL_SIZE
    gc_interval: float = DEFAULT_GC_INTERVAL
    task_paths: tuple[Path, ...] = ()
    keys: KeyPolicy = field(default_factory=KeyPolicy)
    # This operator's own opt-in to tasks with mechanism = "none" (DP fails
    # closed: without it the server refuses to start with such a task).
    allow_exact_release: bool = False
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)


# The settings each table of a server configuration knows; anything else is
# refused (a misspelt `client_ca` must not silently turn mutual TLS off).
CONFIG_KEYS = (
    "listen",
    "storage",
    "tasks",
    "max_message_bytes",
    "tls",
    "helper_tls",
    "driver",
    "grace_seconds",
    "log_level",
    "log_format",
    "metrics",
    "gc",
    "keys",
    "allow_exact_release",
    "admission",
    "connections",
)
TLS_KEYS = ("cert", "key", "client_ca")
HELPER_TLS_KEYS = ("ca", "cert", "key")
DRIVER_KEYS = (
    "interval",
    "job_size",
    "enabled",
    "lease_seconds",
    "max_job_attempts",
    "max_helper_clock_lag",
)
METRICS_KEYS = ("listen", "public")
GC_KEYS = ("interval",)
KEYS_KEYS = ("pending_seconds", "grace_seconds")
STORAGE_KEYS = ("url", "path", "pool_size")
ADMISSION_KEYS = (
    "max_pending_reports",
    "max_pending_per_task",
    "retry_after_seconds",
    "recount_seconds",
)
# The longest wait a refused client may be advised (clients read at most an
# hour from the trailer, veil.grpc_util.MAX_RETRY_AFTER_MS).
MAX_RETRY_AFTER_SECONDS = 3600.0
CONNECTIONS_KEYS = (
    "receive_seconds",
    "max_waiting_calls",
    "max_calls_per_connection",
    "idle_seconds",
    "max_age_seconds",
    "keepalive_seconds",
    "workers",
    "max_queued_calls",
)


def _tls(table: Table | None, base: Path, ca_key: str) -> TlsFiles | None:
    if table is None:
        return None

    def path(key: str) -> Path | None:
        value = table.optional_text(key)
        return None if value is None else base / value

    return TlsFiles(path("cert"), path("key"), path(ca_key))


def check_metrics_listen(address: str, public: bool) -> None:
    """The metrics endpoint (plain HTTP, no authentication; it names task ids and
    their traffic) listens on loopback unless its operator says `public = true`."""
    _, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"metrics listen address {address!r} is not host:port")
    if not public and not is_loopback(address):
        raise ConfigError(
            f"refusing to serve metrics on {address}, off loopback, without TLS or"
            " authentication: listen on 127.0.0.1 (scrape through a tunnel or a local"
            " agent), or set public = true in [metrics] for a network you trust"
        )


def load_config(path: str | os.PathLike[str]) -> ServerConfig:
    """Read and check a server configuration; raises ConfigError only."""
    path = Path(path)
    try:
        return _parse_config(path, read_toml(path, CONFIG_KEYS))
    except SettingsError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def _parse_config(path: Path, raw: Table) -> ServerConfig:
    base = path.parent
    task_files = raw.texts("tasks", [])
    tasks: list[AggregatorTask] = []
    for name in task_files:
        try:
            tasks.append(load_task(base / name, AggregatorTask))
        except TaskError as e:
            raise ConfigError(str(e)) from None
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise raw.error("tasks", "the same task is listed twice")
    listen = raw.text("listen")
    tls = _tls(raw.optional_table("tls", TLS_KEYS), base, "client_ca")
    if tls is not None and (tls.cert is None or tls.key is None):
        raise raw.error("tls", "[tls] needs both 'cert' and 'key'")
    helper_tls = _tls(raw.optional_table("helper_tls", HELPER_TLS_KEYS), base, "ca")
    driver = raw.table("driver", DRIVER_KEYS)
    storage, pool_size = _storage(raw, base)
    keys = raw.table("keys", KEYS_KEYS)
    policy = KeyPolicy(
        keys.number("pending_seconds", DEFAULT_PENDING_SECONDS, minimum=0),
        keys.number("grace_seconds", DEFAULT_GRACE_SECONDS, minimum=0),
    )
    gc_interval = raw.table("gc", GC_KEYS).number("interval", DEFAULT_GC_INTERVAL, minimum=0)
    admission = _admission(raw.table("admission", ADMISSION_KEYS))
    metrics = raw.table("metrics", METRICS_KEYS)
    metrics_listen = metrics.optional_text("listen")
    metrics_public = metrics.flag("public", False)
    if metrics_listen is not None:
        try:
            check_metrics_listen(metrics_listen, metrics_public)
        except ConfigError as e:
            raise metrics.error("listen", str(e)) from None
    conn = raw.table("connections", CONNECTIONS_KEYS)
    connections = ConnectionLimits(
        receive_seconds=conn.number("receive_seconds", DEFAULT_RECEIVE_SECONDS, minimum=0.001),
        max_waiting_calls=conn.integer("max_waiting_calls", DEFAULT_MAX_WAITING_CALLS, minimum=1),
        max_calls_per_connection=conn.integer(
            "max_calls_per_connection", DEFAULT_MAX_CALLS_PER_CONNECTION, minimum=1
        ),
        idle_seconds=conn.number("idle_seconds", DEFAULT_IDLE_SECONDS, minimum=0.001),
        max_age_seconds=conn.number("max_age_seconds", DEFAULT_MAX_AGE_SECONDS, minimum=0.001),
        keepalive_seconds=conn.number(
            "keepalive_seconds", DEFAULT_KEEPALIVE_SECONDS, minimum=0.001
        ),
        workers=conn.integer("workers", DEFAULT_WORKERS, minimum=1),
        max_queued_calls=conn.integer("max_queued_calls", DEFAULT_MAX_QUEUED_CALLS, minimum=0),
    )
    return ServerConfig(
        listen=listen,
        storage=storage,
        tasks=tasks,
        max_message_bytes=raw.integer("max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES, minimum=1),
        tls=tls,
        helper_tls=helper_tls,
        driver_interval=driver.number("interval", DEFAULT_DRIVER_INTERVAL, minimum=0),
        job_size=driver.integer("job_size", DEFAULT_JOB_SIZE, minimum=1),
        grace_seconds=raw.number("grace_seconds", DEFAULT_GRACE_SECONDS_STOP, minimum=0),
        log_level=raw.optional_text("log_level"),
        log_format=raw.text("log_format", DEFAULT_LOG_FORMAT),
        metrics_listen=metrics_listen,
        metrics_public=metrics_public,
        driver_enabled=driver.flag("enabled", True),
        lease_seconds=driver.number("lease_seconds", DEFAULT_LEASE_SECONDS, minimum=0),
        max_job_attempts=driver.integer("max_job_attempts", DEFAULT_MAX_JOB_ATTEMPTS, minimum=1),
        max_helper_clock_lag=driver.number(
            "max_helper_clock_lag", DEFAULT_MAX_HELPER_CLOCK_LAG, minimum=0
        ),
        pool_size=pool_size,
        gc_interval=gc_interval,
        task_paths=tuple(base / p for p in task_files),
        keys=policy,
        allow_exact_release=raw.flag("allow_exact_release", False),
        admission=admission,
        connections=connections,
    )


def _admission(table: Table) -> AdmissionLimits:
    retry_after = table.number("retry_after_seconds", DEFAULT_RETRY_AFTER_SECONDS, minimum=0)
    if retry_after > MAX_RETRY_AFTER_SECONDS:
        raise table.error(
            "retry_after_seconds",
            f"at most {MAX_RETRY_AFTER_SECONDS:g} s (clients ignore a longer advice)",
        )
    return AdmissionLimits(
        max_pending_reports=table.integer(
            "max_pending_reports", DEFAULT_MAX_PENDING_REPORTS, minimum=0
        ),
        max_pending_per_task=table.integer(
            "max_pending_per_task", DEFAULT_MAX_PENDING_PER_TASK, minimum=0
        ),
        retry_after_seconds=retry_after,
        recount_seconds=table.number("recount_seconds", DEFAULT_RECOUNT_SECONDS, minimum=0),
    )


def _storage(raw: Table, base: Path) -> tuple[Path | str, int]:
    """(SQLite path or PostgreSQL URL, pool size) from `storage = ...` or `[storage]`."""
    pool_size = DEFAULT_POOL_SIZE
    value = raw.raw("storage")
    if isinstance(value, dict):
        table = raw.table("storage", STORAGE_KEYS)
        if ("url" in table) == ("path" in table):
            raise raw.error(
                "storage",
                "[storage] takes either 'url' (PostgreSQL) or 'path' (SQLite), and"
                " optionally 'pool_size'",
            )
        pool_size = table.integer("pool_size", DEFAULT_POOL_SIZE, minimum=1)
        value = table.text("url") if "url" in table else table.text("path")
    if not isinstance(value, str) or not value:
        raise raw.error("storage", "'storage' must be a file name or a postgresql:// URL")
    if is_postgres_url(value):
        return value, pool_size
    if "://" in value:
        raise raw.error("storage", f"storage URL {value!r}: only postgresql:// is supported")
    return base / value, pool_size


AT = TypeVar("AT", bound=AggregatorTask)


def tasks_of_role(config: ServerConfig, kind: type[AT]) -> dict[bytes, AT]:
    """The configured tasks by id, each checked to be `kind` (a leader's task
    file listed in helper.toml is refused, naming the file)."""
    tasks = {}
    for task, path in zip(config.tasks, config.task_paths, strict=True):
        try:
            tasks[task.task_id] = expect_role(task, kind, str(path))
        except TaskError as e:
            raise ConfigError(str(e)) from None
    return tasks


@dataclass(frozen=True)
class StorageBackend:
    """An aggregator's store and its budget ledger, side by side in one database."""

    store: Datastore
    ledger: str | LedgerStore  # an SQLite file, or the PostgreSQL ledger store
    close: Callable[[], None]

    def budget_ledger(self) -> BudgetLedger:
        if isinstance(self.ledger, str):
            return sqlite_ledger(self.ledger)
        return BudgetLedger(self.ledger)


def open_backend(
    config: ServerConfig, *, create: bool = True, pool_size: int | None = None
) -> StorageBackend:
    """The configured storage, for the servers and the operator commands alike.

    `create=False` (the commands: status, gc, keys) refuses an SQLite file
    that does not exist yet rather than creating an empty database.
    """
    if isinstance(config.storage, Path):
        if not create and not config.storage.exists():
            raise ConfigError(f"no database at {config.storage}: start the server once first")
        try:
            sqlite = SqliteDatastore(config.storage)
        except (OSError, sqlite3.Error) as e:
            raise ConfigError(_unopenable(config.storage, e)) from None
        return StorageBackend(sqlite, str(config.storage), sqlite.close)
    pg = PostgresDatastore(config.storage, pool_size or config.pool_size)
    return StorageBackend(pg, PostgresLedgerStore(config.storage, pg.pool), pg.close)


def _unopenable(path: Path, error: OSError | sqlite3.Error) -> str:
    """Why the SQLite database at `path` cannot be opened or created, in one
    line an operator can act on (the storage setting or the file system)."""
    if isinstance(error, OSError) and error.errno == errno.ENOENT:
        why = f"its directory {path.parent} does not exist"
    elif isinstance(error, OSError) and error.errno == errno.EROFS:
        why = "the file system is read-only"
    elif isinstance(error, OSError):
        why = error.strerror or type(error).__name__
    else:
        # SQLite needs to write the file and, in WAL mode, create files
        # beside it: a read-only file or directory shows here.
        why = str(error)
    return (
        f"cannot open the database {path}: {why} (the server keeps its keys and reports"
        " there: point `storage` at a writable directory)"
    )


def open_storage(config: ServerConfig) -> tuple[Datastore, PrivacyEngine, Callable[[], None]]:
    """The configured store, a PrivacyEngine whose ledger lives beside it, and a closer."""
    # Before the database is opened or created: a refused server stores nothing.
    refuse_exact_release(config.tasks, config.allow_exact_release)
    backend = open_backend(config)
    if isinstance(backend.store, SqliteDatastore):
        try:
            backend.store.claim_single_process()
        except StoreInUse as e:
            backend.close()
            raise ConfigError(str(e)) from None
        except OSError as e:
            backend.close()
            raise ConfigError(_unopenable(Path(backend.store.path), e)) from None
    privacy = PrivacyEngine(
        backend.ledger, config.tasks, allow_exact_release=config.allow_exact_release
    )
    return backend.store, privacy, backend.close


def _read(p: Path | None) -> bytes | None:
    return p.read_bytes() if p is not None else None


def grpc_options(config: ServerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", config.max_message_bytes),
    ]


def server_options(config: ServerConfig) -> list[tuple[str, int]]:
    """A server's gRPC options: those of grpc_options, and SO_REUSEPORT only on
    PostgreSQL, where several processes may serve one address (the kernel
    spreads connections over them). gRPC sets SO_REUSEPORT by default on
    Linux; on SQLite it is turned off, so a second process on the same
    address fails to bind instead of silently taking half the calls."""
    shared = not isinstance(config.storage, Path)
    return [*grpc_options(config), ("grpc.so_reuseport", 1 if shared else 0)]


def helper_channel_factory(config: ServerConfig) -> Any:
    def factory(address: str) -> grpc.Channel:
        options = grpc_options(config)
        t = config.helper_tls
        if t is None:
            if not is_loopback(address):
                raise ConfigError(
                    f"helper address {address} is not loopback: configure [helper_tls]"
                )
            warn_plaintext(address)
            return grpc.insecure_channel(address, options=options)
        creds = grpc.ssl_channel_credentials(_read(t.ca), _read(t.key), _read(t.cert))
        return grpc.secure_channel(address, creds, options=options)

    return factory


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
            GrpcHelperClient(helper_channel_factory(config)),
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
        ),
    )


class AggregatorServer:
    """A running leader or helper: gRPC server, health service and (leader) driver."""

    def __init__(self, role: str, config: ServerConfig) -> None:
        if role not in ("leader", "helper"):
            raise ConfigError(f"unknown role {role!r}")
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
            helper_logic = Helper(helper_tasks, self.store, self.privacy, metrics=self.metrics)
            self.logic = helper_logic
            add_service(self.server, HelperService(helper_logic), _HELPER_SERVICE, self.metrics)
            self.service_name = _HELPER_SERVICE.full_name
        self._bind()

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
                root_certificates=_read(c.tls.ca),
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
        signals.wait(self.reload_tasks)
        self.stop()


def reload_tasks(
    config_path: Path,
    config: ServerConfig,
    kind: type[AggregatorTask],
    privacy: PrivacyEngine,
    logic: AggregatorBase[Any],
) -> tuple[ServerConfig, list[AggregatorTask]]:
    """Read the config again and serve the task files added to it since the
    process started (SIGHUP). Other changes to the config need a restart; a
    served task whose file changed is refused (tasks are immutable), and then
    nothing is added. Returns the updated config and the tasks added."""
    fresh = load_config(config_path)
    tasks = tasks_of_role(fresh, kind)
    served = logic.tasks
    for tid, t in tasks.items():
        if tid in served and served[tid] != t:
            raise ConfigError(
                f"task {t.id_text} changed in its file; task parameters are immutable"
            )
    new = [t for tid, t in tasks.items() if tid not in served]
    # The ledger first: a task must never be served without its budget.
    privacy.add_tasks(new)
    added = logic.add_tasks({t.task_id: t for t in new})
    ids = {a.task_id for a in added}
    paths = tuple(p for t, p in zip(fresh.tasks, fresh.task_paths, strict=True) if t.task_id in ids)
    config = dataclasses.replace(
        config, tasks=[*config.tasks, *added], task_paths=config.task_paths + paths
    )
    return config, added


class Signals:
    """SIGTERM and SIGINT (stop) and, with a config path, SIGHUP (load task
    files added to it), caught from construction on. Made before a server
    reports SERVING, so that a signal sent as soon as it does is never met
    by the default action (which would kill it on the spot)."""

    def __init__(self, config_path: Path | None) -> None:
        self.config_path = config_path
        # Flags say what came; `_woken` says something did. wait() clears
        # `_woken` before it reads the flags, so a signal that comes while it
        # reloads wakes it again rather than being lost.
        self._woken = threading.Event()
        self._stop = threading.Event()
        self._reload = threading.Event()
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if config_path is not None:
            signal.signal(signal.SIGHUP, self._on_hangup)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()
        self._woken.set()

    def _on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self._reload.set()
        self._woken.set()

    def wait(self, on_reload: Callable[[Path], list[AggregatorTask]]) -> None:
        """Block until SIGTERM or SIGINT; on SIGHUP call `on_reload`, in this
        (the main) thread, and log what it added. A stop wins over a reload
        that has not started."""
        while True:
            self._woken.wait()
            self._woken.clear()
            if self._stop.is_set():
                return
            if not self._reload.is_set():
                continue
            self._reload.clear()
            assert self.config_path is not None
            try:
                added = on_reload(self.config_path)
                log.info(
                    "SIGHUP: %d new task(s) served: %s",
                    len(added),
                    ", ".join(t.id_text for t in added) or "none",
                )
            except (ConfigError, TaskError, ValueError) as e:
                log.error("SIGHUP: tasks not reloaded: %s", e)


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
            self._close_store()
