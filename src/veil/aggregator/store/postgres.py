"""The `Datastore` and the budget `LedgerStore` on PostgreSQL (psycopg 3 and its pool).

For deployments that outgrow one machine: any number of leader front ends,
`veil worker` and `veil helper` processes share one database. The units of
work are written once in veil.aggregator.store; this module runs them. Every
unit of work is one
transaction at REPEATABLE READ; when PostgreSQL cannot serialise it against a
concurrent one (serialization failure, deadlock) the whole unit is run again
from the start, so a method either commits once or raises.

Where several processes meet:
- Jobs are leased (`lease_owner`, `lease_expiry` in the database's clock) and
  taken with `FOR UPDATE SKIP LOCKED`, so workers never wait on each other's
  jobs; an expired lease is taken over.
- A batch aggregate is kept in shard rows: a job reads its own shard of the
  bucket `FOR UPDATE`, merges its delta in with the caller's `merge` and
  writes it back in the job's transaction, so jobs on other shards of the
  bucket do not wait for it.
- An upload, and a helper job, holds its buckets' lock rows (shard 0) `FOR
  SHARE`, so it cannot interleave with the closing of a batch for collection,
  which takes them `FOR UPDATE`. The helper's close reads the shards at READ
  COMMITTED, after its locks are granted (see collection_jobs.commit_helper_collection).
- Ledger transactions run at READ COMMITTED and lock the task and survey rows
  a spend reads (FOR UPDATE), so spends on one task or survey run one after
  another, each seeing every spend committed before it
  (veil.aggregator.store.ledger).

The schema is created and migrated at start, under an advisory lock, so
processes starting together apply each migration once.
"""

from __future__ import annotations

import logging
import secrets
import time as _time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.array import ListBinaryDumper
from psycopg_pool import ConnectionPool

from veil.aggregator.store.base import Datastore
from veil.aggregator.store.ledger import LedgerTx
from veil.aggregator.store.migrations import MIGRATIONS, SCHEMA_TABLE, check_version
from veil.aggregator.store.tx import IdArray, PostgresTx, Tx

log = logging.getLogger(__name__)

T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]

# Advisory lock keys (any constants unique to veil).
_MIGRATION_LOCK = 0x7665696C0001

# How often a unit of work is retried after a serialization failure, and the
# longest pause between tries (jittered, growing).
MAX_ATTEMPTS = 30
_MAX_PAUSE = 0.2


def storage_label(storage: Path | str) -> str:
    """The storage as it may be shown or logged: a PostgreSQL URL loses its password."""
    if isinstance(storage, Path):
        return str(storage)
    params = conninfo_to_dict(storage)
    user, host, db = (params.get(k, "") for k in ("user", "host", "dbname"))
    return f"postgresql://{user}@{host}/{db}"


def migrate(conninfo: str) -> int:
    """Bring the database's schema up to date; returns the version it now has."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        with conn.transaction():
            # Taken first, so each later statement (READ COMMITTED) sees what a
            # process that migrated before us committed.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(SCHEMA_TABLE)
            row = conn.execute("SELECT max(version) FROM veil_schema").fetchone()
            current = int(row[0]) if row is not None and row[0] is not None else 0
            check_version(current)
            for version in range(current + 1, len(MIGRATIONS) + 1):
                conn.execute(MIGRATIONS[version - 1].encode())
                conn.execute("INSERT INTO veil_schema VALUES (%s, %s)", (version, _time.time()))
                log.info("database schema migrated to version %d", version)
    return len(MIGRATIONS)


def _configure(conn: Conn) -> None:
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.adapters.register_dumper(IdArray, ListBinaryDumper)


def open_pool(conninfo: str, max_size: int = 8) -> ConnectionPool[Conn]:
    """A connection pool whose connections run transactions at REPEATABLE READ."""
    return ConnectionPool(
        conninfo,
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=_configure,
        open=True,
        name="veil",
    )


class PostgresDatastore(Datastore):
    """`Datastore` on PostgreSQL, safe to share between any number of processes."""

    def __init__(self, conninfo: str, pool_size: int = 8) -> None:
        migrate(conninfo)
        self.pool = open_pool(conninfo, pool_size)

    def close(self) -> None:
        self.pool.close()

    def _read(self, work: Callable[[Tx], T]) -> T:
        # Autocommit, as SQLite's reads: each statement reads the latest
        # committed state on its own. A transaction block would add a BEGIN
        # and a COMMIT round trip to every read, and the helper makes three
        # for each aggregation job.
        with self.pool.connection() as conn:
            return work(PostgresTx(conn))

    def _write(self, work: Callable[[Tx], T]) -> T:
        return self._run(lambda db: work(PostgresTx(db)))

    def _write_fresh(self, work: Callable[[Tx], T]) -> T:
        return self._run(lambda db: work(PostgresTx(db)), psycopg.IsolationLevel.READ_COMMITTED)

    def _run(
        self,
        work: Callable[[Conn], T],
        isolation: psycopg.IsolationLevel = psycopg.IsolationLevel.REPEATABLE_READ,
    ) -> T:
        """Run `work` in one transaction (REPEATABLE READ unless told), again
        if it cannot be serialised."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            with self.pool.connection() as conn:
                # The pool's connections run at REPEATABLE READ (_configure);
                # only a unit that asks for another level changes it, and back.
                other = isolation != conn.isolation_level
                try:
                    if other:
                        conn.isolation_level = isolation
                    with conn.transaction():
                        return work(conn)
                except (pg_errors.SerializationFailure, pg_errors.DeadlockDetected) as e:
                    if attempt == MAX_ATTEMPTS:
                        raise
                    log.debug("retrying a transaction (attempt %d): %s", attempt, type(e).__name__)
                finally:
                    if other:
                        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            pause = min(_MAX_PAUSE, 0.002 * 2 ** min(attempt, 7))
            _time.sleep(pause * (0.5 + secrets.randbelow(1000) / 1000))
        raise AssertionError("unreachable")

    # --- what PostgreSQL does its own way ---------------------------------

    def _tables(self, db: Conn) -> list[str]:
        return [
            str(r[0])
            for r in db.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY c.relname"
            )
        ]

    def reclaim_space(self, full: bool = False) -> None:
        """VACUUM veil's tables: dead rows become reusable and empty pages at a
        table's end go back to the file system (autovacuum would get there too,
        later). `full` rewrites every table (VACUUM FULL: it locks each table
        while it runs, so it is for an operator's command, not the background pass).
        """
        command = "VACUUM FULL {}" if full else "VACUUM {}"
        with self.pool.connection() as conn:
            # VACUUM cannot run in a transaction; the pool's connections autocommit.
            for table in self._tables(conn):
                conn.execute(sql.SQL(command).format(sql.Identifier(table)))

    def size_bytes(self) -> int:
        """Bytes of veil's tables (with their indexes and TOAST) in this schema."""
        row = self._run(
            lambda db: db.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND c.relkind = 'r'"
            ).fetchone()
        )
        assert row is not None
        return int(row[0])


# --------------------------------------------------------------------------- ledger


class PostgresLedgerStore:
    """veil.dp's LedgerStore in PostgreSQL: durable, and spends atomic across processes.

    The statements are veil.aggregator.store.ledger's. Its transactions run at
    READ COMMITTED: a spend locks its task's and its survey's rows as it reads
    them (FOR UPDATE), and every statement after the lock is granted sees what
    the previous holder committed, so two collections can never both pass when
    only one fits, while spends on unrelated tasks do not wait for each other.
    """

    def __init__(self, conninfo: str, pool: ConnectionPool[Conn] | None = None) -> None:
        migrate(conninfo)
        self._own_pool = pool is None
        self._pool = pool if pool is not None else open_pool(conninfo, 2)

    def close(self) -> None:
        if self._own_pool:
            self._pool.close()

    @contextmanager
    def transaction(self) -> Iterator[LedgerTx]:
        with self._pool.connection() as conn:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            try:
                with conn.transaction():
                    yield LedgerTx(PostgresTx(conn))
            finally:
                # The pool's connections run at REPEATABLE READ (_configure).
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
