"""The privacy budget ledger's rules (veil.dp.budget), on each of its stores
(SQLite and PostgreSQL, through the suite's backend fixture) and in memory.
What only the stores promise (durability, concurrent spends) is tested in
tests/aggregator/store/test_ledger_store.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.backends import Backend
from veil.dp import (
    Batch,
    BudgetExceeded,
    BudgetLedger,
    BudgetUnit,
    DPConfig,
    InvalidParameter,
    NoiseMode,
    NoisePlan,
    Spend,
    SurveyBudget,
    TaskBudget,
    UnknownTask,
)


@pytest.fixture
def ledger(backend: Backend) -> BudgetLedger:
    """The ledger on each LedgerStore: SQLite and a real PostgreSQL."""
    return backend.budget_ledger("aggregator")


def test_spends_until_exhausted_then_refuses_with_reasons(ledger: BudgetLedger) -> None:
    ledger.add_task("t", "1")
    ledger.spend("t", "0.4")
    ledger.spend("t", "0.4")
    with pytest.raises(BudgetExceeded) as refused:
        ledger.spend("t", "0.4")
    assert refused.value.asked == Fraction(2, 5)
    assert refused.value.remaining == Fraction(1, 5)
    assert "task 't'" in refused.value.why and "total of 1" in refused.value.why
    assert "asked for 2/5" in str(refused.value) and "1/5" in str(refused.value)
    # The refusal changed nothing: exactly the remainder still fits.
    assert ledger.remaining("t") == Fraction(1, 5)
    ledger.spend("t", Fraction(1, 5))
    assert ledger.remaining("t") == 0
    with pytest.raises(BudgetExceeded):
        ledger.spend("t", Fraction(1, 10**9))


def test_exact_arithmetic_has_no_rounding(ledger: BudgetLedger) -> None:
    ledger.add_task("t", 1)
    for _ in range(3):
        ledger.spend("t", Fraction(1, 3))
    assert ledger.remaining("t") == 0  # 3 x 1/3 is exactly 1, not 0.9999...


def test_unknown_task_is_refused(ledger: BudgetLedger) -> None:
    with pytest.raises(UnknownTask, match="'nope'"):
        ledger.spend("nope", 1)
    with pytest.raises(UnknownTask):
        ledger.remaining("nope")
    with pytest.raises(UnknownTask, match="survey"):
        ledger.add_task("t", 1, survey_id="missing")


@pytest.mark.parametrize("amount", [0, -1, "inf", "nan", 21, float("inf"), "x"])
def test_bad_amounts_are_refused_and_change_nothing(ledger: BudgetLedger, amount) -> None:
    ledger.add_task("t", 2)
    with pytest.raises(InvalidParameter):
        ledger.spend("t", amount)
    assert ledger.remaining("t") == 2
    with pytest.raises(InvalidParameter):
        ledger.add_task("u", amount)


def test_disjoint_batches_compose_in_parallel(ledger: BudgetLedger) -> None:
    ledger.add_task("t", 1)
    ledger.spend("t", 1, Batch(0, 3600))
    ledger.spend("t", 1, Batch(3600, 7200))  # other reports: full budget again
    with pytest.raises(BudgetExceeded):
        ledger.spend("t", "0.1", Batch(3000, 4000))  # overlaps both
    ledger.spend("t", "0.5", Batch(7200, 10800))
    assert ledger.remaining("t", Batch(7200, 9000)) == Fraction(1, 2)
    assert ledger.remaining("t", Batch(0, 100)) == 0
    assert ledger.remaining("t", Batch(20000, 30000)) == 1
    assert ledger.remaining("t") == 0  # "everything" overlaps the exhausted batches


def test_survey_composes_sequentially_across_tasks(ledger: BudgetLedger) -> None:
    ledger.add_survey("s", 1)
    ledger.add_task("a", 1, survey_id="s")
    ledger.add_task("b", 1, survey_id="s")
    ledger.spend("a", "0.6", Batch(0, 10))
    ledger.spend("b", "0.3")
    with pytest.raises(BudgetExceeded) as refused:
        ledger.spend("b", "0.2")
    assert "survey 's'" in refused.value.why
    assert refused.value.remaining == Fraction(1, 10)
    # Task a's peak can rise to 0.7 in total, on its first batch or another one.
    assert ledger.remaining("a", Batch(10, 20)) == Fraction(7, 10)
    assert ledger.remaining("a", Batch(0, 10)) == Fraction(1, 10)
    ledger.spend("a", "0.7", Batch(10, 20))  # parallel to the 0.6: peak 0.7
    assert ledger.remaining("b") == 0


def test_zcdp_task_needs_a_zcdp_survey(ledger: BudgetLedger) -> None:
    ledger.add_survey("s", 1, BudgetUnit.EPSILON)
    with pytest.raises(InvalidParameter, match="zCDP"):
        ledger.add_task("g", "0.5", BudgetUnit.RHO, survey_id="s")


def test_mixed_survey_composes_under_zcdp(ledger: BudgetLedger) -> None:
    # Issue 14 item 5: a pure task in a zCDP survey costs it ε²/2 per collection,
    # while its own budget stays in ε.
    ledger.add_survey("s", 1, BudgetUnit.RHO)
    ledger.add_task("t", 2, BudgetUnit.EPSILON, survey_id="s")
    ledger.add_task("g", 1, BudgetUnit.RHO, survey_id="s")
    ledger.spend("g", "0.5")
    ledger.spend("t", "0.5")  # ρ 1/8
    assert ledger.survey_status("s").spent == Fraction(5, 8)
    assert ledger.survey_status("s").unit is BudgetUnit.RHO
    assert ledger.task_status("t").spent == Fraction(1, 2)
    # Room ρ 3/8: a further ε x on t fits while x²/2 <= 3/8, x <= √(3/4) ≈ 0.866.
    remaining = ledger.remaining("t")
    assert remaining * remaining / 2 <= Fraction(3, 8)
    assert float(remaining) == pytest.approx(0.75**0.5, abs=1e-9)
    with pytest.raises(BudgetExceeded, match="survey 's'"):
        ledger.spend("t", "0.9")
    ledger.spend("t", "0.866")
    with pytest.raises(BudgetExceeded):
        ledger.spend("t", "0.01")
    with pytest.raises(BudgetExceeded):
        ledger.spend("g", "0.001")
    assert ledger.survey_status("s").spent <= 1


def test_budgets_are_immutable_and_registration_idempotent(ledger: BudgetLedger) -> None:
    ledger.add_task("t", 1)
    ledger.add_task("t", "1")  # the same again is fine
    with pytest.raises(InvalidParameter, match="immutable"):
        ledger.add_task("t", 2)
    ledger.add_survey("s", 3)
    with pytest.raises(InvalidParameter, match="immutable"):
        ledger.add_survey("s", 4)


def test_retried_collection_is_charged_once(ledger: BudgetLedger) -> None:
    ledger.add_task("t", 1)
    first = ledger.spend("t", "0.75", Batch(0, 10), collection_id="c1")
    again = ledger.spend("t", "0.75", Batch(0, 10), collection_id="c1")
    assert first == again
    assert ledger.remaining("t", Batch(0, 10)) == Fraction(1, 4)
    with pytest.raises(InvalidParameter, match="already charged"):
        ledger.spend("t", "0.1", Batch(0, 10), collection_id="c1")


def test_batch_validation() -> None:
    with pytest.raises(InvalidParameter):
        Batch(5, 5)
    with pytest.raises(InvalidParameter):
        Batch(0, 2**63)
    with pytest.raises(InvalidParameter):
        Batch(0, 1.5)  # type: ignore[arg-type]
    assert Batch(0, 10).overlaps(Batch(9, 20)) and not Batch(0, 10).overlaps(Batch(10, 20))


def test_charge_spends_what_the_plan_costs(ledger: BudgetLedger) -> None:
    ledger.add_task("eps", 1)
    ledger.add_task("rho", 1, BudgetUnit.RHO)
    geometric = NoisePlan.for_task(DPConfig.geometric("0.25"), "Prio3Count", {})
    gaussian = NoisePlan.for_task(DPConfig.gaussian("0.5"), "Prio3Count", {})
    assert ledger.charge("eps", geometric).amount == Fraction(1, 4)
    assert ledger.charge("rho", gaussian).amount == Fraction(1, 2)
    with pytest.raises(InvalidParameter, match="spends rho"):
        ledger.charge("eps", gaussian)
    with pytest.raises(UnknownTask):
        ledger.charge("missing", geometric)
    none = NoisePlan.for_task(DPConfig.none(), "Prio3Count", {})
    assert ledger.charge("eps", none) is None
    assert ledger.remaining("eps") == Fraction(3, 4)


def test_split_mode_charges_the_weaker_guarantee(ledger: BudgetLedger) -> None:
    # Issue 14 item 2: in split mode one aggregator with the collector sees only the
    # other's Pólya share, a weaker ε (1.675 for Count at ε = 1); that is what is
    # charged, not the ε the collector alone gets.
    split = NoisePlan.for_task(DPConfig.geometric(1, NoiseMode.SPLIT), "Prio3Count", {})
    assert split.server_epsilon is not None and 1.67 < split.server_epsilon < 1.68
    ledger.add_task("split", 2)
    assert ledger.charge("split", split).amount == split.server_epsilon
    with pytest.raises(BudgetExceeded):
        ledger.charge("split", split)  # 2 * 1.675 > 2, although 2 * ε = 2 would fit


class MemoryStore:
    """A LedgerStore in memory: shows the Protocol is all the ledger needs."""

    def __init__(self) -> None:
        self.surveys: dict[str, SurveyBudget] = {}
        self.tasks: dict[str, TaskBudget] = {}
        self.spends_by_id: dict[str, Spend] = {}
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[MemoryStore]:
        with self._lock:
            snapshot = (dict(self.surveys), dict(self.tasks), dict(self.spends_by_id))
            try:
                yield self
            except BaseException:
                self.surveys, self.tasks, self.spends_by_id = snapshot
                raise

    def survey(self, survey_id: str) -> SurveyBudget | None:
        return self.surveys.get(survey_id)

    def task(self, task_id: str) -> TaskBudget | None:
        return self.tasks.get(task_id)

    def survey_tasks(self, survey_id: str) -> list[TaskBudget]:
        return [t for t in self.tasks.values() if t.survey_id == survey_id]

    def spends(self, task_id: str) -> list[Spend]:
        return [s for s in self.spends_by_id.values() if s.task_id == task_id]

    def spend(self, collection_id: str) -> Spend | None:
        return self.spends_by_id.get(collection_id)

    def add_survey(self, survey: SurveyBudget) -> bool:
        return self.surveys.setdefault(survey.survey_id, survey) is survey

    def add_task(self, task: TaskBudget) -> bool:
        return self.tasks.setdefault(task.task_id, task) is task

    def add_spend(self, spend: Spend) -> None:
        self.spends_by_id[spend.collection_id] = spend


spend_requests = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.fractions(min_value=Fraction(1, 10), max_value=Fraction(3, 2), max_denominator=10),
        st.integers(min_value=0, max_value=20),
        st.integers(min_value=1, max_value=10),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(spend_requests)
def test_no_sequence_of_spends_overspends(requests) -> None:
    store = MemoryStore()
    ledger = BudgetLedger(store)
    ledger.add_survey("s", 3)
    ledger.add_task("a", 2, survey_id="s")
    ledger.add_task("b", 2, survey_id="s")
    for i, (task, amount, start, length) in enumerate(requests):
        batch = Batch(start, start + length)
        remaining = ledger.remaining(task, batch)
        try:
            ledger.spend(task, amount, batch, collection_id=str(i))
            assert amount <= remaining
        except BudgetExceeded as refused:
            assert amount > remaining == refused.remaining
    # Replay the accepted spends: at every instant each task stays within 2, and
    # the tasks' peaks sum to at most the survey's 3.
    peaks = {}
    for task in ("a", "b"):
        spends = store.spends(task)
        stacked = [
            sum((s.amount for s in spends if s.batch.start <= t < s.batch.end), Fraction(0))
            for t in range(0, 31)
        ]
        peaks[task] = max(stacked)
        assert peaks[task] <= 2
    assert peaks["a"] + peaks["b"] <= 3


def test_status_reports_loss_with_parallel_composition(ledger: BudgetLedger) -> None:
    ledger.add_survey("s", 3)
    ledger.add_task("a", 2, survey_id="s")
    ledger.add_task("b", 2, survey_id="s")
    ledger.spend("a", Fraction(1, 2), Batch(0, 10), "c1")
    ledger.spend("a", Fraction(1, 2), Batch(10, 20), "c2")  # disjoint: the loss stays 1/2
    ledger.spend("b", 1, Batch(0, 10), "c3")
    a = ledger.task_status("a")
    assert (a.total, a.spent, a.remaining, a.collections) == (2, Fraction(1, 2), Fraction(3, 2), 2)
    s = ledger.survey_status("s")
    assert (s.total, s.spent, s.remaining, s.collections) == (3, Fraction(3, 2), Fraction(3, 2), 3)
    with pytest.raises(UnknownTask):
        ledger.survey_status("nope")
