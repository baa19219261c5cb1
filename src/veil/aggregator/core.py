"""What the leader and helper logic share: message values, checks, key handling.

The values here are the logic's view of the protocol messages; the gRPC
service modules convert between them and the generated classes, so nothing
below imports generated code.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from veil.aggregator.errors import InvalidMessage, ReportTimeRejected, Unauthenticated, UnknownTask
from veil.aggregator.storage import BatchAggregate, Datastore, ShareMerge
from veil.hpke import Ciphertext, HpkeConfig, HpkeKeypair, generate_keypair
from veil.metrics import Metrics
from veil.task import Task, token_matches
from veil.vdaf import Prio3

log = logging.getLogger(__name__)

REPORT_ID_SIZE = 16
CHECKSUM_SIZE = 32
CTX_PREFIX = b"veil-v1"
# Upper bound on the number of time buckets in one collected interval.
MAX_BATCH_BUCKETS = 100_000

# Reasons a report is rejected during aggregation (the ReportError enum of
# helper.proto, in lower case).
BATCH_COLLECTED = "batch_collected"
REPORT_REPLAYED = "report_replayed"
HPKE_UNKNOWN_CONFIG_ID = "hpke_unknown_config_id"
HPKE_DECRYPT_ERROR = "hpke_decrypt_error"
VDAF_DECODE_ERROR = "vdaf_decode_error"
VDAF_VERIFY_ERROR = "vdaf_verify_error"
REPORT_TOO_EARLY = "report_too_early"
TASK_EXPIRED = "task_expired"
INVALID_MESSAGE = "invalid_message"
REPORT_DROPPED = "report_dropped"


@dataclass(frozen=True)
class VerifyInitItem:
    """One report of an aggregation job as the helper receives it."""

    report_id: bytes
    time: int
    public_share: bytes
    encrypted_input_share: Ciphertext
    leader_verifier_share: bytes


@dataclass(frozen=True)
class VerifyResult:
    report_id: bytes
    verifier_message: bytes | None = None
    reject: str | None = None


def vdaf_ctx(task_id: bytes) -> bytes:
    """The VDAF application context string (draft-irtf-cfrg-vdaf section 4)."""
    return CTX_PREFIX + task_id


def report_checksum(report_id: bytes) -> bytes:
    return hashlib.sha256(report_id).digest()


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def authorize(task: Task, token: str | None, stored_hash: bytes | None, who: str) -> None:
    """Constant-time check of a bearer token against its stored SHA-256."""
    if stored_hash is None:
        raise Unauthenticated(f"task {task.id_text} has no {who} token configured here")
    if token is None:
        raise Unauthenticated(f"missing bearer token: send 'authorization: Bearer <{who} token>'")
    if not token_matches(token, stored_hash):
        raise Unauthenticated(f"wrong {who} token for task {task.id_text}")


def check_interval(task: Task, start: int, duration: int) -> None:
    tp = task.time_precision
    if duration <= 0 or start % tp or duration % tp:
        raise InvalidMessage(
            f"batch interval [{start}, +{duration}) must be non-empty and aligned to the"
            f" task's time_precision of {tp} s"
        )
    if duration // tp > MAX_BATCH_BUCKETS:
        raise InvalidMessage(f"batch interval spans more than {MAX_BATCH_BUCKETS} time buckets")


def check_report_time(task: Task, report_time: int, now: float) -> None:
    """Raises ReportTimeRejected for a report too far in the future or outside the task."""
    if report_time > now + task.max_clock_skew:
        raise ReportTimeRejected(
            f"report time {report_time} is {int(report_time - now)} s in the future; at most"
            f" {task.max_clock_skew} s of clock skew is allowed: check the client's clock"
        )
    if not task.not_before <= report_time < task.not_after:
        raise ReportTimeRejected(
            f"report time {report_time} is outside the task's window"
            f" [{task.not_before}, {task.not_after})"
        )


def accumulate(
    vdaf: Prio3[Any, Any],
    existing: Mapping[int, BatchAggregate],
    accepted: Iterable[tuple[int, bytes, list[int]]],
) -> list[BatchAggregate]:
    """New aggregates after adding (bucket, report_id, out_share) triples to `existing`."""
    shares: dict[int, list[int]] = {}
    counts: dict[int, int] = {}
    sums: dict[int, bytes] = {}
    for bucket, report_id, out_share in accepted:
        if bucket not in shares:
            old = existing.get(bucket)
            if old is not None and old.agg_share is not None:
                shares[bucket] = vdaf.decode_agg_share(None, old.agg_share)
            else:
                shares[bucket] = vdaf.agg_init(None)
            counts[bucket] = old.report_count if old is not None else 0
            sums[bucket] = old.checksum if old is not None else bytes(CHECKSUM_SIZE)
        shares[bucket] = vdaf.agg_update(None, shares[bucket], out_share)
        counts[bucket] += 1
        sums[bucket] = xor(sums[bucket], report_checksum(report_id))
    return [
        BatchAggregate(
            b,
            vdaf.encode_agg_share(shares[b]),
            counts[b],
            sums[b],
            existing[b].collected_by if b in existing else None,
        )
        for b in shares
    ]


def share_merge(vdaf: Prio3[Any, Any]) -> ShareMerge:
    """Field addition of two encoded aggregate shares, for the store to apply under its lock."""

    def merge(a: bytes, b: bytes) -> bytes:
        return vdaf.encode_agg_share(
            vdaf.merge(None, [vdaf.decode_agg_share(None, a), vdaf.decode_agg_share(None, b)])
        )

    return merge


def batch_summary(
    vdaf: Prio3[Any, Any], aggregates: Sequence[BatchAggregate]
) -> tuple[list[int], int, bytes]:
    """(aggregate share, report count, checksum) of a batch's buckets."""
    share = vdaf.merge(
        None, [vdaf.decode_agg_share(None, a.agg_share) for a in aggregates if a.agg_share]
    )
    count = sum(a.report_count for a in aggregates)
    checksum = bytes(CHECKSUM_SIZE)
    for a in aggregates:
        checksum = xor(checksum, a.checksum)
    return share, count, checksum


class AggregatorBase:
    """Tasks, HPKE keys and clock common to both aggregators."""

    role_name = "aggregator"

    def __init__(
        self,
        tasks: Mapping[bytes, Task],
        store: Datastore,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.tasks = dict(tasks)
        self.metrics = metrics
        self.store = store
        self.clock = clock
        self.vdafs = {tid: t.vdaf.instantiate() for tid, t in self.tasks.items()}
        for t in self.tasks.values():
            if t.verify_key is None:
                raise ValueError(f"task {t.id_text} has no verify_key: not an aggregator's task")
        keys = store.hpke_keypairs()
        if not keys:
            keys = [generate_keypair(secrets.randbelow(256))]
            store.add_hpke_keypair(keys[0])
        self.keypairs: dict[int, HpkeKeypair] = {k.config.config_id: k for k in keys}
        self.current_config = keys[0].config

    def reload_keys(self) -> None:
        """Read the HPKE keys again (another process sharing the store may have added one)."""
        keys = self.store.hpke_keypairs()
        if keys:
            self.keypairs = {k.config.config_id: k for k in keys}

    def task(self, task_id: bytes) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            raise UnknownTask(
                f"unknown task id {task_id.hex()[:16]}...: the {self.role_name} has no such task"
            )
        return task

    def hpke_configs(self, task_id: bytes) -> list[HpkeConfig]:
        if task_id:
            self.task(task_id)
        return [self.current_config]
