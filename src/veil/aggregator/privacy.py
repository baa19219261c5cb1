"""The DP step of an aggregator: budget and noise on its aggregate share (veil.dp).

Each aggregator calls `release` once per collected batch, before sealing its
share to the collector; the caller stores the result and serves the same
bytes on every retry, so released noise is never re-sampled. The spend is
keyed by the collection job id, so a retry after a crash between the spend
and the store is not charged twice (and the first draw, never released, is
simply discarded).

Noise is drawn ahead of the request by a background thread (two vectors per
task kept ready, see NoisePool): the exact samplers take a data-independent
but random time, and drawing inside the request would let its latency hint at
the noise's magnitude. So a request never waits for a draw: with no vector
ready it is refused as retryable (UNAVAILABLE) before any budget is spent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from veil.aggregator.errors import (
    BudgetExhausted,
    InvalidMessage,
    NoiseFailed,
    NoiseUnavailable,
)
from veil.aggregator.store.ledger import sqlite_ledger
from veil.dp import (
    Batch,
    BudgetExceeded,
    BudgetLedger,
    BudgetUnit,
    DPError,
    LedgerStore,
    NoisePlan,
    apply_noise,
    draw_noise,
)
from veil.dp.accounting import decimal_text
from veil.metrics import Metrics
from veil.task import MAX_QUERY_PREFIXES, Task, b64e
from veil.vdaf import Prio3

log = logging.getLogger(__name__)


def _unit(task: Task) -> BudgetUnit:
    return BudgetUnit.RHO if task.dp.unit == "rho" else BudgetUnit.EPSILON


def _survey_unit(task: Task) -> BudgetUnit:
    if task.dp.survey_unit is not None:
        return BudgetUnit(task.dp.survey_unit)
    return _unit(task)


# Noise vectors kept ready per task. Two, so that two back-to-back collections
# (which one peer can send) are both served from vectors drawn beforehand.
READY_PER_TASK = 2


class NoisePool:
    """Noise vectors drawn ahead of the requests, READY_PER_TASK per task, by one
    background thread.

    `take` never waits for a draw: with no vector ready it raises NoiseUnavailable
    (retryable: the caller answers UNAVAILABLE and the leader retries), so the
    time of a request never depends on the noise it releases. A draw that raises
    is logged and kept: the task's later `take` calls raise NoiseFailed naming
    it, and the thread goes on drawing for the other tasks (it never dies).
    """

    def __init__(
        self,
        ready_per_task: int = READY_PER_TASK,
        draw: Callable[[NoisePlan, int], list[int]] = draw_noise,
    ) -> None:
        self.ready_per_task = ready_per_task
        self._draw = draw
        self._ready: dict[bytes, deque[list[int]]] = {}
        self._plans: dict[bytes, tuple[NoisePlan, int]] = {}
        self._errors: dict[bytes, str] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, task_id: bytes, plan: NoisePlan, length: int) -> None:
        with self._cond:
            self._plans[task_id] = (plan, length)
            self._ready.setdefault(task_id, deque())
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill, name="noise", daemon=True)
            self._thread.start()

    def _next_task(self) -> bytes | None:
        """The task with the fewest ready vectors, if any lacks some (lock held)."""
        wanting = [
            t
            for t in self._plans
            if t not in self._errors and len(self._ready[t]) < self.ready_per_task
        ]
        return min(wanting, key=lambda t: len(self._ready[t])) if wanting else None

    def _fill(self) -> None:
        while True:
            with self._cond:
                task_id = self._next_task()
                while task_id is None:
                    self._cond.wait()
                    task_id = self._next_task()
                plan, length = self._plans[task_id]
            try:
                noise = self._draw(plan, length)
            except Exception as e:
                log.exception(
                    "drawing noise failed; collections of this task are refused",
                    extra={"task_id": b64e(task_id)},
                )
                with self._cond:
                    self._errors[task_id] = f"{type(e).__name__}: {e}"
                    self._cond.notify_all()
                continue
            with self._cond:
                self._ready[task_id].append(noise)
                self._cond.notify_all()

    def take(self, task_id: bytes) -> list[int]:
        """The task's next noise vector, at once. Raises NoiseFailed if drawing it
        failed, NoiseUnavailable if none is ready yet."""
        with self._cond:
            error = self._errors.get(task_id)
            if error is not None:
                raise NoiseFailed(
                    f"drawing noise for task {b64e(task_id)} failed ({error}); nothing was"
                    " spent; see the server's log"
                )
            ready = self._ready.get(task_id)
            if not ready:
                raise NoiseUnavailable(
                    f"no noise vector is ready yet for task {b64e(task_id)}; retry shortly"
                )
            noise = ready.popleft()
            self._cond.notify_all()
            return noise

    def put_back(self, task_id: bytes, noise: list[int]) -> None:
        """Return a vector taken for a release that did not happen (never released,
        so it may serve the next one)."""
        with self._cond:
            self._ready[task_id].appendleft(noise)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every task has a full set of vectors (or failed); True if so."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._next_task() is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def ready_count(self, task_id: bytes) -> int:
        with self._cond:
            return len(self._ready.get(task_id, ()))


class ExactReleaseRefused(ValueError):
    """A task publishes exact sums (mechanism = "none") and this aggregator's own
    configuration does not allow it."""


def refuse_exact_release(tasks: Iterable[Task], allowed: bool) -> None:
    """DP fails closed: each aggregator releases un-noised shares only if its own
    operator opted in (`allow_exact_release = true` in its server config); the
    other aggregator's or the task author's choice is not enough."""
    exact = [t.id_text for t in tasks if not t.dp.has_noise]
    if exact and not allowed:
        raise ExactReleaseRefused(
            f'task {exact[0]} has [dp] mechanism = "none": this aggregator would release'
            " its share without noise (no differential privacy); refused unless this"
            " server's own config says allow_exact_release = true"
            + (f" ({len(exact)} such tasks)" if len(exact) > 1 else "")
        )


class PrivacyEngine:
    """Budget ledger (in the aggregator's own database) and noise.

    `ledger` is the path of an SQLite file, or a LedgerStore (PostgreSQL for a
    deployment whose workers share one database: every process then spends
    from the same durable ledger, atomically).
    """

    def __init__(
        self,
        ledger: str | LedgerStore,
        tasks: Iterable[Task],
        *,
        allow_exact_release: bool = False,
    ) -> None:
        tasks = list(tasks)
        self.allow_exact_release = allow_exact_release
        refuse_exact_release(tasks, allow_exact_release)
        self.ledger = sqlite_ledger(ledger) if isinstance(ledger, str) else BudgetLedger(ledger)
        self.pool = NoisePool()
        self.add_tasks(tasks)

    def add_tasks(self, tasks: Iterable[Task]) -> None:
        """Register tasks with the ledger and the noise pool (at start, and for
        tasks a running server loads on SIGHUP)."""
        tasks = list(tasks)
        refuse_exact_release(tasks, self.allow_exact_release)
        for task in tasks:
            # What each collection charges: the weaker of the task's two guarantees
            # (NoisePlan.charge), so that both ledgers bound what the collector with
            # one aggregator learns, not only what the collector alone does.
            total = task.dp.total(task.vdaf)
            if total is None:
                log.warning(
                    "task %s has DP mechanism none: shares leave without noise"
                    " (allowed by allow_exact_release = true)",
                    task.id_text,
                )
                continue
            unit = _unit(task)
            if task.dp.survey is not None:
                assert task.dp.survey_budget is not None  # DpSpec requires it with survey
                self.ledger.add_survey(task.dp.survey, task.dp.survey_budget, _survey_unit(task))
            self.ledger.add_task(task.id_text, total, unit, task.dp.survey)
            if task.vdaf.is_prefix:
                # One vector long enough for any query; a release uses its
                # first value per prefix, so its time never depends on how
                # many prefixes it names.
                length = MAX_QUERY_PREFIXES
            else:
                length = len(task.vdaf.instantiate().agg_init(None))
            self.pool.add(task.task_id, task.dp.plan(task.vdaf), length)

    def report_budget(self, task: Task, metrics: Metrics) -> None:
        """Export the task's (and its survey's) spent and remaining budget."""
        if not task.dp.has_noise:
            return
        rows = [(task.id_text, self.ledger.task_status(task.id_text))]
        if task.dp.survey is not None:
            rows.append((f"survey:{task.dp.survey}", self.ledger.survey_status(task.dp.survey)))
        for label, status in rows:
            unit = status.unit.value
            metrics.budget_spent.labels(label, unit).set(float(status.spent))
            metrics.budget_remaining.labels(label, unit).set(float(status.remaining))

    def check(
        self, task: Task, start: int, duration: int, collection_id: bytes | None = None
    ) -> None:
        """Raise BudgetExhausted if collecting this batch would exceed the budget.

        A collection that was already charged (`collection_id`: a retry after
        a crash between the spend and the store of its share) passes: its
        spend is counted once, by `release`, which repeats it without charging
        again. Counting it here too refused the retry, and the batch was lost."""
        amount = task.dp.charge(task.vdaf)
        if amount is None:
            return
        if collection_id is not None:
            spent = self.ledger.recorded(collection_id.hex())
            if spent is not None and spent.task_id == task.id_text:
                return
        remaining = self.ledger.remaining(task.id_text, Batch(start, start + duration))
        if amount > remaining:
            unit = "ρ" if task.dp.unit == "rho" else "ε"
            raise BudgetExhausted(
                f"privacy budget exhausted: collecting this batch spends {unit}"
                f" {decimal_text(amount)} but only {unit} {decimal_text(remaining)} remains for"
                f" task {task.id_text}" + (f" in survey {task.dp.survey}" if task.dp.survey else "")
            )

    def release(
        self,
        task: Task,
        vdaf: Prio3[Any, Any],
        collection_id: bytes,
        start: int,
        duration: int,
        agg_share: list[int],
    ) -> tuple[list[int], Fraction]:
        """Spend the budget for `collection_id` and return (noised share, amount spent).

        The amount is `NoisePlan.charge`: in split mode the weaker ε against the
        collector with one aggregator, not the configured ε."""
        return self.release_in(task, vdaf.field.MODULUS, collection_id, start, duration, agg_share)

    def release_in(
        self,
        task: Task,
        modulus: int,
        collection_id: bytes,
        start: int,
        duration: int,
        agg_share: list[int],
    ) -> tuple[list[int], Fraction]:
        """`release` for a share in the field of `modulus`; a Poplar1 level's
        prefix counts take the first len(agg_share) values of a noise vector
        drawn for MAX_QUERY_PREFIXES, each charged as one level's query."""
        amount = task.dp.charge(task.vdaf)
        if amount is None:
            return agg_share, Fraction(0)
        # The noise first: whatever stops a release, it stops it before the spend.
        noise = self.pool.take(task.task_id)
        try:
            self.ledger.spend(
                task.id_text, amount, Batch(start, start + duration), collection_id.hex()
            )
        except BudgetExceeded as e:
            self.pool.put_back(task.task_id, noise)
            raise BudgetExhausted(f"privacy budget exhausted: {e}") from None
        except DPError as e:
            self.pool.put_back(task.task_id, noise)
            raise InvalidMessage(f"budget ledger refused the spend: {e}") from None
        except BaseException:
            self.pool.put_back(task.task_id, noise)
            raise
        return apply_noise(agg_share, noise[: len(agg_share)], modulus), amount
