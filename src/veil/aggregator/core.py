"""What the leader and helper logic share: message values, checks, key handling.

The values here are the logic's view of the protocol messages; the gRPC
service modules convert between them and the generated classes, so nothing
below imports generated code.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from veil.aggregator.errors import (
    BatchTooLarge,
    InvalidMessage,
    InvalidToken,
    ReportRejection,
    ReportTimeRejected,
    Unauthenticated,
    UnknownTask,
    WindowOpen,
    WrongLength,
)
from veil.aggregator.maintenance import active_key, ensure_active_key
from veil.aggregator.opener import OpenPool, threads_for
from veil.aggregator.prefixes import PrefixVdaf
from veil.aggregator.store.base import Datastore
from veil.aggregator.store.records import BatchAggregate, ShareMerge
from veil.dp import DPError
from veil.dp.bounds import AggregateBounds
from veil.hpke import (
    AEAD_TAG_SIZE,
    ENC_SIZE,
    Ciphertext,
    HpkeConfig,
    HpkeError,
    HpkeKeypair,
    agg_share_info,
    decapsulate_enc,
    open_payload,
    seal,
)
from veil.invite.token import TokenError, Verifier
from veil.messages import REPORT_ID_SIZE
from veil.metrics import Metrics
from veil.task import (
    OPEN_ENDED,
    AggregatorTask,
    Task,
    TaskError,
    b64e,
    expect_role,
    token_matches,
)
from veil.times import format_duration, format_time
from veil.vdaf import CodecError, Prio3, VdafError
from veil.vdaf.batch.prio3 import BatchPrio3, OutShareBatch
from veil.vdaf.spec.poplar1 import Poplar1

log = logging.getLogger(__name__)

CHECKSUM_SIZE = 32
# Upper bound on the number of time buckets in one collected interval.
MAX_BATCH_BUCKETS = 100_000
# How stale the in-memory copy of the HPKE keys may get before a config
# request or an unknown config id makes the server read them again.
KEY_REFRESH_SECONDS = 1.0

# Reasons a report is rejected during aggregation, by their short names.
BATCH_COLLECTED = ReportRejection.BATCH_COLLECTED
REPORT_REPLAYED = ReportRejection.REPORT_REPLAYED
HPKE_UNKNOWN_CONFIG_ID = ReportRejection.HPKE_UNKNOWN_CONFIG_ID
HPKE_DECRYPT_ERROR = ReportRejection.HPKE_DECRYPT_ERROR
VDAF_DECODE_ERROR = ReportRejection.VDAF_DECODE_ERROR
VDAF_VERIFY_ERROR = ReportRejection.VDAF_VERIFY_ERROR
REPORT_TOO_EARLY = ReportRejection.REPORT_TOO_EARLY
TASK_EXPIRED = ReportRejection.TASK_EXPIRED
INVALID_MESSAGE = ReportRejection.INVALID_MESSAGE
INVALID_TOKEN = ReportRejection.INVALID_TOKEN
REPORT_DROPPED = ReportRejection.REPORT_DROPPED


@dataclass(frozen=True)
class ReportSizes:
    """The exact sizes of a report's parts for one task: its VDAF fixes the
    public share and input shares, the HPKE suite (X25519, AES-128-GCM) the
    encapsulated key and the tag added to each sealed share. An upload of any
    other size is refused before anything is stored: a report padded beyond
    them would only cost storage and make aggregation jobs too large to send
    (issue 13)."""

    public_share: int
    leader_payload: int
    helper_payload: int
    verifier_share: int
    enc: int = ENC_SIZE

    @staticmethod
    def of(vdaf: Prio3[Any, Any], token_size: int = 0) -> ReportSizes:
        """The sizes for `vdaf`; a task with invitations seals a token of
        `token_size` bytes after the helper's input share."""
        return ReportSizes(
            public_share=vdaf.public_share_size(),
            leader_payload=vdaf.input_share_size(0) + AEAD_TAG_SIZE,
            helper_payload=vdaf.input_share_size(1) + token_size + AEAD_TAG_SIZE,
            verifier_share=vdaf.verifier_share_size(),
        )

    @staticmethod
    def of_poplar1(vdaf: Poplar1, token_size: int = 0) -> ReportSizes:
        """The sizes for a Poplar1 task (its verifier shares: at most three
        elements of the leaf's 32-byte field)."""
        return ReportSizes(
            public_share=vdaf.public_share_size(),
            leader_payload=vdaf.input_share_size(0) + AEAD_TAG_SIZE,
            helper_payload=vdaf.input_share_size(1) + token_size + AEAD_TAG_SIZE,
            verifier_share=3 * vdaf.idpf.field_leaf.ENCODED_SIZE,
        )

    def job_item_bytes(self) -> int:
        """An upper bound on one report's bytes in an aggregation job request:
        id, time, public share, sealed helper share, the leader's verifier
        share, and protobuf framing (generously: a tag and a length per field)."""
        payload = REPORT_ID_SIZE + 8 + self.public_share + self.enc + self.helper_payload
        return payload + self.verifier_share + 64

    def check(self, public_share: bytes, leader: Ciphertext, helper: Ciphertext) -> None:
        """Raises WrongLength naming the first part whose size is not exact."""
        for name, got, want in (
            ("public_share", len(public_share), self.public_share),
            ("leader_encrypted_input_share.enc", len(leader.enc), self.enc),
            ("leader_encrypted_input_share.payload", len(leader.payload), self.leader_payload),
            ("helper_encrypted_input_share.enc", len(helper.enc), self.enc),
            ("helper_encrypted_input_share.payload", len(helper.payload), self.helper_payload),
        ):
            if got != want:
                raise WrongLength(f"{name} is {got} bytes; this task's is exactly {want} bytes")


class VerifyInitItem(NamedTuple):
    """One report of an aggregation job as the helper receives it. A plain
    tuple, as VerifyResult: each side builds one of each a report, which as
    frozen dataclasses cost 1.4 and 0.8 µs, as tuples 0.3 and 0.35."""

    report_id: bytes
    time: int
    public_share: bytes
    encrypted_input_share: Ciphertext
    leader_verifier_share: bytes
    # Poplar1, second round: the leader's round-2 sketch share.
    leader_verifier_share_2: bytes = b""


class VerifyResult(NamedTuple):
    report_id: bytes
    verifier_message: bytes | None = None
    reject: ReportRejection | None = None
    # Poplar1, first round: the helper's round-2 sketch share.
    helper_verifier_share: bytes = b""


@dataclass(frozen=True)
class AggregationAnswer:
    """The helper's answer to an aggregation job, as the leader receives it."""

    results: list[VerifyResult]
    # The helper's clock as it answered (epoch seconds), if it said.
    helper_time: float | None = None


def rejection_reason(error: VdafError) -> ReportRejection:
    """The counted rejection reason of a report the VDAF refused."""
    return VDAF_DECODE_ERROR if isinstance(error, CodecError) else VDAF_VERIFY_ERROR


def report_checksum(report_id: bytes) -> bytes:
    return hashlib.sha256(report_id).digest()


def xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("xor of byte strings of different lengths")
    return (int.from_bytes(a) ^ int.from_bytes(b)).to_bytes(len(a))


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


def _when(t: int) -> str:
    return format_time(t) if 0 <= t < OPEN_ENDED else str(t)


def check_window_closed(task: Task, start: int, now: float) -> None:
    """Refuses to close a batch of a task with a window (a survey's) while
    reports may still arrive: collecting marks the batch collected, and every
    later upload to it would fail. Each aggregator checks this on its own."""
    if task.not_after < OPEN_ENDED and start < task.not_after and now < task.not_after:
        raise WindowOpen(
            f"the task accepts reports until {format_time(task.not_after)}: its batches can be"
            f" collected after that, in {format_duration(task.not_after - now)}"
        )


def check_report_time(task: Task, report_time: int, now: float) -> None:
    """Raises ReportTimeRejected for a report too far in the future or outside the task."""
    if report_time > now + task.max_clock_skew:
        raise ReportTimeRejected(
            f"report time {report_time} is {int(report_time - now)} s in the future; at most"
            f" {task.max_clock_skew} s of clock skew is allowed: check the client's clock"
        )
    if not task.not_before <= report_time < task.not_after:
        raise ReportTimeRejected(
            f"report time {format_time(report_time)} is outside the task's window"
            f" [{_when(task.not_before)}, {_when(task.not_after)}): the survey"
            + (" is closed" if report_time >= task.not_after else " is not open yet")
        )
    horizon = task.report_horizon(now)
    if horizon is not None and report_time < horizon:
        # Refused, not stored: garbage collection may already have deleted
        # reports this old, so a replay of one would go unnoticed.
        raise ReportTimeRejected(
            f"report time {report_time} is older than the task's report_expiry_age of"
            f" {task.report_expiry_age} s: the report has expired"
        )


def check_token(task: Task, token: bytes, report_id: bytes, where: str) -> None:
    """Raises InvalidToken unless `token` is valid for this report of `task`
    (a task with invitations): one RSA verification (veil.invite.token)."""
    assert task.issuer_public_key is not None
    if not token:
        raise InvalidToken(
            f"{where} carries no invitation token; this survey takes answers from invited"
            " respondents only"
        )
    try:
        Verifier(task.issuer_public_key).check(token, task.task_id, report_id)
    except TokenError as e:
        raise InvalidToken(f"{where}: invalid invitation token: {e}") from None


def split_helper_share(task: Task, report_id: bytes, plaintext: bytes) -> bytes | None:
    """The helper's input share of a task with invitations, once the token
    sealed after it checks out for this report; None if it does not."""
    size = task.token_size
    if len(plaintext) < size:
        return None
    try:
        check_token(task, plaintext[-size:], report_id, "the report")
    except InvalidToken:
        return None
    return plaintext[:-size]


def job_deltas(
    batch: BatchPrio3[Any, Any],
    out_shares: OutShareBatch,
    accepted: Iterable[tuple[int, bytes, int]],
) -> list[BatchAggregate]:
    """What a job adds to each time bucket, from (bucket, report_id, row)
    triples of reports that passed, with each bucket's output shares added
    in the batch field and converted once."""
    rows: dict[int, list[int]] = {}
    sums: dict[int, int] = {}  # the XOR of the reports' checksums, as an integer
    sha256 = hashlib.sha256
    for bucket, report_id, row in accepted:
        rows.setdefault(bucket, []).append(row)
        sums[bucket] = sums.get(bucket, 0) ^ int.from_bytes(sha256(report_id).digest())
    return [
        BatchAggregate(
            bucket,
            batch.vdaf.encode_agg_share(batch.aggregate_rows(out_shares, picked)),
            len(picked),
            sums[bucket].to_bytes(CHECKSUM_SIZE),
        )
        for bucket, picked in rows.items()
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


def check_id(value: bytes, name: str) -> None:
    """A job id of a request: 16 bytes (InvalidMessage names the field)."""
    if len(value) != 16:
        raise InvalidMessage(f"{name} must be 16 bytes")


def seal_share(
    task: Task,
    role: int,
    start: int,
    duration: int,
    count: int,
    payload: bytes,
    agg_param: bytes = b"",
) -> Ciphertext:
    """An aggregator's noised aggregate share of a batch, sealed to the
    collector under the batch's context (its released count, the noise's
    parameters, the aggregation parameter)."""
    assert task.collector_hpke_config is not None
    return seal(
        task.collector_hpke_config,
        agg_share_info(
            role,
            task.task_id,
            start,
            duration,
            task.dp.released_count(count),
            dp_params=task.dp.binding(task.vdaf),
            agg_param=agg_param,
        ),
        payload,
    )


class TaskLimitError(ValueError):
    """A task whose noise or field cannot hold a batch of min_batch_size reports."""


def task_bounds(task: Task) -> AggregateBounds:
    """The task's aggregate bounds (veil.dp.bounds); TaskLimitError if even a batch
    of min_batch_size reports could wrap around the field."""
    try:
        bounds = task.dp.bounds(task.vdaf)
        bounds.check_batch_floor(task.min_batch_size)
    except (TaskError, DPError) as e:
        raise TaskLimitError(f"task {task.id_text}: {e}") from None
    return bounds


def check_batch_size(task: Task, bounds: AggregateBounds, count: int) -> None:
    """Raises BatchTooLarge for a batch whose sum could wrap around the field."""
    if count > bounds.max_batch_size:
        raise BatchTooLarge(
            f"the batch holds more reports than this task can sum without wrapping around"
            f" the field (at most {bounds.max_batch_size}): collect shorter intervals"
        )


AT = TypeVar("AT", bound=AggregatorTask)


# An input share to open: its key (None: no key has its config id), the
# ciphertext's encapsulated key and payload, and the context.
_Sealed = tuple[HpkeKeypair | None, bytes, bytes | memoryview, bytes]


def _decapsulated(share: _Sealed) -> ReportRejection | bytes:
    """The first step of opening one input share: the DH output
    (veil.hpke.decapsulate_enc), or why it does not open."""
    keypair, enc, _payload, _info = share
    if keypair is None:
        return HPKE_UNKNOWN_CONFIG_ID
    try:
        return decapsulate_enc(keypair, enc)
    except HpkeError:
        return HPKE_DECRYPT_ERROR


def _open_decapsulated(share: _Sealed, dh: ReportRejection | bytes) -> ReportRejection | bytes:
    """The rest of the open from `_decapsulated`'s outcome: the plaintext,
    or why it does not open (a rejection already found is passed on)."""
    if isinstance(dh, ReportRejection):
        return dh
    keypair, enc, payload, info = share
    assert keypair is not None
    try:
        return open_payload(keypair, enc, payload, info, dh)
    except HpkeError:
        return HPKE_DECRYPT_ERROR


def tally_open(outcome: ReportRejection | bytes, tally: dict[str, int]) -> dict[str, int]:
    """Add an open's outcome to `tally` (counts by the metric's label:
    "ok" or the rejection reason); returns `tally`."""
    label = outcome.value if isinstance(outcome, ReportRejection) else "ok"
    tally[label] = tally.get(label, 0) + 1
    return tally


class AggregatorBase(Generic[AT]):
    """Tasks, HPKE keys and clock common to both aggregators."""

    role_name = "aggregator"
    # The task type this aggregator serves (LeaderTask or HelperTask).
    task_type: type[AggregatorTask] = AggregatorTask

    def __init__(
        self,
        tasks: Mapping[bytes, AT],
        store: Datastore,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
        open_threads: int = 0,
    ) -> None:
        self.metrics = metrics
        # A job's input shares are opened over these threads (veil.aggregator.
        # opener; the setting is a server's `open_threads`, 0: one per core).
        self.opener = OpenPool(threads_for(open_threads))
        # The HPKE outcome counters by label: looking a labelled child up
        # costs more than counting, once per report.
        self._open_counters: dict[str, Any] = {}
        self.store = store
        self.clock = clock
        self.tasks: dict[bytes, AT] = {}
        self.vdafs: dict[bytes, Prio3[Any, Any]] = {}
        self.batch_vdafs: dict[bytes, BatchPrio3[Any, Any]] = {}
        self.sizes: dict[bytes, ReportSizes] = {}
        self.bounds: dict[bytes, Any] = {}
        # Poplar1 tasks (veil.aggregator.prefixes), apart from the Prio3 ones.
        self.prefix_vdafs: dict[bytes, PrefixVdaf] = {}
        self.add_tasks(tasks)
        ensure_active_key(store, clock())
        self._keys_read_at = -float("inf")
        self._keys_lock = threading.Lock()
        self.refresh_keys()

    def add_tasks(self, tasks: Mapping[bytes, AT]) -> list[AT]:
        """Serve these tasks too (at start, and on SIGHUP for task files added
        to the config since); returns the ones that were new. A task already
        served must come back unchanged: task parameters are immutable."""
        new = {}
        for tid, t in tasks.items():
            expect_role(t, self.task_type, f"task {t.id_text}")
            known = self.tasks.get(tid)
            if known is not None:
                if known != t:
                    raise TaskError(
                        f"task {t.id_text} changed in its file; task parameters are"
                        " immutable (restart with a new task instead)"
                    )
                continue
            new[tid] = t
        prefix = {tid: PrefixVdaf.of(t) for tid, t in new.items() if t.vdaf.is_prefix}
        vdafs = {tid: t.vdaf.instantiate() for tid, t in new.items() if tid not in prefix}
        # Computed (and refused) here, before serving, rather than after a
        # collection has spent budget: the noise bound exercises the interval
        # arithmetic.
        bounds = {tid: task_bounds(t) for tid, t in new.items()}
        # The batched (NumPy) path verifies a whole job at once; it agrees
        # with the scalar path report by report. Everything a request needs
        # is in place before the task becomes visible in `tasks`.
        self.vdafs.update(vdafs)
        self.batch_vdafs.update({tid: BatchPrio3(v) for tid, v in vdafs.items()})
        self.sizes.update({tid: ReportSizes.of(v, new[tid].token_size) for tid, v in vdafs.items()})
        self.prefix_vdafs.update(prefix)
        self.sizes.update(
            {tid: ReportSizes.of_poplar1(p.vdaf, new[tid].token_size) for tid, p in prefix.items()}
        )
        self.bounds.update(bounds)
        self.tasks = {**self.tasks, **new}
        return list(new.values())

    def refresh_keys(self) -> None:
        """Re-read the key set from storage, where `veil keys` changes it."""
        keys = self.store.hpke_keys()
        current = active_key(keys) or max(keys, key=lambda k: k.created)
        # Two assignments of whole values: readers see the old or the new set.
        self.keypairs: dict[int, HpkeKeypair] = {k.config_id: k.keypair for k in keys}
        self.current_config: HpkeConfig = current.keypair.config
        self._keys_read_at = time.monotonic()

    def _maybe_refresh_keys(self) -> None:
        # At most once per KEY_REFRESH_SECONDS, whatever the traffic: a flood
        # of unknown config ids costs one small query a second, no more.
        if time.monotonic() - self._keys_read_at < KEY_REFRESH_SECONDS:
            return
        if self._keys_lock.acquire(blocking=False):
            try:
                self.refresh_keys()
            finally:
                self._keys_lock.release()

    def know_keys(self, config_ids: Iterable[int]) -> None:
        """Re-read the keys now if any of `config_ids` is unknown here: before
        an aggregation job rejects a report as hpke_unknown_config_id, since
        another process may have added the key since we last looked (once per
        job, whatever the rate limit of `keypair`)."""
        if any(i not in self.keypairs for i in config_ids):
            with self._keys_lock:
                self.refresh_keys()

    def keypair(self, config_id: int) -> HpkeKeypair | None:
        """The stored key with this config id (re-reading storage if unknown)."""
        keypair = self.keypairs.get(config_id)
        if keypair is None:
            self._maybe_refresh_keys()
            keypair = self.keypairs.get(config_id)
        return keypair

    def open_share(
        self,
        keypair: HpkeKeypair | None,
        ct: Ciphertext,
        info: bytes,
        tally: dict[str, int] | None = None,
    ) -> ReportRejection | bytes:
        """Open an input share: the plaintext, or the rejection reason. Counted
        in the metrics, or with `tally` added to it by outcome, for
        `count_opens` to count once per job rather than once per share."""
        share = (keypair, ct.enc, ct.payload, info)
        outcome: ReportRejection | bytes
        if keypair is not None and keypair.config.config_id != ct.config_id:
            outcome = HPKE_DECRYPT_ERROR  # as veil.hpke.decapsulate refuses it
        else:
            outcome = _open_decapsulated(share, _decapsulated(share))
        if tally is not None:
            tally_open(outcome, tally)
        else:
            self.count_opens(tally_open(outcome, {}))
        return outcome

    def open_shares(
        self, shares: Sequence[tuple[Ciphertext, bytes]]
    ) -> list[ReportRejection | bytes]:
        """Each (ciphertext, info) of a job opened, in order: the plaintext
        or the rejection reason. Not counted: the caller adds each outcome
        it uses with `tally_open`, and counts the tally with `count_opens`.

        The X25519 of every open, which runs without the GIL, is spread over
        the opener's threads; the rest of each open (the key schedule and
        AES-GCM, which hold the GIL) follows in this thread. Threads that
        each ran whole opens would wait for the GIL at every open, and each
        wait hands it from core to core: CPU one thread never pays."""
        keypair = self.keypair
        return self._open_all(
            [(keypair(ct.config_id), ct.enc, ct.payload, info) for ct, info in shares]
        )

    def open_stored_shares(
        self, shares: Sequence[tuple[bytes, bytes]]
    ) -> list[ReportRejection | bytes]:
        """`open_shares` of ciphertexts in their stored form (`Ciphertext.
        to_bytes`: config id, encapsulated key, payload), opened in place:
        a leader's job reads thousands, and a `Ciphertext` of each, with its
        payload copied out, cost about 2 µs a report."""
        keypair = self.keypair
        e = 1 + ENC_SIZE
        return self._open_all(
            # (An empty one, which upload never stores, has no config id:
            # rejected as of an unknown config.)
            [
                (keypair(ct[0]) if ct else None, ct[1:e], memoryview(ct)[e:], info)
                for ct, info in shares
            ]
        )

    def _open_all(self, keyed: list[_Sealed]) -> list[ReportRejection | bytes]:
        dhs = self.opener.map(_decapsulated, keyed)
        return [_open_decapsulated(share, dh) for share, dh in zip(keyed, dhs, strict=True)]

    def count_opens(self, tally: dict[str, int]) -> None:
        """Count the outcomes `open_share` added to `tally` in the metrics."""
        if self.metrics is None:
            return
        for label, n in tally.items():
            counter = self._open_counters.get(label)
            if counter is None:
                counter = self._open_counters[label] = self.metrics.hpke_opens.labels(label)
            counter.inc(n)

    def task(self, task_id: bytes) -> AT:
        task = self.tasks.get(task_id)
        if task is None:
            raise UnknownTask(
                f"unknown task id {b64e(task_id)} (base64url, as in task files): the"
                f" {self.role_name} has no such task; a task file added to its config after it"
                " started is loaded on SIGHUP (kill -HUP <pid>) or at restart"
            )
        return task

    def hpke_configs(self, task_id: bytes) -> list[HpkeConfig]:
        if task_id:
            self.task(task_id)
        self._maybe_refresh_keys()
        return [self.current_config]
