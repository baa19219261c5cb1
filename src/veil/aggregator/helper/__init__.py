"""The helper's logic (draft-ietf-ppm-dap sections 4.5 and 4.6, helper side).

The helper trusts the leader with nothing it can check itself: it
authenticates every call, refuses replayed report ids, late or early reports
and reports in collected batches, verifies each proof jointly with the
leader's verifier share, and releases a batch only once, only if its own
count and checksum equal the leader's, and only above min_batch_size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
from collections.abc import Callable, Mapping, Sequence

from veil.aggregator.core import (
    BATCH_COLLECTED,
    INVALID_MESSAGE,
    INVALID_TOKEN,
    REPORT_DROPPED,
    REPORT_REPLAYED,
    REPORT_TOO_EARLY,
    VDAF_VERIFY_ERROR,
    AggregatorBase,
    VerifyInitItem,
    VerifyResult,
    authorize,
    batch_summary,
    check_batch_size,
    check_id,
    check_interval,
    check_window_closed,
    job_deltas,
    rejection_reason,
    seal_share,
    share_merge,
)
from veil.aggregator.errors import (
    BatchCollected,
    BatchMismatch,
    BatchTooSmall,
    JobConflict,
    ReportRejection,
    TooLarge,
)
from veil.aggregator.helper.checks import check_report, input_share_of, same_request
from veil.aggregator.helper.prefixes import HelperPrefixes
from veil.aggregator.keys import tally_open
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import (
    BatchAggregate,
    BatchChanged,
    BucketCollected,
    CollectionRecord,
    HelperJob,
    ReportsAggregated,
)
from veil.hpke import (
    ROLE_HELPER,
    Ciphertext,
    input_share_info,
)
from veil.messages import REPORT_ID_SIZE, vdaf_ctx
from veil.metrics import Metrics
from veil.task import HelperTask
from veil.vdaf.engine import OutShares

log = logging.getLogger(__name__)

MAX_JOB_SIZE = 10_000
# Refusals after which the report's id is not recorded as seen (see _verify).
# An invalid token is not recorded either: nothing of the report was counted.
_NOT_RECORDED = (INVALID_MESSAGE, REPORT_TOO_EARLY, INVALID_TOKEN)
# How often a job is checked again when its commit finds that another job
# aggregated some of its reports, or a collection closed one of its buckets,
# after it read the store; each time, the reports it lost are refused.
_COMMIT_ATTEMPTS = 5


# One struct per item shape (the lengths of its variable fields): a task's
# items share a few shapes, so the cache stays small; past its bound (items
# of many lengths, which only a hostile leader sends) each pack compiles its
# format again rather than growing the cache.
_ITEM_PACKERS: dict[tuple[int, int, int, int, int], Callable[..., bytes]] = {}
_ITEM_PACKERS_MAX = 64


def _item_packer(shape: tuple[int, int, int, int, int]) -> Callable[..., bytes]:
    pack = _ITEM_PACKERS.get(shape)
    if pack is None:
        i, p, e, c, v = shape
        pack = struct.Struct(f">I{i}sIQBI{p}sI{e}sI{c}sI{v}s").pack
        if len(_ITEM_PACKERS) < _ITEM_PACKERS_MAX:
            _ITEM_PACKERS[shape] = pack
    return pack


def request_hash(task_id: bytes, job_id: bytes, items: Sequence[VerifyInitItem]) -> bytes:
    """SHA-256 over the task id, the job id and each item's fields, each of
    an item's fields prefixed by its 4-byte length (time and config id as one
    9-byte field); each item packed at once, the bytes joined and hashed at
    once."""
    parts = [task_id, job_id]
    append = parts.append
    for it in items:
        ct = it.encrypted_input_share
        rid, ps, enc, payload, lvs = (
            it.report_id,
            it.public_share,
            ct.enc,
            ct.payload,
            it.leader_verifier_share,
        )
        shape = (len(rid), len(ps), len(enc), len(payload), len(lvs))
        append(
            _item_packer(shape)(
                shape[0],
                rid,
                9,
                it.time,
                ct.config_id,
                shape[1],
                ps,
                shape[2],
                enc,
                shape[3],
                payload,
                shape[4],
                lvs,
            )
        )
    return hashlib.sha256(b"".join(parts)).digest()


def _encode_response(results: Sequence[VerifyResult]) -> bytes:
    return json.dumps(
        [
            [
                r.report_id.hex(),
                None if r.verifier_message is None else r.verifier_message.hex(),
                r.reject,
            ]
            for r in results
        ]
    ).encode()


def _decode_response(data: bytes) -> list[VerifyResult]:
    return [
        VerifyResult(
            bytes.fromhex(i),
            None if m is None else bytes.fromhex(m),
            None if r is None else ReportRejection(r),
        )
        for i, m, r in json.loads(data)
    ]


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
        # Poplar1 tasks' jobs and releases (two rounds, per aggregation parameter).
        self.prefixes = HelperPrefixes(self, privacy)

    # --- aggregation ------------------------------------------------------

    def aggregate(
        self, task_id: bytes, token: str | None, job_id: bytes, items: Sequence[VerifyInitItem]
    ) -> list[VerifyResult]:
        task = self.task(task_id)
        authorize(task, token, task.aggregator_token_hash, "aggregator")
        check_id(job_id, "aggregation_job_id")
        if len(items) > MAX_JOB_SIZE:
            raise TooLarge(f"aggregation job has {len(items)} reports; at most {MAX_JOB_SIZE}")
        digest = request_hash(task_id, job_id, items)
        began = time.monotonic()
        # No lock: any number of helper processes share the store, and its
        # commit is what decides. A job id another process stored first gets
        # that process's answer; reports another job aggregated meanwhile, or
        # a batch collected meanwhile, make the job be checked again, and
        # those reports are then refused as replayed or collected.
        stored = self.store.helper_job(task_id, job_id)
        attempt = 0
        while stored is None:
            attempt += 1
            results, deltas, new_ids = self._verify(task, items)
            engine = self.context(task_id).engine
            times = {it.report_id: it.time for it in items}
            try:
                job = HelperJob(
                    task_id,
                    job_id,
                    digest,
                    _encode_response(results),
                    [(i, times[i]) for i in new_ids],
                    [r.reject for r in results if r.reject not in (None, REPORT_TOO_EARLY)],
                    deltas,
                )
                stored = self.store.commit_helper_job(job, share_merge(engine))
            except (ReportsAggregated, BucketCollected) as e:
                if attempt >= _COMMIT_ATTEMPTS:
                    raise
                log.info("aggregation job %s checked again: %s", job_id.hex(), e)
                continue
            if stored is None:
                break
        if stored is not None:
            same_request(job_id, stored[0], digest)
            return _decode_response(stored[1])
        rejected = [r.reject for r in results if r.reject is not None]
        aggregated = sum(d.report_count for d in deltas)
        if self.metrics is not None:
            m = self.metrics
            m.aggregation_jobs.labels("finished").inc()
            elapsed = time.monotonic() - began
            m.aggregation_job_seconds.observe(elapsed)
            if items:
                m.verify_seconds_per_report.observe(elapsed / len(items))
            m.reports_accepted.labels(task.id_text).inc(aggregated)
            for reason in rejected:
                if reason == REPORT_TOO_EARLY:
                    m.reports_deferred.labels(task.id_text).inc()
                else:
                    m.reports_rejected.labels(task.id_text, reason).inc()
        too_early = rejected.count(REPORT_TOO_EARLY)
        log.info(
            "aggregation job %s: %d aggregated, %d rejected, %d too early by this clock (the"
            " leader sends them again)",
            job_id.hex(),
            aggregated,
            len(rejected) - too_early,
            too_early,
            extra={"task_id": task.id_text, "job_id": job_id.hex()},
        )
        return results

    def _verify(
        self, task: HelperTask, items: Sequence[VerifyInitItem]
    ) -> tuple[list[VerifyResult], list[BatchAggregate], list[bytes]]:
        """Each report's answer, what the job adds to each time bucket, and the
        ids to record as seen."""
        ctx = vdaf_ctx(task.task_id)
        now = self.clock()
        ids = [it.report_id for it in items]
        self.keys.know_keys({it.encrypted_input_share.config_id for it in items})
        seen = self.store.seen_reports(task.task_id, [i for i in ids if len(i) == REPORT_ID_SIZE])
        results: list[VerifyResult] = []
        deltas: list[BatchAggregate] = []
        new_ids: list[bytes] = []
        collected: dict[int, bool] = {}
        # Checks and HPKE per report; the VDAF work for the whole job at once.
        reasons: list[ReportRejection | None] = []
        opened: list[int] = []
        plaintexts: list[bytes] = []
        horizon = task.report_horizon(now)
        # The checks that do not depend on the job's other reports first,
        # then every share that passed them opened at once (over the opener's
        # threads), then each report's outcome in order, as if one at a time:
        # only a report id seen earlier in this job can change a check's
        # answer, and then to replayed, whatever the share (its open unused).
        checked = [self._check(task, now, horizon, it, seen, collected) for it in items]
        to_open = [i for i, reason in enumerate(checked) if reason is None]
        shares = dict(
            zip(
                to_open,
                self.keys.open_shares([self._share_and_info(task, items[i]) for i in to_open]),
                strict=True,
            )
        )
        tally: dict[str, int] = {}  # HPKE outcomes, counted once for the job
        for i, it in enumerate(items):
            reason = checked[i]
            plaintext = b""
            if reason != INVALID_MESSAGE and it.report_id in seen:
                reason = REPORT_REPLAYED  # as check_report finds it
            elif reason is None:
                tally_open(shares[i], tally)
                share = input_share_of(task, it.report_id, shares[i])
                if isinstance(share, ReportRejection):
                    reason = share
                else:
                    plaintext = share
            # Neither a malformed report's id nor that of a report too early
            # by this helper's clock is recorded: nothing of it was counted,
            # and the leader sends a too-early report again later (in a new
            # job), when this clock has caught up with its time.
            if reason not in _NOT_RECORDED and it.report_id not in seen:
                seen.add(it.report_id)
                new_ids.append(it.report_id)
            reasons.append(reason)
            if reason is None:
                opened.append(i)
                plaintexts.append(plaintext)
        self.keys.count_opens(tally)
        messages: dict[int, bytes] = {}
        if opened:
            accepted: list[tuple[int, bytes, int]] = []  # bucket, report id, row in `out`
            engine = self.context(task.task_id).engine
            chosen = [items[i] for i in opened]
            init = engine.verify_init(
                task.verify_key,
                ctx,
                1,
                None,
                [it.report_id for it in chosen],
                [it.public_share for it in chosen],
                plaintexts,
            )
            leader_shares: list[bytes | None] = [it.leader_verifier_share for it in chosen]
            msgs = engine.verifier_shares_to_message(
                ctx, None, [leader_shares, list(init.verifier_shares)]
            )
            out = engine.verify_next(ctx, None, init, msgs.messages)
            assert isinstance(out, OutShares)  # one round
            for row, i in enumerate(opened):
                error = init.errors[row] or msgs.errors[row] or out.errors[row]
                if error is not None:
                    reasons[i] = rejection_reason(error)
                    continue
                message = msgs.messages[row]
                assert message is not None
                messages[i] = message
                accepted.append((task.bucket(items[i].time), items[i].report_id, row))
            deltas = job_deltas(engine, out, accepted)
        get = messages.get
        for i, it in enumerate(items):
            message = get(i)
            if message is not None:
                results.append(VerifyResult(it.report_id, message))
            else:
                results.append(VerifyResult(it.report_id, None, reasons[i] or VDAF_VERIFY_ERROR))
        return results, deltas, new_ids

    def _check(
        self,
        task: HelperTask,
        now: float,
        horizon: int | None,
        it: VerifyInitItem,
        seen: set[bytes],
        collected: dict[int, bool],
    ) -> ReportRejection | None:
        """The helper's own checks of one report before its share is opened
        (None: open it). `horizon` is `task.report_horizon(now)`; `collected`
        caches whether each time bucket was collected."""
        reason = check_report(task, now, it, seen)
        if reason is not None:
            return reason
        if horizon is not None and it.time < horizon:
            # Expired: its replay record may already be gone (DAP: report_dropped).
            return REPORT_DROPPED
        bucket = task.bucket(it.time)
        if bucket not in collected:
            aggs = self.store.batch_aggregates(task.task_id, bucket, bucket + 1)
            collected[bucket] = any(a.collected_by is not None for a in aggs)
        if collected[bucket]:
            return BATCH_COLLECTED
        return None

    @staticmethod
    def _share_and_info(task: HelperTask, it: VerifyInitItem) -> tuple[Ciphertext, bytes]:
        """A report's sealed share to the helper and the context it opens with."""
        info = input_share_info(ROLE_HELPER, task.task_id, it.report_id, it.time, it.public_share)
        return it.encrypted_input_share, info

    # --- collection -------------------------------------------------------

    def aggregate_share(
        self,
        task_id: bytes,
        token: str | None,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
    ) -> Ciphertext:
        task = self.task(task_id)
        authorize(task, token, task.aggregator_token_hash, "aggregator")
        check_id(collection_id, "collection_job_id")
        check_interval(task, start, duration)
        check_window_closed(task, start, self.clock())
        stored = self.store.get_collection(task_id, collection_id)
        if stored is None:
            # Computed without a lock; the commit closes the batch and checks,
            # in one transaction, that it still holds what the share was
            # computed from, and returns what another process stored first.
            stored = self._release(task, collection_id, start, duration, report_count, checksum)
        if (stored.start, stored.duration) != (start, duration) or stored.helper_ct is None:
            raise JobConflict(f"collection job {collection_id.hex()} was for another batch")
        return stored.helper_ct

    def _release(
        self,
        task: HelperTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
    ) -> CollectionRecord:
        task_id = task.task_id
        aggs = self.store.batch_aggregates(task_id, start, start + duration)
        for a in aggs:
            if a.collected_by is not None and a.collected_by != collection_id:
                raise BatchCollected(
                    f"the batch overlapping [{start}, +{duration}) was already collected"
                    f" (time bucket {a.bucket}); a batch is collected at most once"
                )
        ctx = self.context(task_id)
        share, count, mine = batch_summary(ctx.engine, aggs)
        if count != report_count or mine != checksum:
            # No counts: this message reaches the collector, and the
            # helper's count may be below min_batch_size (issue 13).
            raise BatchMismatch(
                "the helper's report count or checksum of this batch differs from the"
                " leader's: retry after pending aggregation jobs finish"
            )
        if count < task.min_batch_size:
            raise BatchTooSmall(
                f"the batch holds fewer than min_batch_size ({task.min_batch_size}) reports"
            )
        check_batch_size(task, ctx.bounds, count)
        self.privacy.check(task, start, duration, collection_id)
        noised, _eps = self.privacy.release_in(
            task, ctx.engine.noise_modulus(None), collection_id, start, duration, share
        )
        ct = seal_share(
            task, ROLE_HELPER, start, duration, count, ctx.engine.encode_agg_share(None, noised)
        )
        try:
            stored = self.store.commit_helper_collection(
                CollectionRecord(
                    task_id, collection_id, start, duration, "finished", count, checksum, None, ct
                ),
                task.time_precision,
            )
        except BucketCollected as e:
            raise BatchCollected(
                f"the batch overlapping [{start}, +{duration}) was already collected"
                f" (time bucket {e.bucket}); a batch is collected at most once"
            ) from None
        except BatchChanged:
            # An aggregation job committed between the read and the close:
            # the leader retries, and this collection (already charged, if
            # at all) is computed again.
            raise BatchMismatch(
                "the batch changed while its share was computed: retry after pending"
                " aggregation jobs finish"
            ) from None
        if stored.helper_ct != ct:
            return stored
        if self.metrics is not None:
            self.metrics.collections.labels(task.id_text, "finished").inc()
            self.privacy.report_budget(task, self.metrics)
        log.info(
            "released helper share for %d reports",
            count,
            extra={"task_id": task.id_text, "job_id": collection_id.hex()},
        )
        return stored
