"""Fixtures of the aggregator tests: the stores of both aggregators on each backend."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres_server import with_schema
from veil.aggregator.postgres import PostgresDatastore, PostgresLedgerStore
from veil.aggregator.storage import Datastore, SqliteDatastore
from veil.dp import LedgerStore


class Backend:
    """Each aggregator's store and ledger on one backend; every call opens them
    again, as a restarted process would."""

    def __init__(self, tmp: Path, dsn: str | None) -> None:
        self.tmp, self.dsn = tmp, dsn
        self.opened: list[SqliteDatastore | PostgresDatastore | PostgresLedgerStore] = []
        self.schemas = {
            role: None if dsn is None else with_schema(dsn, f"{role}_{secrets.token_hex(4)}")
            for role in ("leader", "helper")
        }

    def store(self, role: str) -> Datastore:
        conninfo = self.schemas[role]
        store = (
            SqliteDatastore(self.tmp / f"{role}.db")
            if conninfo is None
            else PostgresDatastore(conninfo, pool_size=2)
        )
        self.opened.append(store)
        return store

    def ledger(self, role: str) -> str | LedgerStore:
        conninfo = self.schemas[role]
        if conninfo is None:
            return str(self.tmp / f"{role}.db")
        ledger = PostgresLedgerStore(conninfo)
        self.opened.append(ledger)
        return ledger

    def close(self) -> None:
        for s in self.opened:
            s.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = Backend(
        tmp_path, None if request.param == "sqlite" else request.getfixturevalue("postgres_server")
    )
    yield b
    b.close()
