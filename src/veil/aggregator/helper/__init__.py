"""The helper's logic (draft-ietf-ppm-dap sections 4.5 and 4.6, helper side).

The helper trusts the leader with nothing it can check itself: it
authenticates every call, refuses replayed report ids, late or early reports
and reports in collected batches, verifies each proof jointly with the
leader's verifier share, and releases a batch only once, only if its own
count and checksum equal the leader's, and only above min_batch_size.

`Helper` is what its callers see (the gRPC service, the tests): the tasks
it serves, its keys, and its parts, each built from those pieces: the
aggregation jobs (`jobs.py`, one verification path for every kind of task;
a query's record in `queries.py`) and the release of aggregate shares
(`release.py`, one step for a batch or a level of a batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from veil.aggregator.core import (
    AggregatorBase,
    VerifyInitItem,
    VerifyResult,
    authorize,
    check_id,
    check_window_agrees,
)
from veil.aggregator.errors import InvalidMessage, TooLarge
from veil.aggregator.helper.dap import DapHelper
from veil.aggregator.helper.jobs import (
    MAX_JOB_SIZE,
    HelperJobs,
    JobScope,
    UploadScope,
    check_size,
)
from veil.aggregator.helper.queries import HelperQueries, QueryScope
from veil.aggregator.helper.release import HelperRelease
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.hpke import Ciphertext
from veil.metrics import Metrics
from veil.task import HelperTask


class Helper(AggregatorBase[HelperTask]):
    role_name = "helper"
    task_type = HelperTask

    def __init__(
        self,
        tasks: Mapping[bytes, HelperTask],
        store: Datastore,
        privacy: PrivacyEngine,
        clock: Callable[[], float] | None = None,
        metrics: Metrics | None = None,
        open_threads: int = 0,
    ) -> None:
        super().__init__(tasks, store, clock or time.time, metrics, open_threads)
        self.privacy = privacy
        self.queries = HelperQueries(store)
        self.jobs = HelperJobs(self.table, self.keys, store, self.clock, metrics)
        self.releases = HelperRelease(self.table, store, self.clock, privacy, self.queries, metrics)
        # What the helper answers over DAP, for the tasks served over it.
        self.dap = DapHelper(self.table, self.keys, self.jobs, self.releases)

    def aggregate(
        self,
        task_id: bytes,
        token: str | None,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        agg_param: bytes = b"",
        start: int = 0,
        duration: int = 0,
        round_: int = 0,
        window: tuple[int, int] | None = None,
    ) -> list[VerifyResult]:
        """One request of an aggregation job: each report's answer. A task
        queried with an aggregation parameter names it with the batch
        [start, start + duration) and the round of the job (1 or 2).
        `window` is the task's in the leader's file (check_window_agrees)."""
        ctx = self.table.context(task_id)
        task = ctx.task
        authorize(task, token, task.aggregator_token_hash, "aggregator")
        _not_dap(task)
        check_window_agrees(task, window)
        began = time.monotonic()
        scope: JobScope
        if ctx.queries is None:
            if agg_param or round_:
                HelperQueries.rules(ctx)  # InvalidMessage: no aggregation parameter
            check_size(job_id, items)
            scope = UploadScope(self.jobs, ctx)
        else:
            check_id(job_id, "aggregation_job_id")
            if round_ not in (1, 2):
                raise InvalidMessage(f"a Poplar1 job has rounds 1 and 2, not {round_}")
            if len(items) > MAX_JOB_SIZE:
                raise TooLarge(f"aggregation job has {len(items)} reports; at most {MAX_JOB_SIZE}")
            ids = [it.report_id for it in items]
            if len(set(ids)) != len(ids):
                raise InvalidMessage("an aggregation job names a report twice")
            scope = QueryScope(self.jobs, self.queries, ctx, agg_param, start, duration, round_)
        return self.jobs.run(ctx, scope, job_id, items, began)

    def aggregate_share(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        window: tuple[int, int] | None = None,
    ) -> Ciphertext:
        """The helper's noised aggregate share of a batch (or of one level of
        it), sealed to the collector; the same bytes on a retry."""
        _not_dap(self.table.task(task_id))
        return self.releases.aggregate_share(
            task_id,
            token,
            collection_id,
            start,
            duration,
            report_count,
            checksum,
            agg_param,
            window,
        )


def _not_dap(task: HelperTask) -> None:
    """A task served over DAP is aggregated and released over DAP only
    (`Helper.dap`): its shares open and seal under DAP's contexts."""
    if task.dap is not None:
        raise InvalidMessage(
            f"task {task.id_text} is served over DAP: the leader aggregates it over DAP"
        )
