"""What the PostgreSQL backend does its own way: the round trips a unit of
work costs (each one is CPU at the client, per aggregation job)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from veil.aggregator.store.postgres import PostgresDatastore
from veil.aggregator.store.tx import PostgresTx

pytestmark = pytest.mark.postgres

# True when the statement began its own transaction (autocommit), False
# inside a transaction block opened by an earlier BEGIN.
_OWN_TRANSACTION = (
    "SELECT xact_start = query_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)


def test_a_read_is_one_statement_without_begin_and_commit(postgres: str) -> None:
    store = PostgresDatastore(postgres, pool_size=1)
    try:
        assert store._read(lambda tx: tx.one(_OWN_TRANSACTION)) == (True,)
        # A write unit is one transaction: BEGIN went first.
        assert store._write(lambda tx: tx.one(_OWN_TRANSACTION)) == (False,)
    finally:
        store.close()


def test_many_without_rows_sends_nothing(postgres: str, tmp_path: Path) -> None:
    trace = tmp_path / "libpq.trace"
    with psycopg.connect(postgres, autocommit=True) as conn, trace.open("w") as out:
        conn.pgconn.trace(out.fileno())
        tx = PostgresTx(conn)
        tx.many("INSERT INTO no_such_table VALUES (?)", [])
        out.flush()
        assert trace.read_text() == ""  # no message at all (executemany syncs)
        with pytest.raises(psycopg.errors.UndefinedTable):
            tx.many("INSERT INTO no_such_table VALUES (?)", [(1,)])
        conn.pgconn.untrace()
