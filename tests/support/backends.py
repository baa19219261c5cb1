"""The storage backends the suite runs on: SQLite files and a real PostgreSQL."""

from __future__ import annotations

import secrets
from pathlib import Path

from bench.postgres import as_url, with_schema
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.ledger import sqlite_ledger
from veil.aggregator.store.postgres import PostgresDatastore, PostgresLedgerStore
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.dp import BudgetLedger, LedgerStore

KINDS = ("sqlite", "postgres")


class Backend:
    """Each party's store and ledger on one backend (a party is any name:
    "leader", "helper", ...); every call opens them again, as a restarted
    process would. `dsn` is the PostgreSQL server's, None for SQLite."""

    def __init__(self, tmp: Path, dsn: str | None) -> None:
        self.tmp, self.dsn = tmp, dsn
        self.kind = "sqlite" if dsn is None else "postgres"
        self.opened: list[SqliteDatastore | PostgresDatastore | PostgresLedgerStore] = []
        self.schemas: dict[str, str] = {}

    def conninfo(self, party: str) -> str | None:
        """The party's PostgreSQL conninfo (its own schema), None on SQLite."""
        if self.dsn is None:
            return None
        if party not in self.schemas:
            self.schemas[party] = with_schema(self.dsn, f"{party}_{secrets.token_hex(4)}")
        return self.schemas[party]

    def path(self, party: str) -> Path:
        return self.tmp / f"{party}.db"

    def storage_setting(self, party: str) -> str:
        """What a server config's `storage = ...` says for this party's store."""
        conninfo = self.conninfo(party)
        return self.path(party).name if conninfo is None else as_url(conninfo)

    def store(self, party: str, pool_size: int = 2) -> Datastore:
        conninfo = self.conninfo(party)
        store = (
            SqliteDatastore(self.path(party))
            if conninfo is None
            else PostgresDatastore(conninfo, pool_size=pool_size)
        )
        self.opened.append(store)
        return store

    def ledger(self, party: str) -> str | LedgerStore:
        """What PrivacyEngine takes: the SQLite path, or a PostgreSQL ledger store."""
        conninfo = self.conninfo(party)
        if conninfo is None:
            return str(self.path(party))
        ledger = PostgresLedgerStore(conninfo)
        self.opened.append(ledger)
        return ledger

    def budget_ledger(self, party: str) -> BudgetLedger:
        store = self.ledger(party)
        return sqlite_ledger(store) if isinstance(store, str) else BudgetLedger(store)

    def close(self) -> None:
        for s in self.opened:
            s.close()
