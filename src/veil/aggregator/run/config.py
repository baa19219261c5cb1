"""An aggregator's configuration: reading and checking it, and reading it
again for the task files added since (SIGHUP).

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
    open_threads = 0                   # threads opening a job's input shares (HPKE) in
                                       # the helper, the leader's driver and `veil worker`:
                                       # 0: one per core, at most 4; 1: no extra thread
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
    [dap]                              # optional: DAP over HTTP (docs/DAP.md)
    listen = "127.0.0.1:8080"          # loopback only unless [tls] is set
    [driver]                           # leader only
    interval = 0.5                     # seconds between idle passes
    job_size = 2000                    # reports per aggregation job (fewer where a job
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
    [connections]                      # what idle or slow clients can hold (run/transport.py)
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
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from veil.aggregator.core import AggregatorBase
from veil.aggregator.leader.admission import (
    DEFAULT_MAX_PENDING_PER_TASK,
    DEFAULT_MAX_PENDING_REPORTS,
    DEFAULT_RECOUNT_SECONDS,
    DEFAULT_RETRY_AFTER_SECONDS,
    AdmissionLimits,
)
from veil.aggregator.leader.settings import (
    DEFAULT_JOB_SIZE,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_MAX_HELPER_CLOCK_LAG,
    DEFAULT_MAX_JOB_ATTEMPTS,
)
from veil.aggregator.maintenance import DEFAULT_GRACE_SECONDS, DEFAULT_PENDING_SECONDS, KeyPolicy
from veil.aggregator.opener import MAX_OPEN_THREADS
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.transport import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_KEEPALIVE_SECONDS,
    DEFAULT_MAX_AGE_SECONDS,
    DEFAULT_MAX_CALLS_PER_CONNECTION,
    DEFAULT_MAX_QUEUED_CALLS,
    DEFAULT_MAX_WAITING_CALLS,
    DEFAULT_RECEIVE_SECONDS,
    DEFAULT_WORKERS,
    ConnectionLimits,
)
from veil.grpc_util import MAX_MESSAGE_BYTES, is_loopback
from veil.settings import SettingsError, Table, read_toml
from veil.task import OPEN_ENDED, AggregatorTask, TaskError, expect_role, load_task
from veil.times import format_time

log = logging.getLogger(__name__)


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
DEFAULT_OPEN_THREADS = 0  # one per core, at most veil.aggregator.opener.AUTO_OPEN_THREADS


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
    open_threads: int = DEFAULT_OPEN_THREADS
    task_paths: tuple[Path, ...] = ()
    keys: KeyPolicy = field(default_factory=KeyPolicy)
    # This operator's own opt-in to tasks with mechanism = "none" (DP fails
    # closed: without it the server refuses to start with such a task).
    allow_exact_release: bool = False
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    # The DAP routes over HTTP (docs/DAP.md), beside gRPC: host:port,
    # loopback unless [tls] is set (its cert and key serve HTTPS too).
    dap_listen: str | None = None


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
    "open_threads",
    "metrics",
    "gc",
    "keys",
    "allow_exact_release",
    "admission",
    "connections",
    "dap",
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
DAP_KEYS = ("listen",)
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
    dap_listen = raw.table("dap", DAP_KEYS).optional_text("listen")
    if dap_listen is not None:
        _, sep, port = dap_listen.rpartition(":")
        if not sep or not port.isdigit():
            raise raw.error("dap", f"[dap] listen address {dap_listen!r} is not host:port")
        if tls is None and not is_loopback(dap_listen):
            raise raw.error(
                "dap",
                f"refusing to serve DAP on {dap_listen} without TLS: add a [tls] table with"
                " cert and key, or listen on a loopback address",
            )
    open_threads = raw.integer("open_threads", DEFAULT_OPEN_THREADS, minimum=0)
    if open_threads > MAX_OPEN_THREADS:
        raise raw.error(
            "open_threads",
            f"at most {MAX_OPEN_THREADS} (0: one thread per core, at most 4), not {open_threads}",
        )
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
        open_threads=open_threads,
        task_paths=tuple(base / p for p in task_files),
        keys=policy,
        allow_exact_release=raw.flag("allow_exact_release", False),
        dap_listen=dap_listen,
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


def is_postgres_url(storage: str) -> bool:
    return storage.startswith(("postgresql://", "postgres://"))


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


def reload_tasks(
    config_path: Path,
    config: ServerConfig,
    kind: type[AggregatorTask],
    privacy: PrivacyEngine,
    logic: AggregatorBase[Any],
) -> tuple[ServerConfig, list[AggregatorTask]]:
    """Read the config again and serve the task files added to it since the
    process started (SIGHUP), and the new window of a served task whose file
    changed only in its window (veil survey close, veil survey extend). Other
    changes to the config need a restart; a served task whose file changed
    otherwise is refused (a task's parameters are immutable), and then
    nothing changes. Returns the updated config and the tasks added."""
    fresh = load_config(config_path)
    tasks = tasks_of_role(fresh, kind)
    served = logic.tasks
    rewindowed = {}
    for tid, t in tasks.items():
        if tid in served and served[tid] != t:
            if not served[tid].same_but_window(t):
                raise ConfigError(
                    f"task {t.id_text} changed in its file beyond its window; a task's"
                    " parameters other than its window are immutable"
                )
            rewindowed[tid] = t
    new = [t for tid, t in tasks.items() if tid not in served]
    # The ledger first: a task must never be served without its budget.
    privacy.add_tasks(new)
    added = logic.add_tasks({t.task_id: t for t in new})
    for before, after in logic.change_windows(rewindowed):
        log.info(
            "SIGHUP: task %s now takes reports from %s to %s (was %s to %s)",
            after.id_text,
            *(
                format_time(t) if t < OPEN_ENDED else "open end"
                for t in (*after.window, *before.window)
            ),
        )
    ids = {a.task_id for a in added}
    paths = tuple(p for t, p in zip(fresh.tasks, fresh.task_paths, strict=True) if t.task_id in ids)
    current = [rewindowed.get(t.task_id, t) for t in config.tasks]
    config = dataclasses.replace(
        config, tasks=[*current, *added], task_paths=config.task_paths + paths
    )
    return config, added
