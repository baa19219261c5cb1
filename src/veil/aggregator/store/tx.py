"""One open transaction as a unit of work sees it, on SQLite or PostgreSQL.

Statements are written once, with `?` placeholders; the PostgreSQL adapter
turns them into psycopg's `%s`. What differs between the two databases is
said here and nowhere else:

- Row locks: PostgreSQL runs units at REPEATABLE READ and locks the rows a
  unit reads in order to write (`FOR UPDATE`) or to keep them unchanged until
  it commits (`FOR SHARE`); SQLite's BEGIN IMMEDIATE already holds its one
  write lock for the whole transaction, so the clauses are empty there.
- Lists of ids: `= ANY(?)` with one array parameter on PostgreSQL, an
  `IN (?, ...)` list on SQLite (in chunks below its parameter limit).
- Many rows at once (`insert_new`, or `insert_columns` for rows held by
  columns): one INSERT over `unnest` of one array per column on
  PostgreSQL; on SQLite one INSERT over `json_each` where the rows' shape
  allows it (see `_packed_columns`), executemany otherwise.
- Taking work from a queue: `FOR UPDATE SKIP LOCKED` on PostgreSQL, so two
  workers take disjoint rows without waiting on each other.
- Updating the rows a subquery chose (`row_key`, `rows_chosen`): by their
  place, SQLite's rowid or PostgreSQL's ctid, rather than by a probe of the
  primary key's index a row (random report ids make it a B-tree of random
  keys).
- The clock of leases and retries: the database's own (`now`), so that it
  means the same on every machine sharing a PostgreSQL database.
- Locking a whole table (`lock_table`): PostgreSQL's LOCK TABLE, the first
  statement of a unit so that its snapshot comes after the lock; nothing on
  SQLite, whose write lock is held already.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

Row = tuple[Any, ...]

# Ids per IN (...) list on SQLite: below its limit of 32766 parameters.
ID_CHUNK = 10_000


class IdArray(list[Any]):
    """A list of byte strings (ids, ciphertexts) bound as one array
    parameter. PostgreSQL gets it in binary form (the dumper is registered on
    each connection, see veil.aggregator.store.postgres): psycopg's text form
    escapes a bytea array at about 10 µs an id, a tenth of the helper's
    whole cost per report."""


class Tx(Protocol):
    """An open transaction: statements with `?` placeholders."""

    for_update: str  # " FOR UPDATE" where the database takes row locks, else ""
    for_share: str
    skip_locked: str  # " FOR UPDATE SKIP LOCKED" where rows are locked, else ""
    now: str  # an SQL expression: the database's clock, epoch seconds
    row_key: str  # a column naming one row of a table to find it again (rows_chosen)

    def rows(self, sql: str, args: Sequence[Any] = (), binary: bool = False) -> list[Row]:
        """The statement's rows. `binary`: PostgreSQL sends the result in
        binary form, for wide byte columns (a report's ciphertexts): in text
        form each bytea arrives hex-encoded, twice its size, and psycopg
        decodes it. SQLite's results are never text-encoded."""
        ...

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None: ...
    def run(self, sql: str, args: Sequence[Any] = ()) -> int: ...
    def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None: ...
    def insert_new(
        self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> int:
        """Insert `rows` into `table`, skipping any whose key is already
        there, or was earlier in `rows`; returns how many were inserted.
        `columns` names each column with its SQL type ("bytea", "bigint"), in
        the rows' order. Table, names and types go into the statement's
        text: pass constants only."""
        ...

    def insert_columns(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        values: Sequence[Sequence[Any]],
    ) -> int:
        """`insert_new` of rows given by columns: `values` holds one sequence
        per column of `columns`, all of one length (no tuple per row to make
        where the caller holds columns already)."""
        ...

    def id_lists(self, column: str, ids: Sequence[Any]) -> Iterable[tuple[str, Sequence[Any]]]: ...
    def rows_chosen(self, subquery: str) -> str:
        """A condition true of the rows `subquery` chose, for the statement
        that chose them to update them. The subquery selects `row_key`."""
        ...

    def lock_table(self, table: str) -> None:
        """Keep other writers of `table` out until the transaction ends (a
        constant name only: it goes into the statement's text)."""
        ...


_INT64 = range(-(2**63), 2**63)


def _packed_columns(
    columns: Sequence[tuple[str, str]], values: Sequence[Sequence[Any]]
) -> tuple[str, list[Any]] | None:
    """The SELECT of an SQLite INSERT that takes rows in a few parameters
    rather than one statement per row (executemany binds and steps each row
    from Python: about 1.5 µs a row of the helper's replay records, a third
    of their insert). Each column is a value the same in every row (one
    parameter), byte strings of one length (joined, cut by substr), or the
    integers of the one column that varies (a JSON array that json_each
    walks in order, one row per element). None for rows of another shape:
    the caller inserts them one by one. `values`: the rows by columns."""
    n = len(values[0]) if values else 0
    if n < 2:
        return None
    exprs: list[str] = []
    args: list[Any] = []
    driver: list[int] | None = None
    for (_, kind), column in zip(columns, values, strict=True):
        first = column[0]
        if all(v is first for v in column):
            args.append(first)
            exprs.append(f"?{len(args)}")
        elif kind == "bytea" and all(type(v) is bytes for v in column):
            size = len(first)
            if size == 0 or any(len(v) != size for v in column):
                return None
            args.append(b"".join(column))
            exprs.append(f"substr(?{len(args)}, key * {size} + 1, {size})")
        elif kind == "bigint" and driver is None and all(type(v) is int for v in column):
            if not all(v in _INT64 for v in column):
                return None
            driver = list(column)
            exprs.append("value")
        else:
            return None
    args.append(json.dumps(driver if driver is not None else [0] * n))
    return f"SELECT {', '.join(exprs)} FROM json_each(?{len(args)})", args


def _by_column(
    columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
) -> list[list[Any]]:
    return [[row[c] for row in rows] for c in range(len(columns))]


class SqliteTx:
    """A unit's view of an SQLite transaction (BEGIN IMMEDIATE already held)."""

    for_update = ""
    for_share = ""
    skip_locked = ""
    row_key = "rowid"
    # SQLite's clock has millisecond resolution; unixepoch('subsec') needs 3.42.
    now = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def rows(self, sql: str, args: Sequence[Any] = (), binary: bool = False) -> list[Row]:
        return self.db.execute(sql, args).fetchall()

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self.db.execute(sql, args).fetchone()
        return row

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, args).rowcount

    def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None:
        self.db.executemany(sql, args)

    def insert_new(
        self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> int:
        return self._insert(table, columns, _by_column(columns, rows), rows)

    def insert_columns(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        values: Sequence[Sequence[Any]],
    ) -> int:
        return self._insert(table, columns, values, zip(*values, strict=True))

    def _insert(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        values: Sequence[Sequence[Any]],
        rows: Iterable[Sequence[Any]],
    ) -> int:
        names = ", ".join(name for name, _ in columns)
        packed = _packed_columns(columns, values)
        if packed is not None:
            select, args = packed
            return self.db.execute(
                f"INSERT INTO {table} ({names}) {select} WHERE true ON CONFLICT DO NOTHING", args
            ).rowcount
        marks = ", ".join("?" * len(columns))
        # executemany's rowcount is the sum of each row's changes: 0 for a skipped one.
        return self.db.executemany(
            f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING", rows
        ).rowcount

    def rows_chosen(self, subquery: str) -> str:
        return f"rowid IN ({subquery})"

    def lock_table(self, table: str) -> None:
        pass  # BEGIN IMMEDIATE holds the database's one write lock already

    def id_lists(self, column: str, ids: Sequence[Any]) -> Iterable[tuple[str, Sequence[Any]]]:
        for at in range(0, len(ids), ID_CHUNK):
            chunk = list(ids[at : at + ID_CHUNK])
            yield f"{column} IN ({', '.join('?' * len(chunk))})", chunk


class PostgresTx:
    """A unit's view of a psycopg transaction at REPEATABLE READ."""

    for_update = " FOR UPDATE"
    for_share = " FOR SHARE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    row_key = "ctid"
    now = "extract(epoch from clock_timestamp())"

    def __init__(self, db: Any) -> None:
        self.db = db

    @staticmethod
    def _sql(sql: str) -> bytes:
        # psycopg's placeholders are %s, and a literal % is written %%.
        return sql.replace("%", "%%").replace("?", "%s").encode()

    def rows(self, sql: str, args: Sequence[Any] = (), binary: bool = False) -> list[Row]:
        return list(self.db.execute(self._sql(sql), args, binary=binary).fetchall())

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self.db.execute(self._sql(sql), args).fetchone()
        return row

    def run(self, sql: str, args: Sequence[Any] = ()) -> int:
        rowcount: int = self.db.execute(self._sql(sql), args).rowcount
        return rowcount

    def many(self, sql: str, args: Iterable[Sequence[Any]]) -> None:
        rows = list(args)
        if not rows:
            # psycopg's executemany syncs with the server even for no rows: a
            # round trip (about 45 µs of the client's CPU) for a job without
            # rejections or deferred reports.
            return
        with self.db.cursor() as cur:
            cur.executemany(self._sql(sql), rows)

    def insert_new(
        self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> int:
        # One statement and one array per column, byte strings in binary:
        # executemany sends a statement per row and costs the client about
        # 9 µs a row of the helper's replay records, this about 1.5.
        if not rows:
            return 0
        return self.insert_columns(table, columns, list(zip(*rows, strict=True)))

    def insert_columns(
        self,
        table: str,
        columns: Sequence[tuple[str, str]],
        values: Sequence[Sequence[Any]],
    ) -> int:
        if not values or not values[0]:
            return 0
        names = ", ".join(name for name, _ in columns)
        arrays = ", ".join(f"?::{kind}[]" for _, kind in columns)
        return self.run(
            f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING",
            [
                IdArray(column) if kind == "bytea" else list(column)
                for (_, kind), column in zip(columns, values, strict=True)
            ],
        )

    def rows_chosen(self, subquery: str) -> str:
        # An array of ctids: a TID scan reaches each row at its place (an IN
        # over a subquery of ctids would scan the table). A row's ctid stays
        # while the subquery's FOR UPDATE holds it.
        return f"ctid = ANY(ARRAY({subquery}))"

    def lock_table(self, table: str) -> None:
        self.run(f"LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE")

    def id_lists(self, column: str, ids: Sequence[Any]) -> Iterable[tuple[str, Sequence[Any]]]:
        if ids:
            yield f"{column} = ANY(?)", [IdArray(ids)]
