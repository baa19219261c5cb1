"""The collector's side of a DAP task at the leader (draft-ietf-ppm-dap
section 4.6, leader side): a CollectionJobReq creates a collection job of
the leader's one collection driver (its checks, its release step), a
poll answers the CollectionJobResp once the job is finished, and the
collector may delete its job. HTTP stays outside
(`veil.aggregator.run.dap_http`)."""

from __future__ import annotations

import hashlib

from veil.aggregator.core import authorize
from veil.aggregator.errors import (
    AggregatorError,
    BatchCollected,
    BatchTooSmall,
    JobConflict,
    NotFound,
    Unauthenticated,
    UnknownTask,
)
from veil.aggregator.leader.collection import CollectionDriver
from veil.aggregator.leader.dap import DapUnavailable, DapUploads
from veil.aggregator.store.records import CollectionRecord, StorageConflict
from veil.dap.codec import DecodeError
from veil.dap.jobs import CollectionJobReq, CollectionJobResp
from veil.dap.messages import BatchMode, Interval, extensions_in_order
from veil.dap.problems import (
    DapAbort,
    DapUnauthorized,
    Problem,
    ProblemType,
    batch_interval_seconds,
    refuse_extensions_and_agg_param,
)


class DapCollections:
    """The collector's side of a DAP task at the leader (section 4.6):
    collection jobs of the leader's one collection driver, created from a
    CollectionJobReq and polled for the CollectionJobResp."""

    def __init__(self, uploads: DapUploads, collections: CollectionDriver) -> None:
        self.uploads = uploads
        self.collections = collections

    def create(self, task_id: bytes, token: str | None, body: bytes) -> bytes:
        """A CollectionJobReq: the collection job's id (the first 16 bytes
        of SHA-256 over the body, so a retried request finds its job)."""
        task = self.uploads.task(task_id)
        try:
            request = CollectionJobReq.decode(body)
        except DecodeError as e:
            raise DapAbort(Problem(ProblemType.INVALID_MESSAGE, str(e), 400, task_id)) from None
        assert task.dap is not None
        leader_selected = task.dap.leader_selected
        mode = BatchMode.LEADER_SELECTED if leader_selected else BatchMode.TIME_INTERVAL
        if request.query.batch_mode is not mode:
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_MESSAGE,
                    f"this task's batch mode is {task.dap.batch_mode}",
                    400,
                    task_id,
                )
            )
        if not extensions_in_order(request.extensions):
            raise DapAbort(
                Problem(
                    ProblemType.INVALID_EXTENSION,
                    "the collection job's extensions are not in increasing order",
                    400,
                    task_id,
                )
            )
        refuse_extensions_and_agg_param(
            task_id, request.extensions, request.agg_param, "collection job"
        )
        if leader_selected:
            # The leader chooses the batch (section 5.2.1); a repeated
            # request finds the pending job (see docs/DAP.md, Readings).
            try:
                record = self._create_leader_selected(task_id, token, hashlib.sha256(body).digest())
            except AggregatorError as e:
                raise _refused(e, task_id) from None
            return record.job_id
        interval = request.query.batch_interval
        assert interval is not None
        start, duration = batch_interval_seconds(task_id, interval, task.time_precision)
        # The task's id is hashed in: every question of a survey sends the
        # same CollectionJobReq for the same window, and the survey's ledger,
        # shared by its tasks, knows each spend by its collection's id.
        collection_id = hashlib.sha256(task_id + body).digest()[:16]
        try:
            self.collections.create_collection(task_id, token, collection_id, start, duration)
        except AggregatorError as e:
            raise _refused(e, task_id) from None
        return collection_id

    def _create_leader_selected(
        self, task_id: bytes, token: str | None, digest: bytes
    ) -> CollectionRecord:
        """A collection of a leader-selected task (DAP's): the batch is the
        leader's choice, the oldest that holds min_batch_size reports and
        that no collection has. The same request while the task's last
        collection is pending finds it (`digest`, the request's hash, and
        the batch's id name the job). BatchTooSmall while no batch is ready."""
        ctx = self.collections.tasks.context(task_id)
        task = ctx.task
        authorize(task, token, task.collector_token_hash, "collector")
        pending = [c for c in self.collections.store.collections(task_id) if c.state == "pending"]
        if pending:
            return pending[-1]
        chosen = self.collections.store.ready_batch(task_id, task.min_batch_size)
        if chosen is None:
            raise BatchTooSmall(
                f"no batch holds min_batch_size ({task.min_batch_size}) reports yet that was"
                " not collected: wait for more reports"
            )
        batch_id, bucket = chosen
        collection_id = hashlib.sha256(digest + batch_id).digest()[:16]
        self.collections.privacy.check(task, bucket, 1)
        try:
            record = self.collections.store.put_collection(
                CollectionRecord(task_id, collection_id, bucket, 1, "pending")
            )
        except StorageConflict as e:
            raise JobConflict(str(e)) from None
        if record.state == "deleted":
            # Not reached: a job kept as deleted closed its batch, which
            # ready_batch then passes over.
            raise BatchCollected(f"collection job {collection_id.hex()} was deleted")
        return record

    def delete(self, task_id: bytes, token: str | None, collection_id: bytes) -> None:
        """The collector's DELETE of its collection job (section 4.6,
        "Collection Job Deletion"; see CollectionDriver.delete_collection)."""
        self.uploads.task(task_id)
        try:
            self.collections.delete_collection(task_id, token, collection_id)
        except AggregatorError as e:
            raise _refused(e, task_id) from None

    def poll(self, task_id: bytes, token: str | None, collection_id: bytes) -> bytes | None:
        """The encoded CollectionJobResp once the job is finished (None while
        it is not)."""
        task = self.uploads.task(task_id)
        try:
            record = self.collections.get_collection(task_id, token, collection_id)
        except AggregatorError as e:
            raise _refused(e, task_id) from None
        if record.state == "failed":
            raise DapAbort(Problem(ProblemType.BATCH_INVALID, record.error_message, 400, task_id))
        if record.state != "finished" or record.leader_ct is None or record.helper_ct is None:
            return None
        tp = task.time_precision
        assert task.dap is not None
        if task.dap.leader_selected:
            # Every report of the batch lies in the task's window: its
            # interval, widened to whole time precisions, tells the
            # collector nothing of the reports (docs/DAP.md, Readings).
            first = task.not_before // tp
            interval = Interval(first, -(-task.not_after // tp) - first)
        else:
            interval = Interval(record.start // tp, record.duration // tp)
        return CollectionJobResp(
            record.report_count,
            interval,
            record.leader_ct,
            record.helper_ct,
        ).encode()


def _refused(e: AggregatorError, task_id: bytes) -> Exception:
    """A collection refused by the leader's logic, as DAP answers it."""
    if isinstance(e, Unauthenticated):
        return DapUnauthorized(str(e))
    if e.retryable:
        return DapUnavailable(str(e))
    if isinstance(e, UnknownTask):
        return DapAbort(Problem(ProblemType.UNRECOGNIZED_TASK, str(e), 404, task_id))
    if isinstance(e, NotFound):
        return DapAbort(Problem(ProblemType.INVALID_MESSAGE, str(e), 404, task_id))
    if isinstance(e, BatchCollected):
        return DapAbort(Problem(ProblemType.BATCH_OVERLAP, str(e), 400, task_id))
    if isinstance(e, JobConflict):
        return DapAbort(Problem(ProblemType.INVALID_MESSAGE, str(e), 409, task_id))
    if isinstance(e, BatchTooSmall):
        return DapAbort(Problem(ProblemType.INVALID_BATCH_SIZE, str(e), 400, task_id))
    return DapAbort(Problem(ProblemType.BATCH_INVALID, str(e), 400, task_id))
