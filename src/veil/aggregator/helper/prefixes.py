"""The helper's side of a Poplar1 task (issue 27; see veil.aggregator.prefixes).

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
or lose in a crash, and a job is idempotent by the same record as a Prio3 job.
The second IDPF evaluation this would cost is avoided while the process holds
the first round's in memory (`LevelCaches`, bounded); after a restart, or once
the entry is pushed out, round 2 evaluates again and gets the same values.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Sequence

from veil.aggregator.core import (
    INVALID_MESSAGE,
    INVALID_TOKEN,
    REPORT_DROPPED,
    REPORT_TOO_EARLY,
    TASK_EXPIRED,
    VDAF_VERIFY_ERROR,
    AggregatorBase,
    VerifyInitItem,
    VerifyResult,
    authorize,
    check_batch_size,
    check_id,
    check_interval,
    check_window_closed,
    rejection_reason,
    seal_share,
)
from veil.aggregator.errors import (
    AggParamRefused,
    BatchCollected,
    BatchMismatch,
    BatchTooSmall,
    InvalidMessage,
    JobConflict,
    LevelCollected,
    ReportRejection,
    TooLarge,
)
from veil.aggregator.helper.checks import check_report, open_report, same_request
from veil.aggregator.prefixes import LevelCaches, PrefixVdaf, ShareCache, job_sum
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import (
    BatchAggregate,
    BatchChanged,
    BucketCollected,
    CollectionRecord,
    HelperJob,
    PrefixQuery,
    QueryCollected,
    QueryConflict,
    ReportsAggregated,
)
from veil.hpke import ROLE_HELPER, Ciphertext, input_share_info
from veil.messages import REPORT_ID_SIZE, vdaf_ctx
from veil.task import HelperTask
from veil.vdaf.batch.poplar1 import Poplar1OutShareBatch, VerifyRoundBatch
from veil.vdaf.spec.poplar1 import Poplar1AggParam

log = logging.getLogger(__name__)

MAX_JOB_SIZE = 10_000
_COMMIT_ATTEMPTS = 5


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
    return hashlib.sha256(b"".join(struct.pack(">I", len(p)) + p for p in parts)).digest()


def _encode_response(results: Sequence[VerifyResult]) -> bytes:
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


def _decode_response(data: bytes) -> list[VerifyResult]:
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


def _stored_answer(job_id: bytes, stored: tuple[bytes, bytes], digest: bytes) -> list[VerifyResult]:
    """A job answered before: its stored answer, if the request is the same."""
    same_request(job_id, stored[0], digest)
    return _decode_response(stored[1])


def _open_once(
    shares: ShareCache, helper: AggregatorBase[HelperTask], task: HelperTask, it: VerifyInitItem
) -> ReportRejection | bytes:
    """The report's share, opened once per process: keyed by what it opened
    from, all of it, so a different ciphertext under the same report id is
    opened on its own."""
    ct = it.encrypted_input_share
    info = input_share_info(ROLE_HELPER, task.task_id, it.report_id, it.time, it.public_share)
    key = hashlib.sha256(
        b"".join((info, struct.pack(">B", ct.config_id), ct.enc, ct.payload))
    ).digest()
    known = shares.get(key)
    if known is not None:
        return known
    plaintext = open_report(helper, task, it, info)
    if not isinstance(plaintext, ReportRejection):
        shares.put(key, plaintext)
    return plaintext


class HelperPrefixes:
    """Poplar1 aggregation jobs and releases on the helper."""

    def __init__(self, helper: AggregatorBase[HelperTask], privacy: PrivacyEngine) -> None:
        self.helper = helper
        self.privacy = privacy
        # IDPF nodes between levels, and each job's first round for its second.
        self.caches = LevelCaches()
        self.shares = ShareCache()
        # Queries recorded by this process (each job's rounds name the same
        # one); forgotten when it releases the level.
        self._recorded: set[tuple[bytes, int, int, bytes]] = set()

    def _task(self, task_id: bytes, token: str | None) -> tuple[HelperTask, PrefixVdaf]:
        h = self.helper
        task = h.task(task_id)
        authorize(task, token, task.aggregator_token_hash, "aggregator")
        prefix = h.context(task_id).queries
        if prefix is None:
            raise InvalidMessage(
                f"task {task.id_text} is a {task.vdaf.type} task: it takes no aggregation parameter"
            )
        return task, prefix

    def _query(
        self, task: HelperTask, prefix: PrefixVdaf, encoded: bytes, start: int, duration: int
    ) -> Poplar1AggParam:
        """Check the parameter on its own and against the batch's record, and
        record it (idempotent for the same parameter)."""
        agg_param = prefix.parse(encoded)
        check_interval(task, start, duration)
        check_window_closed(task, start, self.helper.clock())
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
            stored = self.helper.store.record_prefix_query(
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

    # --- aggregation ------------------------------------------------------

    def aggregate(
        self,
        task_id: bytes,
        token: str | None,
        job_id: bytes,
        agg_param: bytes,
        start: int,
        duration: int,
        round_: int,
        items: Sequence[VerifyInitItem],
    ) -> list[VerifyResult]:
        task, prefix = self._task(task_id, token)
        check_id(job_id, "aggregation_job_id")
        if round_ not in (1, 2):
            raise InvalidMessage(f"a Poplar1 job has rounds 1 and 2, not {round_}")
        if len(items) > MAX_JOB_SIZE:
            raise TooLarge(f"aggregation job has {len(items)} reports; at most {MAX_JOB_SIZE}")
        ids = [it.report_id for it in items]
        if len(set(ids)) != len(ids):
            raise InvalidMessage("an aggregation job names a report twice")
        store = self.helper.store
        began = time.monotonic()
        if round_ == 2:
            digest = prefix_request_hash(task_id, job_id, agg_param, start, items)
            stored = store.helper_job(task_id, job_id)
            if stored is not None:
                return _stored_answer(job_id, stored, digest)
        parsed = self._query(task, prefix, agg_param, start, duration)
        if round_ == 1:
            # A job finished before, asked again (its level run again after
            # another job failed): the reports it accepted are not replays.
            done = store.helper_job(task_id, job_id)
            own = (
                frozenset(r.report_id for r in _decode_response(done[1]) if r.reject is None)
                if done is not None
                else frozenset()
            )
            results, _, _ = self._verify(
                task, prefix, parsed, agg_param, job_id, start, duration, items, 1, own
            )
            return results
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            results, job, _ = self._verify(
                task, prefix, parsed, agg_param, job_id, start, duration, items, 2
            )
            assert job is not None
            try:
                stored = store.commit_prefix_job(
                    HelperJob(task_id, job_id, digest, _encode_response(results), *job),
                    start,
                    parsed.level,
                    prefix.merge(parsed),
                )
            except ReportsAggregated as e:
                if attempt >= _COMMIT_ATTEMPTS:
                    raise
                log.info("aggregation job %s checked again: %s", job_id.hex(), e)
                continue
            except QueryCollected:
                raise LevelCollected(
                    f"level {parsed.level} of the batch was collected while this job ran"
                ) from None
            if stored is not None:
                return _stored_answer(job_id, stored, digest)
            accepted = sum(1 for r in results if r.reject is None)
            self._count_job(task, parsed.level, time.monotonic() - began, results)
            log.info(
                "poplar1 job %s (level %d): %d aggregated, %d rejected",
                job_id.hex(),
                parsed.level,
                accepted,
                len(results) - accepted,
                extra={"task_id": task.id_text, "job_id": job_id.hex()},
            )
            return results
        raise AssertionError("unreachable")

    def _count_job(
        self, task: HelperTask, level: int, seconds: float, results: Sequence[VerifyResult]
    ) -> None:
        """A job's second round committed: the Poplar1 series of the metrics."""
        m = self.helper.metrics
        if m is None:
            return
        m.prefix_jobs.labels("finished").inc()
        m.prefix_job_seconds.observe(seconds)
        by_outcome: dict[str, int] = {}
        for r in results:
            label = "accepted" if r.reject is None else r.reject.value
            by_outcome[label] = by_outcome.get(label, 0) + 1
        for label, n in by_outcome.items():
            m.prefix_reports.labels(task.id_text, str(level), label).inc(n)

    def _verify(
        self,
        task: HelperTask,
        prefix: PrefixVdaf,
        agg_param: Poplar1AggParam,
        encoded: bytes,
        job_id: bytes,
        start: int,
        duration: int,
        items: Sequence[VerifyInitItem],
        round_: int,
        own: frozenset[bytes] = frozenset(),
    ) -> tuple[
        list[VerifyResult],
        tuple[list[tuple[bytes, int]], list[str], list[BatchAggregate]] | None,
        int,
    ]:
        """Each report's answer for `round_`; in round 2 also what the job
        stores (replay records, rejection reasons, its sum) and the count.
        `own`: reports this job accepted before, not counted as replays."""
        h = self.helper
        ctx = vdaf_ctx(task.task_id)
        now = h.clock()
        level = agg_param.level
        valid_ids = [it.report_id for it in items if len(it.report_id) == REPORT_ID_SIZE]
        seen = h.store.seen_prefix_reports(task.task_id, start, level, valid_ids) - own
        h.keys.know_keys({it.encrypted_input_share.config_id for it in items})
        reasons: list[ReportRejection | None] = []
        opened: list[int] = []
        plaintexts: list[bytes] = []
        for i, it in enumerate(items):
            reason, plaintext = self._check_and_open(task, now, start, duration, it, seen)
            reasons.append(reason)
            if reason is None:
                opened.append(i)
                plaintexts.append(plaintext)
        round1: dict[int, tuple[bytes, bytes]] = {}
        accepted: set[int] = set()
        out: Poplar1OutShareBatch | None = None
        if opened:
            batch = prefix.batch
            chosen = [items[i] for i in opened]
            ids = [it.report_id for it in chosen]
            # The first round's evaluation, if this process still holds it
            # (the same reports, parameter and job); else computed again.
            round_key = (*LevelCaches.key(task.task_id, start, 1, ids), job_id, encoded)
            init = self.caches.round(round_key) if round_ == 2 else None
            if init is None:
                init = self.caches.verify_init(
                    prefix,
                    task,
                    1,
                    start,
                    agg_param,
                    ids,
                    [it.public_share for it in chosen],
                    plaintexts,
                )
            if round_ == 1:
                self.caches.keep_round(round_key, init)
            leader1: list[bytes | None] = [it.leader_verifier_share for it in chosen]
            msgs = batch.verifier_shares_to_message_batch(
                ctx, agg_param, [leader1, list(init.verifier_shares)]
            )
            second = batch.verify_next_batch(ctx, init.state, msgs)
            assert isinstance(second, VerifyRoundBatch)
            if round_ == 1:
                for row, i in enumerate(opened):
                    error = second.errors[row]
                    message, share = msgs.messages[row], second.verifier_shares[row]
                    if error is not None or message is None or share is None:
                        reasons[i] = rejection_reason(error) if error else VDAF_VERIFY_ERROR
                    else:
                        round1[i] = (message, share)
            else:
                leader2: list[bytes | None] = [it.leader_verifier_share_2 for it in chosen]
                finals = batch.verifier_shares_to_message_batch(
                    ctx, agg_param, [leader2, list(second.verifier_shares)]
                )
                final = batch.verify_next_batch(ctx, second.state, finals)
                assert isinstance(final, Poplar1OutShareBatch)
                out = final
                for row, i in enumerate(opened):
                    error = out.errors[row]
                    if error is not None:
                        reasons[i] = rejection_reason(error)
                    else:
                        accepted.add(i)
        results: list[VerifyResult] = []
        for i, it in enumerate(items):
            if round_ == 1 and i in round1:
                message, share = round1[i]
                results.append(
                    VerifyResult(
                        it.report_id, verifier_message=message, helper_verifier_share=share
                    )
                )
            elif round_ == 2 and i in accepted:
                results.append(VerifyResult(it.report_id, verifier_message=b""))
            else:
                results.append(VerifyResult(it.report_id, reject=reasons[i] or VDAF_VERIFY_ERROR))
        if round_ == 1:
            return results, None, 0
        # Replay records: every report that was opened or refused after its
        # checks, as for Prio3 (not a malformed one, nor one too early).
        recorded = [
            (it.report_id, it.time)
            for i, it in enumerate(items)
            if reasons[i] not in (INVALID_MESSAGE, REPORT_TOO_EARLY, INVALID_TOKEN)
            and it.report_id not in seen
        ]
        rejected = [str(r.reject) for r in results if r.reject not in (None, REPORT_TOO_EARLY)]
        deltas: list[BatchAggregate] = []
        if out is not None:
            rows_ok = [items[i].report_id for i in opened]
            delta = job_sum(prefix, out, rows_ok)
            if delta.report_count:
                deltas.append(delta)
        return results, (recorded, rejected, deltas), len(accepted)

    def _check_and_open(
        self,
        task: HelperTask,
        now: float,
        start: int,
        duration: int,
        it: VerifyInitItem,
        seen: set[bytes],
    ) -> tuple[ReportRejection | None, bytes]:
        reason = check_report(task, now, it, seen)
        if reason is not None:
            return reason, b""
        if not start <= it.time < start + duration:
            return TASK_EXPIRED, b""
        horizon = task.report_horizon(now)
        if horizon is not None and it.time < horizon:
            # Expired: garbage collection may have deleted the records of its
            # batch's queries already (store.upkeep), so a report this old
            # could be counted at a level released before.
            return REPORT_DROPPED, b""
        plaintext = _open_once(self.shares, self.helper, task, it)
        if isinstance(plaintext, ReportRejection):
            return plaintext, b""
        return None, plaintext

    # --- collection -------------------------------------------------------

    def aggregate_share(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        agg_param: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
    ) -> Ciphertext:
        """The helper's noised prefix counts of one (batch, level), sealed to
        the collector; the same bytes on a retry."""
        task, prefix = self._task(task_id, token)
        check_id(collection_id, "collection_job_id")
        parsed = prefix.parse(agg_param)
        check_interval(task, start, duration)
        check_window_closed(task, start, self.helper.clock())
        store = self.helper.store
        stored = store.get_collection(task_id, collection_id)
        if stored is None:
            stored = self._release(
                task,
                prefix,
                parsed,
                agg_param,
                collection_id,
                start,
                duration,
                report_count,
                checksum,
            )
        if (stored.start, stored.duration, stored.agg_param) != (
            start,
            duration,
            agg_param,
        ) or stored.helper_ct is None:
            raise JobConflict(
                f"collection job {collection_id.hex()} was for another batch or parameter"
            )
        return stored.helper_ct

    def _release(
        self,
        task: HelperTask,
        prefix: PrefixVdaf,
        agg_param: Poplar1AggParam,
        encoded: bytes,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
    ) -> CollectionRecord:
        h = self.helper
        query = h.store.prefix_query(task.task_id, start, agg_param.level)
        if query is None or query.duration != duration or query.agg_param != encoded:
            raise AggParamRefused(
                f"the helper aggregated no query of this batch with this parameter at level"
                f" {agg_param.level}: run its aggregation jobs first"
            )
        if query.collected_by is not None and query.collected_by != collection_id:
            raise LevelCollected(
                f"level {agg_param.level} of the batch was already collected: a batch is"
                " collected once per level"
            )
        count = query.report_count
        if count != report_count or query.checksum != checksum:
            # No counts: this message reaches the collector.
            raise BatchMismatch(
                "the helper's report count or checksum of this query differs from the"
                " leader's: retry after pending aggregation jobs finish"
            )
        # The floor on the reports this level verified, accepted or rejected
        # (its replay records), not on the accepted: a client cannot choose
        # the level at which it is rejected, so that an honest leader's batch
        # reaches the floor at every level or at none (told once).
        if h.store.asked_prefix_reports(task.task_id, start, agg_param.level) < (
            task.min_batch_size
        ):
            raise BatchTooSmall(
                f"the batch holds fewer than min_batch_size ({task.min_batch_size}) reports"
                " verified at this level"
            )
        check_batch_size(task, h.context(task.task_id).bounds, count)
        self.privacy.check(task, start, duration, collection_id)
        share = prefix.decode_share(agg_param, query.agg_share)
        noised, _ = self.privacy.release_in(
            task, prefix.modulus(agg_param), collection_id, start, duration, share
        )
        ct = seal_share(
            task,
            ROLE_HELPER,
            start,
            duration,
            count,
            prefix.encode_counts(agg_param, noised),
            encoded,
        )
        record = CollectionRecord(
            task.task_id,
            collection_id,
            start,
            duration,
            "finished",
            count,
            checksum,
            None,
            ct,
            agg_param=encoded,
        )
        try:
            stored = h.store.collect_prefix_query(record, agg_param.level)
        except QueryCollected:
            raise LevelCollected(
                f"level {agg_param.level} of the batch was already collected"
            ) from None
        except BatchChanged:
            raise BatchMismatch(
                "the query changed while its share was computed: retry after pending"
                " aggregation jobs finish"
            ) from None
        finally:
            self._recorded.discard((task.task_id, start, duration, encoded))
        if h.metrics is not None:
            h.metrics.prefix_levels.labels(task.id_text, str(agg_param.level), "finished").inc()
            h.metrics.prefix_candidates.labels(task.id_text, str(agg_param.level)).set(
                len(agg_param.prefixes)
            )
            h.metrics.collections.labels(task.id_text, "finished").inc()
            self.privacy.report_budget(task, h.metrics)
        log.info(
            "released helper prefix counts of level %d",
            agg_param.level,
            extra={"task_id": task.id_text, "job_id": collection_id.hex()},
        )
        return stored
