"""The helper's record of a batch's queries, and the scope of a job over one
query (a task whose VDAF takes an aggregation parameter: Poplar1, issue 27;
see veil.aggregator.prefixes).

Two rounds per aggregation job, under one job id:

1. The leader sends the reports' shares, its round-1 sketch shares and the
   aggregation parameter. The helper checks the parameter against its own
   record of the batch's queries (and records it), opens each share,
   evaluates its IDPF key at the prefixes, and answers each report with the
   round-1 sketch (both shares added) and its own round-2 share. Nothing
   else is stored.
2. The leader sends the same reports again with both its sketch shares. The
   helper computes round 1 again (deterministic: the same shares, parameter
   and verify key give the same values), checks that the round-2 shares
   cancel, and in one transaction stores the job's answer, a replay record
   per (batch, level, report) and its sum of the accepted reports' output
   shares. A retry gets the stored answer; a retry of round 1 (the level
   run again after another job failed) is answered afresh, the reports the
   stored answer accepted not counted as replays of themselves.

Why nothing is stored between the rounds: nothing to keep consistent, expire
or lose in a crash, and a job is idempotent by the same record as any other.
The second IDPF evaluation this would cost is avoided while the process holds
the first round's in memory (`LevelCaches`, bounded); after a restart, or once
the entry is pushed out, round 2 evaluates again and gets the same values.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Sequence

from veil.aggregator.context import TaskContext
from veil.aggregator.core import (
    REPORT_DROPPED,
    TASK_EXPIRED,
    VerifyInitItem,
    VerifyResult,
    check_interval,
    check_window_closed,
    job_deltas,
    share_merge,
)
from veil.aggregator.errors import (
    AggParamRefused,
    BatchCollected,
    InvalidMessage,
    LevelCollected,
    ReportRejection,
)
from veil.aggregator.helper.checks import stored_answer
from veil.aggregator.helper.jobs import HelperJobs, Opened
from veil.aggregator.keys import KeyRing
from veil.aggregator.prefixes import LevelCaches, PrefixVdaf, ShareCache
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchAggregate,
    BucketCollected,
    HelperJob,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
)
from veil.hpke import ROLE_HELPER, input_share_info
from veil.messages import REPORT_ID_SIZE, vdaf_ctx
from veil.task import HelperTask
from veil.vdaf.engine import OutShares, Round
from veil.vdaf.spec.poplar1 import Poplar1AggParam

log = logging.getLogger(__name__)


def prefix_request_hash(
    task_id: bytes, job_id: bytes, agg_param: bytes, start: int, items: Sequence[VerifyInitItem]
) -> bytes:
    """What identifies a second-round request: a retry must send the same."""
    parts = [task_id, job_id, agg_param, struct.pack(">Q", start)]
    for it in items:
        parts += [
            it.report_id,
            struct.pack(">QB", it.time, it.encrypted_input_share.config_id),
            it.public_share,
            it.encrypted_input_share.enc,
            it.encrypted_input_share.payload,
            it.leader_verifier_share,
            it.leader_verifier_share_2,
        ]
        if it.token or it.leader_share_digest:  # a task with invitations
            parts += [it.token, it.leader_share_digest]
    return hashlib.sha256(b"".join(struct.pack(">I", len(p)) + p for p in parts)).digest()


def encode_response(results: Sequence[VerifyResult]) -> bytes:
    out = bytearray()
    for r in results:
        out += r.report_id
        if r.verifier_message is not None:
            out += b"\x00"
        else:
            assert r.reject is not None
            reason = r.reject.value.encode()
            out += bytes([len(reason)]) + reason
    return bytes(out)


def decode_response(data: bytes) -> list[VerifyResult]:
    results = []
    i = 0
    while i < len(data):
        report_id = data[i : i + REPORT_ID_SIZE]
        n = data[i + REPORT_ID_SIZE]
        i += REPORT_ID_SIZE + 1
        if n == 0:
            results.append(VerifyResult(report_id, verifier_message=b""))
        else:
            results.append(
                VerifyResult(report_id, reject=ReportRejection(data[i : i + n].decode()))
            )
            i += n
    return results


class HelperQueries:
    """What the helper keeps of the queries of the tasks it serves: the
    record of each batch's queries (in its store), and in memory the IDPF
    nodes between levels, each job's first round for its second, and the
    shares opened (each report's share is opened once per process)."""

    def __init__(self, store: Datastore) -> None:
        self.store = store
        self.caches = LevelCaches()
        self.shares = ShareCache()
        # Queries recorded by this process (each job's rounds name the same
        # one); forgotten when it releases the level.
        self._recorded: set[tuple[bytes, int, int, bytes]] = set()

    @staticmethod
    def rules(ctx: TaskContext[HelperTask]) -> PrefixVdaf:
        """The task's rules on its queries (InvalidMessage for a task that
        takes no aggregation parameter)."""
        if ctx.queries is None:
            task = ctx.task
            raise InvalidMessage(
                f"task {task.id_text} is a {task.vdaf.type} task: it takes no aggregation parameter"
            )
        return ctx.queries

    def record(
        self,
        ctx: TaskContext[HelperTask],
        encoded: bytes,
        start: int,
        duration: int,
        now: float,
    ) -> Poplar1AggParam:
        """Check the parameter on its own and against the batch's record, and
        record it (idempotent for the same parameter)."""
        task, prefix = ctx.task, self.rules(ctx)
        agg_param = prefix.parse(encoded)
        check_interval(task, start, duration)
        check_window_closed(task, start, now)
        memo = (task.task_id, start, duration, encoded)
        if memo in self._recorded:
            return agg_param
        sequence = prefix.sequence_check(agg_param)

        def check(previous: Sequence[PrefixQuery]) -> None:
            # No level after one this helper did not release (the leader
            # refuses it too): a level refused by the floor ends the batch,
            # so that whether it reached the floor is told once.
            for q in previous:
                if q.collected_by is None:
                    raise AggParamRefused(
                        f"level {q.level} of this batch was not released: no later level of"
                        " the batch can be aggregated"
                    )
            sequence(previous)

        try:
            stored = self.store.record_prefix_query(
                PrefixQuery(task.task_id, start, duration, agg_param.level, encoded),
                check,
                task.time_precision,
            )
        except QueryConflict as e:
            raise AggParamRefused(str(e)) from None
        except BucketCollected as e:
            raise BatchCollected(
                f"a time bucket of the batch was collected by a Prio3 collection ({e})"
            ) from None
        if stored.agg_param != encoded:
            raise LevelCollected(
                f"the batch was already queried at level {agg_param.level} with other"
                " prefixes: a batch is collected once per level"
            )
        if stored.collected_by is not None:
            raise LevelCollected(
                f"level {agg_param.level} of the batch was already collected: a batch is"
                " collected once per level"
            )
        if len(self._recorded) >= 1024:
            self._recorded.clear()
        self._recorded.add(memo)
        return agg_param

    def forget(self, task_id: bytes, start: int, duration: int, encoded: bytes) -> None:
        """The query's level was released: its memo goes."""
        self._recorded.discard((task_id, start, duration, encoded))


class QueryScope:
    """A job over one query of a batch: the round given of the VDAF's two,
    replay records and a sum per (batch, level)."""

    def __init__(
        self,
        jobs: HelperJobs,
        queries: HelperQueries,
        ctx: TaskContext[HelperTask],
        encoded: bytes,
        start: int,
        duration: int,
        round_: int,
    ) -> None:
        self.jobs = jobs
        self.queries = queries
        self.ctx = ctx
        self.store = jobs.store
        self.task_id = ctx.task.task_id
        self.context = vdaf_ctx(self.task_id)
        self.encoded = encoded
        self.start = start
        self.duration = duration
        self.rounds = round_
        # The reports a job finished before accepted or refused after their
        # checks (round 1 of a level run again): not replays of themselves.
        self.own: frozenset[bytes] = frozenset()
        # Parsed when the query is checked and recorded (`stored`).
        self.agg_param: Poplar1AggParam | None = None

    def digest(self, job_id: bytes, items: Sequence[VerifyInitItem]) -> bytes:
        return prefix_request_hash(self.task_id, job_id, self.encoded, self.start, items)

    def encode(self, results: Sequence[VerifyResult]) -> bytes:
        return encode_response(results)

    def stored(self, job_id: bytes, digest: bytes) -> list[VerifyResult] | None:
        """Round 2: the stored answer if the job was committed; else the
        query checked and recorded. Round 1 is answered afresh: of a job
        finished before, the reports it accepted are not replays."""
        store = self.store
        if self.rounds == 2:
            answer = stored_answer(
                job_id, store.helper_job(self.task_id, job_id), digest, decode_response
            )
            if answer is not None:
                return answer
        self.agg_param = self.queries.record(
            self.ctx, self.encoded, self.start, self.duration, self.jobs.clock()
        )
        if self.rounds == 1:
            done = store.helper_job(self.task_id, job_id)
            if done is not None:
                self.own = frozenset(
                    r.report_id for r in decode_response(done[1]) if r.reject is None
                )
        return None

    @property
    def level(self) -> int:
        assert self.agg_param is not None  # recorded before any report is read
        return self.agg_param.level

    def seen(self, ids: Sequence[bytes]) -> set[bytes]:
        level = self.level
        return self.store.seen_prefix_reports(self.task_id, self.start, level, ids) - self.own

    def check(
        self, ctx: TaskContext[HelperTask], horizon: int | None, it: VerifyInitItem
    ) -> ReportRejection | None:
        if not self.start <= it.time < self.start + self.duration:
            return TASK_EXPIRED
        if horizon is not None and it.time < horizon:
            # Expired: garbage collection may have deleted the records of its
            # batch's queries already (store.upkeep), so a report this old
            # could be counted at a level released before.
            return REPORT_DROPPED
        return None

    def open(
        self, ctx: TaskContext[HelperTask], keys: KeyRing, items: Sequence[VerifyInitItem]
    ) -> list[Opened]:
        """Each report's share, opened once per process: keyed by what it
        opened from, all of it, so a different ciphertext under the same
        report id is opened on its own."""
        task = ctx.task
        cache = self.queries.shares
        out: list[Opened | None] = [None] * len(items)
        fresh: list[tuple[int, bytes]] = []
        sealed = []
        for i, it in enumerate(items):
            ct = it.encrypted_input_share
            info = input_share_info(
                ROLE_HELPER, task.task_id, it.report_id, it.time, it.public_share
            )
            key = hashlib.sha256(
                b"".join((info, struct.pack(">B", ct.config_id), ct.enc, ct.payload))
            ).digest()
            known = cache.get(key)
            if known is not None:
                out[i] = (known, None)
            else:
                fresh.append((i, key))
                sealed.append((ct, info))
        for (i, key), outcome in zip(fresh, keys.open_shares(sealed), strict=True):
            share = outcome
            if not isinstance(share, ReportRejection):
                cache.put(key, share)
            out[i] = (share, outcome)
        return [o for o in out if o is not None]

    def init(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        plaintexts: Sequence[bytes],
    ) -> Round:
        """The first round's evaluation, if this process still holds it (the
        same reports, parameter and job); else computed again."""
        caches = self.queries.caches
        ids = [it.report_id for it in items]
        round_key = (*LevelCaches.key(self.task_id, self.start, 1, ids), job_id, self.encoded)
        init = caches.round(round_key) if self.rounds == 2 else None
        if init is None:
            assert self.agg_param is not None
            init = caches.verify_init(
                ctx.engine,
                ctx.task,
                1,
                self.start,
                self.agg_param,
                ids,
                [it.public_share for it in items],
                plaintexts,
            )
        if self.rounds == 1:
            caches.keep_round(round_key, init)
        return init

    def commit(
        self,
        ctx: TaskContext[HelperTask],
        job: HelperJob,
        results: Sequence[VerifyResult],
    ) -> list[VerifyResult] | None:
        try:
            stored = self.store.commit_prefix_job(
                job,
                self.start,
                self.level,
                share_merge(ctx.engine, self.agg_param),
            )
        except QueryCollected:
            raise LevelCollected(
                f"level {self.level} of the batch was collected while this job ran"
            ) from None
        return stored_answer(job.job_id, stored, job.request_hash, decode_response)

    def deltas(
        self,
        ctx: TaskContext[HelperTask],
        out: OutShares,
        accepted: Sequence[tuple[int, bytes, int]],
    ) -> list[BatchAggregate]:
        """One sum (bucket 0) for the query's level."""
        return job_deltas(
            ctx.engine, out, [(0, rid, row) for _, rid, row in accepted], self.agg_param
        )

    def finished(
        self,
        ctx: TaskContext[HelperTask],
        job_id: bytes,
        seconds: float,
        items: Sequence[VerifyInitItem],
        results: Sequence[VerifyResult],
        deltas: Sequence[BatchAggregate],
    ) -> None:
        """A job's second round committed: the Poplar1 series of the metrics."""
        task, level = ctx.task, self.level
        m = self.jobs.metrics
        if m is not None:
            m.prefix_jobs.labels("finished").inc()
            m.prefix_job_seconds.observe(seconds)
            by_outcome: dict[str, int] = {}
            for r in results:
                label = "accepted" if r.reject is None else r.reject.value
                by_outcome[label] = by_outcome.get(label, 0) + 1
            for label, n in by_outcome.items():
                m.prefix_reports.labels(task.id_text, str(level), label).inc(n)
        accepted = sum(1 for r in results if r.reject is None)
        log.info(
            "poplar1 job %s (level %d): %d aggregated, %d rejected",
            job_id.hex(),
            level,
            accepted,
            len(results) - accepted,
            extra={"task_id": task.id_text, "job_id": job_id.hex()},
        )
