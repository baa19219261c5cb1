"""Opening an aggregator's storage: its store and its budget ledger, side by
side in one database (SQLite file or PostgreSQL), for the servers and the
operator commands alike."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from veil.aggregator.privacy import PrivacyEngine, refuse_exact_release
from veil.aggregator.run.config import ConfigError, ServerConfig
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.ledger import sqlite_ledger
from veil.aggregator.store.records import StoreInUse
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.dp import BudgetLedger, LedgerStore


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
    # Imported here: psycopg costs a server on SQLite a fifth of its start-up.
    from veil.aggregator.store.postgres import PostgresDatastore, PostgresLedgerStore

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
