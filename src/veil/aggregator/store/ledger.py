"""The privacy budget ledger's storage: its statements, written once for both
databases over the transaction interface of `tx`, and its SQLite store.

The ledger's rules (what a spend costs, when it is refused, how tasks compose
in a survey) are veil.dp.budget's; this module only reads and writes the
three tables of migration 2 (`dp_surveys`, `dp_tasks`, `dp_spends`).

Row locks instead of one lock for every ledger transaction: reading a task's
or a survey's budget row locks it (`FOR UPDATE` on PostgreSQL, whose ledger
transactions run at READ COMMITTED so each later statement sees what the
previous holder committed). Every spend reads its task's row first and its
survey's row before it sums the survey's other tasks, so spends on one task,
or on the tasks of one survey, run one after another, and spends elsewhere do
not wait for them. SQLite's BEGIN IMMEDIATE serialises every writer already.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction

from veil.aggregator.store.migrations import MIGRATIONS, sqlite_statements
from veil.aggregator.store.tx import Row, SqliteTx, Tx
from veil.dp.budget import Batch, BudgetLedger, BudgetUnit, Spend, SurveyBudget, TaskBudget
from veil.dp.errors import InvalidParameter

# The migration that holds the ledger's tables; an SQLite ledger file of its
# own (no aggregator store beside it) is given just these.
LEDGER_MIGRATION = MIGRATIONS[1]

_TASK = "SELECT task_id, total, unit, survey_id FROM dp_tasks"
_SPEND = "SELECT collection_id, task_id, amount, batch_start, batch_end FROM dp_spends"


class LedgerTx:
    """veil.dp's LedgerTransaction over one open transaction of either database."""

    def __init__(self, tx: Tx) -> None:
        self.tx = tx

    def survey(self, survey_id: str) -> SurveyBudget | None:
        row = self.tx.one(
            "SELECT survey_id, total, unit FROM dp_surveys WHERE survey_id = ?"
            + self.tx.for_update,
            (survey_id,),
        )
        return None if row is None else SurveyBudget(row[0], Fraction(row[1]), BudgetUnit(row[2]))

    def task(self, task_id: str) -> TaskBudget | None:
        row = self.tx.one(_TASK + " WHERE task_id = ?" + self.tx.for_update, (task_id,))
        return None if row is None else _task(row)

    def survey_tasks(self, survey_id: str) -> list[TaskBudget]:
        return [_task(r) for r in self.tx.rows(_TASK + " WHERE survey_id = ?", (survey_id,))]

    def spends(self, task_id: str) -> list[Spend]:
        return [_spend(r) for r in self.tx.rows(_SPEND + " WHERE task_id = ?", (task_id,))]

    def spend(self, collection_id: str) -> Spend | None:
        row = self.tx.one(_SPEND + " WHERE collection_id = ?", (collection_id,))
        return None if row is None else _spend(row)

    # ON CONFLICT DO NOTHING: two processes registering the same budget at
    # once (no row to lock yet) both succeed, and the rules compare what the
    # other one wrote.
    def add_survey(self, survey: SurveyBudget) -> bool:
        return (
            self.tx.run(
                "INSERT INTO dp_surveys (survey_id, total, unit) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (survey.survey_id, str(survey.total), survey.unit.value),
            )
            == 1
        )

    def add_task(self, task: TaskBudget) -> bool:
        return (
            self.tx.run(
                "INSERT INTO dp_tasks (task_id, total, unit, survey_id) VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (task.task_id, str(task.total), task.unit.value, task.survey_id),
            )
            == 1
        )

    def add_spend(self, spend: Spend) -> None:
        self.tx.run(
            "INSERT INTO dp_spends (collection_id, task_id, amount, batch_start, batch_end)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                spend.collection_id,
                spend.task_id,
                str(spend.amount),
                spend.batch.start,
                spend.batch.end,
            ),
        )


def _task(row: Row) -> TaskBudget:
    return TaskBudget(str(row[0]), Fraction(row[1]), BudgetUnit(row[2]), row[3])


def _spend(row: Row) -> Spend:
    return Spend(str(row[0]), str(row[1]), Fraction(row[2]), Batch(int(row[3]), int(row[4])))


class SqliteLedgerStore:
    """veil.dp's LedgerStore in an SQLite database (the aggregator's own, in WAL mode).

    Each transaction uses a fresh connection (so threads and processes may share
    the store) and takes the write lock up front with BEGIN IMMEDIATE; a concurrent
    spend waits up to `timeout` seconds for it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        connect: Callable[[], sqlite3.Connection] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if (path is None) == (connect is None):
            raise InvalidParameter("give exactly one of a database path or a connect function")
        if connect is None:
            assert path is not None
            connect = functools.partial(sqlite3.connect, os.fspath(path), timeout=timeout)
        self._connect = connect
        conn = self._open()
        try:
            # WAL lets readers proceed during a spend; it persists in the database file.
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in sqlite_statements(LEDGER_MIGRATION):
                conn.execute(statement)
        finally:
            conn.close()

    def _open(self) -> sqlite3.Connection:
        conn = self._connect()
        # Autocommit at the driver level, so that BEGIN IMMEDIATE below is the one
        # and only transaction boundary.
        conn.isolation_level = None
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def transaction(self) -> Iterator[LedgerTx]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        conn = self._open()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield LedgerTx(SqliteTx(conn))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()


def sqlite_ledger(path: str | os.PathLike[str]) -> BudgetLedger:
    """A ledger in the SQLite database at `path` (its dp_ tables made if missing)."""
    return BudgetLedger(SqliteLedgerStore(path))
