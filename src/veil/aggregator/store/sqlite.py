"""The `Datastore` on SQLite (one file in WAL mode).

Every method is one unit of work in one transaction, so a crash leaves either
all of it or none of it. The units are written once, for both backends, in
veil.aggregator.store (the `Datastore` class in base.py, its units in
reports.py, jobs.py, collection_jobs.py and prefix_queries.py over the
transaction interface of tx.py); this module holds what is SQLite's own:
connections, BEGIN IMMEDIATE, the first-key insertion, space reclaim, the
one-process claim and the upgrade of files from before the numbered
migrations. An upload the leader acknowledged has been committed with
`synchronous=FULL`, so it survives `kill -9` and power loss of the process.

Several processes may share one store (the PostgreSQL backend, veil.aggregator
.postgres, exists for that): so the read-modify-write of a batch aggregate
happens inside the store's transaction, under its lock, with the caller's
`merge` function doing the field addition; and aggregation and collection
jobs are leased to one worker at a time, with an expiry after which another
worker takes a crashed worker's job over.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from veil.aggregator.store.base import Datastore
from veil.aggregator.store.migrations import migrate_sqlite
from veil.aggregator.store.records import (
    StoreInUse,
)
from veil.aggregator.store.tx import SqliteTx, Tx

T = TypeVar("T")

WAL_SIZE_LIMIT = 16 << 20
# The page size of a new file (SQLite's default is 4096). A Histogram(100,10)
# report's shares (a 2.7 KB row) took a 4 KB page of their own, the rest of
# it unused, and each page goes to the WAL and back into the file as write
# calls and a checksum of its own; a 16 KB page holds five such rows. In
# process (scripts/bench_upload.py, uploads of 10,000) the store's work for
# a Histogram upload fell from about 30 to 19 us a report (22 at 8 KB). An
# upload of one report writes its pages whole, but its commit's sync
# dominates: within the spread through the upload call (SCALING.md, "The
# SQLite leader process's uploads"). A file keeps the page size it was
# made with (changing it takes a VACUUM).
PAGE_SIZE = 16384


# The schema of SQLite files from before the numbered migrations
# (veil.aggregator.store.migrations), kept to bring such a file up to date.
_LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS hpke_keys (
    config_id INTEGER PRIMARY KEY, public_key BLOB NOT NULL, private_key BLOB NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS reports (
    task_id BLOB NOT NULL, report_id BLOB NOT NULL, time INTEGER NOT NULL,
    public_share BLOB NOT NULL, leader_ct BLOB NOT NULL, helper_ct BLOB NOT NULL,
    state INTEGER NOT NULL DEFAULT 0, job_id BLOB, reason TEXT,
    PRIMARY KEY (task_id, report_id));
CREATE INDEX IF NOT EXISTS reports_state ON reports (task_id, state, time);
CREATE INDEX IF NOT EXISTS reports_job ON reports (task_id, job_id);
CREATE TABLE IF NOT EXISTS aggregation_jobs (
    task_id BLOB NOT NULL, job_id BLOB NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (task_id, job_id));
CREATE INDEX IF NOT EXISTS aggregation_jobs_state ON aggregation_jobs (state, created);
CREATE TABLE IF NOT EXISTS batch_aggregates (
    task_id BLOB NOT NULL, bucket INTEGER NOT NULL, agg_share BLOB,
    report_count INTEGER NOT NULL, checksum BLOB NOT NULL, collected_by BLOB,
    PRIMARY KEY (task_id, bucket));
CREATE TABLE IF NOT EXISTS rejections (
    task_id BLOB NOT NULL, reason TEXT NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (task_id, reason));
CREATE TABLE IF NOT EXISTS collections (
    task_id BLOB NOT NULL, job_id BLOB NOT NULL, start INTEGER NOT NULL,
    duration INTEGER NOT NULL, state TEXT NOT NULL, report_count INTEGER NOT NULL,
    checksum BLOB NOT NULL, leader_ct BLOB, helper_ct BLOB, error_code INTEGER NOT NULL,
    error_message TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (task_id, job_id));
CREATE TABLE IF NOT EXISTS helper_jobs (
    task_id BLOB NOT NULL, job_id BLOB NOT NULL, request_hash BLOB NOT NULL,
    response BLOB NOT NULL, PRIMARY KEY (task_id, job_id));
CREATE TABLE IF NOT EXISTS helper_reports (
    task_id BLOB NOT NULL, report_id BLOB NOT NULL, PRIMARY KEY (task_id, report_id));
"""

# Columns added after the first release; _legacy_upgrade adds them to older files.
# A lease is (owner, expiry in epoch seconds); expiry 0 means nobody holds the job.
_ADDED_COLUMNS = (
    ("hpke_keys", "state", "TEXT NOT NULL DEFAULT 'active'"),
    ("hpke_keys", "expires_at", "REAL"),
    ("helper_reports", "time", "INTEGER"),
    ("helper_reports", "job_id", "BLOB"),
    ("helper_jobs", "created", "REAL"),
    ("aggregation_jobs", "lease_owner", "TEXT"),
    ("aggregation_jobs", "lease_expiry", "REAL NOT NULL DEFAULT 0"),
    ("aggregation_jobs", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("collections", "lease_owner", "TEXT"),
    ("collections", "lease_expiry", "REAL NOT NULL DEFAULT 0"),
    ("collections", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    # A job that failed is not leased again before retry_at; `failures`
    # counts its failed attempts and `error` says why the last one failed.
    ("aggregation_jobs", "retry_at", "REAL NOT NULL DEFAULT 0"),
    ("aggregation_jobs", "failures", "INTEGER NOT NULL DEFAULT 0"),
    ("aggregation_jobs", "error", "TEXT"),
    ("collections", "retry_at", "REAL NOT NULL DEFAULT 0"),
    ("collections", "failures", "INTEGER NOT NULL DEFAULT 0"),
)


def _owner_only(path: str) -> None:
    """Create the database file readable by its owner only, or narrow it.

    It holds the aggregator's HPKE private keys and its un-noised aggregate
    shares. SQLite gives the -wal and -shm files the mode of the database
    file, so they follow.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class SqliteDatastore(Datastore):
    """`Datastore` on one SQLite file in WAL mode."""

    def __init__(self, path: Path | str, busy_timeout: float = 30.0) -> None:
        self.path = str(path)
        # How long a write waits for another process's lock before the
        # database counts as unavailable (is_transient_storage_error).
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._claim: int | None = None
        if self.path != ":memory:" and not self.path.startswith("file:"):
            _owner_only(self.path)
        migrate_sqlite(self._conn(), self._legacy_upgrade)

    @staticmethod
    def _legacy_upgrade(db: sqlite3.Connection) -> None:
        """A file from before the numbered migrations: its tables (as the first
        release made them) and the columns added since, one by one."""
        for statement in _LEGACY_SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        for table, column, decl in _ADDED_COLUMNS:
            have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
        db.execute(
            "CREATE INDEX IF NOT EXISTS helper_reports_time ON helper_reports (task_id, time)"
        )
        db.execute(
            "CREATE INDEX IF NOT EXISTS helper_reports_job ON helper_reports (task_id, job_id)"
        )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            # Both take effect only on a new, empty file (before WAL and
            # tables), the page size only before auto_vacuum (which fixes
            # it). Incremental auto-vacuum lets reclaim_space return pages
            # freed by garbage collection without rewriting the whole
            # database; on the page size see PAGE_SIZE.
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("PRAGMA journal_mode=WAL")
            # After a checkpoint, a WAL file larger than this is cut back to it
            # (by default it keeps its largest size forever).
            conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def claim_single_process(self) -> None:
        """Make this process the only server on the database, or raise StoreInUse.

        SQLite serves one process: a second server on the same file would
        contend for its one write lock and, bound to the same port with
        SO_REUSEPORT, take half the calls. Tools that only read (veil status)
        do not claim. The claim is an flock on a file beside the database (not
        on the database itself, whose POSIX locks a close() would drop)."""
        if self._claim is not None or self.path == ":memory:" or self.path.startswith("file:"):
            return
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreInUse(
                f"the SQLite database {self.path} is in use by another veil process;"
                " SQLite serves one process: to run several, use PostgreSQL"
                " (docs/reports/SCALING.md)"
            ) from None
        self._claim = fd

    def _read(self, work: Callable[[Tx], T]) -> T:
        # Autocommit: each statement reads the latest committed state.
        return work(SqliteTx(self._conn()))

    def _write(self, work: Callable[[Tx], T]) -> T:
        with self._tx() as db:
            return work(SqliteTx(db))

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        if self._claim is not None:
            os.close(self._claim)
            self._claim = None

    # --- what SQLite does its own way -------------------------------------

    def reclaim_space(self, full: bool = False) -> None:
        """Return free pages to the file system and truncate the WAL.

        Without `full`, only files created with auto_vacuum=INCREMENTAL
        (every file this version creates) shrink; `full` rewrites the whole
        file (VACUUM) and needs a moment without writers.
        """
        db = self._conn()
        if full:
            db.execute("VACUUM")
            # TRUNCATE waits for readers and briefly holds off writers: fine
            # for an operator's command, not for the server's background pass.
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        else:
            # executescript steps the pragma to completion; execute() would
            # free a single page.
            db.executescript("PRAGMA incremental_vacuum;")
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with suppress(FileNotFoundError):
                total += Path(self.path + suffix).stat().st_size
        return total
