"""The budget ledger's storage (veil.aggregator.store.ledger, and its
PostgreSQL store in veil.aggregator.store.postgres): durable, exact, and two
concurrent charges never both pass when only one fits, on both backends."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from fractions import Fraction
from pathlib import Path

import psycopg
import pytest

from tests.support.backends import Backend
from veil.aggregator.store.ledger import LedgerTx, SqliteLedgerStore, sqlite_ledger
from veil.aggregator.store.postgres import PostgresLedgerStore
from veil.aggregator.store.tx import PostgresTx, SqliteTx
from veil.dp import (
    BudgetExceeded,
    BudgetLedger,
    InvalidParameter,
    LedgerStore,
    LedgerTransaction,
    Spend,
    SurveyBudget,
    TaskBudget,
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "aggregator.db"


def test_ledger_is_durable_and_exact_on_disk(db: Path) -> None:
    sqlite_ledger(db).add_task("t", "0.3")
    sqlite_ledger(db).spend("t", "0.1", collection_id="c")
    reopened = sqlite_ledger(db)
    assert reopened.remaining("t") == Fraction(1, 5)
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        tables = {row[0] for row in rows}
        stored = conn.execute("SELECT amount FROM dp_spends").fetchone()[0]
    assert tables == {"dp_surveys", "dp_tasks", "dp_spends"}
    assert stored == "1/10"  # exact text, not the float 0.1


def test_store_needs_exactly_one_source(db: Path) -> None:
    with pytest.raises(InvalidParameter):
        SqliteLedgerStore()
    with pytest.raises(InvalidParameter):
        SqliteLedgerStore(db, connect=lambda: sqlite3.connect(db))
    store = SqliteLedgerStore(connect=lambda: sqlite3.connect(db))
    BudgetLedger(store).add_task("t", 1)
    assert sqlite_ledger(db).remaining("t") == 1


class SlowTx:
    """A LedgerTransaction that pauses after reading a task's spends, to widen
    the window in which a concurrent charge could read the same spends."""

    def __init__(self, tx: LedgerTransaction) -> None:
        self.tx = tx

    def survey(self, survey_id: str) -> SurveyBudget | None:
        return self.tx.survey(survey_id)

    def task(self, task_id: str) -> TaskBudget | None:
        return self.tx.task(task_id)

    def survey_tasks(self, survey_id: str) -> Sequence[TaskBudget]:
        return self.tx.survey_tasks(survey_id)

    def spends(self, task_id: str) -> Sequence[Spend]:
        rows = self.tx.spends(task_id)
        time.sleep(0.02)
        return rows

    def spend(self, collection_id: str) -> Spend | None:
        return self.tx.spend(collection_id)

    def add_survey(self, survey: SurveyBudget) -> bool:
        return self.tx.add_survey(survey)

    def add_task(self, task: TaskBudget) -> bool:
        return self.tx.add_task(task)

    def add_spend(self, spend: Spend) -> None:
        self.tx.add_spend(spend)


class Slow:
    """A LedgerStore whose transactions are SlowTx over another store's."""

    def __init__(self, transaction: Callable[[], AbstractContextManager[LedgerTransaction]]):
        self._transaction = transaction

    @contextmanager
    def transaction(self) -> Iterator[SlowTx]:
        with self._transaction() as tx:
            yield SlowTx(tx)


def _store(backend: Backend, party: str) -> LedgerStore:
    """A store of its own (its own connections, as another process would have)."""
    ledger = backend.ledger(party)
    return SqliteLedgerStore(ledger) if isinstance(ledger, str) else ledger


def _race(stores: Sequence[LedgerStore], charges: Sequence[tuple[str, str]]) -> list[str]:
    """Run one charge per store at once; the outcome of each, in order."""
    barrier = threading.Barrier(len(charges))
    outcomes = [""] * len(charges)

    def charge(i: int) -> None:
        task, amount = charges[i]
        ledger = BudgetLedger(stores[i])
        barrier.wait()
        try:
            ledger.spend(task, amount, collection_id=f"c{i}")
            outcomes[i] = "spent"
        except BudgetExceeded:
            outcomes[i] = "refused"
        except Exception as e:  # reported by the assertion, not lost in the thread
            outcomes[i] = repr(e)

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(len(charges))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


@pytest.mark.parametrize("shared", ["task", "survey"])
def test_two_charges_that_exceed_the_budget_together_cannot_both_pass(
    backend: Backend, shared: str
) -> None:
    # Two charges of 0.6 against a total of 1: on one task (its row is
    # locked), or on two tasks of one survey (the survey's row is locked).
    ledger = backend.budget_ledger("aggregator")
    if shared == "survey":
        ledger.add_survey("s", 1)
        ledger.add_task("a", 1, survey_id="s")
        ledger.add_task("b", 1, survey_id="s")
        charges = [("a", "0.6"), ("b", "0.6")]
    else:
        ledger.add_task("a", 1)
        charges = [("a", "0.6"), ("a", "0.6")]
    stores = [Slow(_store(backend, "aggregator").transaction) for _ in charges]
    assert sorted(_race(stores, charges)) == ["refused", "spent"]
    spent = sum((ledger.task_status(t).spent for t in {"a", "b"} & {c[0] for c in charges}), 0)
    assert spent == Fraction(3, 5)


def test_many_concurrent_charges_spend_exactly_what_fits(backend: Backend) -> None:
    ledger = backend.budget_ledger("aggregator")
    ledger.add_task("t", 1)
    charges = [("t", "0.3")] * 6
    stores = [Slow(_store(backend, "aggregator").transaction) for _ in charges]
    outcomes = _race(stores, charges)
    # Only three charges of 0.3 fit in 1, however the threads interleave.
    assert sorted(outcomes) == ["refused"] * 3 + ["spent"] * 3
    assert ledger.remaining("t") == Fraction(1, 10)


def test_the_race_test_can_fail_without_the_lock(db: Path) -> None:
    # Control: a transaction that reads without taking the write lock first (the
    # default deferred BEGIN) lets concurrent spends pass the check together.
    sqlite_ledger(db).add_task("t", 1)

    @contextmanager
    def deferred() -> Iterator[LedgerTransaction]:
        with closing(sqlite3.connect(db, timeout=30, isolation_level=None)) as conn:
            conn.execute("BEGIN DEFERRED")
            try:
                yield LedgerTx(SqliteTx(conn))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    stores = [Slow(deferred) for _ in range(6)]
    try:
        outcomes = _race(stores, [("t", "0.6")] * 6)
    except sqlite3.OperationalError:
        return
    # Without the up-front lock SQLite either lets two through or aborts writers
    # with "database is locked" at upgrade time; with it, exactly one spends and the
    # rest get a clear BudgetExceeded (the tests above).
    assert outcomes.count("spent") > 1 or any("OperationalError" in o for o in outcomes)


@pytest.mark.postgres
def test_the_race_test_can_fail_without_row_locks_on_postgres(postgres: str) -> None:
    # Control: the same statements without FOR UPDATE let both charges read
    # the spends before either writes, and both pass.
    class Unlocked(PostgresTx):
        for_update = ""

    store = PostgresLedgerStore(postgres)
    BudgetLedger(store).add_task("t", 1)
    store.close()

    @contextmanager
    def unlocked() -> Iterator[LedgerTransaction]:
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            with conn.transaction():
                yield LedgerTx(Unlocked(conn))

    # Both charges meet after each read of the spends, so both have read
    # before either writes (with the row lock the second could not get there).
    meeting = threading.Barrier(2, timeout=30)

    class Meeting(SlowTx):
        def spends(self, task_id: str) -> Sequence[Spend]:
            rows = self.tx.spends(task_id)
            meeting.wait()
            return rows

    @contextmanager
    def meet() -> Iterator[Meeting]:
        with unlocked() as tx:
            yield Meeting(tx)

    stores = [Meets(meet), Meets(meet)]
    assert _race(stores, [("t", "0.6"), ("t", "0.6")]) == ["spent", "spent"]


class Meets:
    """A LedgerStore over a given transaction factory (for the control above)."""

    def __init__(self, transaction: Callable[[], AbstractContextManager[LedgerTransaction]]):
        self.transaction = transaction


@pytest.mark.postgres
def test_registering_one_budget_at_once_from_two_processes(postgres: str) -> None:
    # No row to lock yet: two stores adding the same task at the same time
    # both succeed (the second finds the first's row); a different total is
    # still refused as a change.
    stores = [PostgresLedgerStore(postgres) for _ in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def register(store: PostgresLedgerStore) -> None:
        barrier.wait()
        try:
            BudgetLedger(store).add_task("t", 1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=register, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    with pytest.raises(InvalidParameter, match="immutable"):
        BudgetLedger(stores[0]).add_task("t", 2)
    for s in stores:
        s.close()
