"""What `Client` and `AsyncClient` share: everything but the waiting.

The task, the trust check, the HPKE config cache, sharding and sealing
(`veil.client.prepare`), the retry policy and the outbox's delivery plan
live here once; the two clients differ only in how they wait for the
network (a blocking gRPC channel, or grpc.aio) and where the CPU-bound work
runs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from veil.client.outbox import DEFAULT_MAX_REPORTS, Outbox
from veil.client.prepare import prepare_reports
from veil.client.retry import RetryPolicy, UploadError
from veil.hpke import HpkeConfig
from veil.messages import MessageError, Report
from veil.messages.wire import hpke_configs_from_pb
from veil.protocol.v1 import messages_pb2
from veil.task import Task
from veil.trust import check_roots
from veil.vdaf.batch.poplar1 import BatchPoplar1
from veil.vdaf.batch.prio3 import BatchPrio3
from veil.vdaf.spec.poplar1 import Poplar1
from veil.vdaf.spec.prio3 import Prio3

log = logging.getLogger("veil.client")

# How long a fetched HPKE config is used before it is fetched again. An
# aggregator that rotates its key keeps opening reports sealed to the old
# one for its grace period ([keys] grace_seconds), which must be longer.
CONFIG_LIFETIME = 3600.0


@dataclass(frozen=True)
class ClientOptions:
    """How a `Client` or `AsyncClient` reaches the aggregators, retries and
    keeps its reports: every setting but the task, said once.

    Trust (veil.trust): `leader_root_certificates` and
    `helper_root_certificates` (PEM) are the private CAs of the leader and of
    the helper (None: the system roots); one certificate in both is refused,
    since either aggregator could then pose as the other and open both input
    shares, and a CA the task pins must be the one given. TLS is used unless
    an aggregator is on loopback with no certificates given.
    `private_key`/`certificate_chain` (PEM): the client's certificate, where
    an aggregator requires one (mTLS).

    A call that fails on the way (leader unreachable, restarting) is retried
    `retries` times with exponential backoff from `backoff` seconds, waiting
    at most `max_delay` (veil.client.retry.RetryPolicy), each attempt given
    `timeout` seconds; a leader whose backlog is full advises a wait, which
    is honoured (an advice longer than `max_delay` ends the retries).
    Uploads go in requests of at most `batch_size` reports. `clock` gives
    the reports' time; a fetched HPKE config is used for `config_lifetime`
    seconds.

    With `outbox` (a file path), every report is sealed and committed to
    that SQLite file before it is sent, and leaves it only once the leader
    acknowledged it (veil.client.outbox), at most `outbox_max_reports` of
    them (OutboxFull beyond).
    """

    leader_root_certificates: bytes | None = None
    helper_root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    timeout: float = 30.0
    retries: int = 5
    backoff: float = 0.5
    max_delay: float = 30.0
    batch_size: int = 1000
    clock: Callable[[], float] = time.time
    config_lifetime: float = CONFIG_LIFETIME
    outbox: str | os.PathLike[str] | None = None
    outbox_max_reports: int = DEFAULT_MAX_REPORTS

    @classmethod
    def given(cls, options: ClientOptions | None, changes: dict[str, Any]) -> ClientOptions:
        """`options` (by default all the defaults) with `changes`, a
        client's keyword shorthand: ``Client(task, retries=0)`` is
        ``Client(task, ClientOptions(retries=0))``. Raises TypeError on a
        name that is not an option."""
        return dataclasses.replace(options or cls(), **changes)


@dataclass(frozen=True)
class UploadResult:
    """What an upload or a flush did.

    `accepted`: reports the leader stored; `duplicates`: reports it already
    held (a resend), acknowledged and not stored again. With an outbox also:
    `pending`, reports of the task still waiting in the outbox (the leader
    was unreachable, or refused the call for a reason not about the reports,
    such as an unknown task; `error` says why); `refused`, reports the
    leader refused for their own sake (malformed, out of range, a reused
    id: kept in the outbox, never resent); `expired`, reports dropped
    unsent because they passed the task's report_expiry_age; `retry_after`,
    the leader's advice (seconds) on when to flush again, when it refused
    for a full backlog.
    """

    accepted: int
    duplicates: int
    pending: int = 0
    refused: int = 0
    expired: int = 0
    error: str | None = None
    retry_after: float | None = None


# The leader refuses an upload of more than 10,000 reports or more than its
# max_message_bytes (16 MiB by default); the client's requests stay well
# under both, whatever the size of a task's reports.
MAX_UPLOAD_REPORTS = 10_000
MAX_UPLOAD_BYTES = 4 << 20


def _report_bytes(r: Report) -> int:
    # Bytes on the wire, with a generous allowance for protobuf framing.
    cts = len(r.leader_ct.enc) + len(r.leader_ct.payload) + len(r.helper_ct.enc)
    return len(r.report_id) + len(r.public_share) + cts + len(r.helper_ct.payload) + 64


def upload_batches(reports: Sequence[Report], batch_size: int) -> Iterator[Sequence[Report]]:
    """Consecutive slices of `reports`, each of at most `batch_size` (and
    MAX_UPLOAD_REPORTS) reports and MAX_UPLOAD_BYTES bytes (or one report)."""
    limit = min(batch_size, MAX_UPLOAD_REPORTS)
    start = size = 0
    for i, r in enumerate(reports):
        n = _report_bytes(r)
        if i > start and (i - start >= limit or size + n > MAX_UPLOAD_BYTES):
            yield reports[start:i]
            start, size = i, 0
        size += n
    if start < len(reports):
        yield reports[start:]


# Refusals that are about a report itself (its encoding, its time, its id):
# such a report is set aside. Any other refusal (unknown task, wrong
# credentials, a server's own state) says nothing against the report, so the
# outbox keeps it pending rather than strand it.
REPORT_REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)


def _refuses_report(error: UploadError) -> bool:
    return not error.retryable and error.code in REPORT_REFUSALS


@dataclass(frozen=True)
class PartlyRefused:
    """A request the leader took, naming the reports it refused, each for its
    own sake (DAP's UploadErrors): `refused` maps their ids to why, `taken`
    counts the others."""

    taken: UploadResult
    refused: dict[bytes, str]


R = TypeVar("R")
# What the delivery plan is told about a batch it asked to send.
Sent = UploadResult | UploadError | PartlyRefused


class ClientBase:
    """The parts of a client that do not wait on the network."""

    def __init__(self, task: Task, options: ClientOptions) -> None:
        if options.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        check_roots(
            options.leader_root_certificates,
            options.helper_root_certificates,
            task.leader_ca_sha256,
            task.helper_ca_sha256,
        )
        self.task = task
        self.options = options
        self.vdaf: Prio3[Any, Any] | Poplar1
        self._batch: BatchPrio3[Any, Any] | BatchPoplar1
        if task.vdaf.is_prefix:
            self.vdaf = task.vdaf.instantiate_poplar1()
            self._batch = BatchPoplar1(self.vdaf)
        else:
            self.vdaf = task.vdaf.instantiate()
            self._batch = BatchPrio3(self.vdaf)
        self.timeout = options.timeout
        self.policy = RetryPolicy(options.retries, options.backoff, options.max_delay)
        self.batch_size = options.batch_size
        self.clock = options.clock
        self.config_lifetime = options.config_lifetime
        self._configs: dict[int, tuple[HpkeConfig, float]] = {}
        self._configs_lock = threading.Lock()
        self.outbox = (
            None if options.outbox is None else Outbox(options.outbox, options.outbox_max_reports)
        )

    def unreachable(self, error: UploadError, is_leader: bool, attempts: int) -> UploadError:
        """`error` naming the aggregator that could not be reached, if that is
        what it is (see RpcRefused.naming_peer)."""
        if is_leader:
            return error.naming_peer("leader", self.task.leader_address, f" ({attempts} attempts)")
        return error.naming_peer("helper", self.task.helper_address, f" ({attempts} attempts)")

    @property
    def retries(self) -> int:
        return self.policy.retries

    @property
    def backoff(self) -> float:
        return self.policy.backoff

    def _close_outbox(self) -> None:
        if self.outbox is not None:
            self.outbox.close()

    # -- HPKE configs ------------------------------------------------------

    def _cached_config(self, role: int) -> HpkeConfig | None:
        """A config fetched less than `config_lifetime` ago, from memory."""
        with self._configs_lock:
            cached = self._configs.get(role)
        if cached is not None and time.monotonic() - cached[1] < self.config_lifetime:
            return cached[0]
        return None

    def _known_config(self, role: int) -> HpkeConfig | None:
        """A config fetched less than `config_lifetime` ago: from memory, or
        from the outbox (so that a client restarted during an outage can
        still seal). May read the outbox file."""
        cached = self._cached_config(role)
        if cached is not None:
            return cached
        if self.outbox is not None:
            saved = self.outbox.config(self.task.task_id, role)
            if saved is not None:
                age = time.time() - saved[1]
                if 0 <= age < self.config_lifetime:
                    with self._configs_lock:
                        self._configs[role] = (saved[0], time.monotonic() - age)
                    return saved[0]
        return None

    def _remember_config(self, role: int, reply: messages_pb2.HpkeConfigList) -> HpkeConfig:
        try:
            usable = hpke_configs_from_pb(reply)
        except MessageError as e:
            raise UploadError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None
        if not usable:
            raise UploadError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the aggregator offers no HPKE config with X25519/HKDF-SHA256/AES-128-GCM",
            )
        with self._configs_lock:
            self._configs[role] = (usable[0], time.monotonic())
        if self.outbox is not None:
            self.outbox.save_config(self.task.task_id, role, usable[0], time.time())
        return usable[0]

    def _config_request(self) -> messages_pb2.HpkeConfigRequest:
        return messages_pb2.HpkeConfigRequest(task_id=self.task.task_id)

    # -- reports -----------------------------------------------------------

    def report_time(self) -> int:
        """Now, rounded down to the task's time_precision."""
        now = int(self.clock())
        return now - now % self.task.time_precision

    def _prepare(
        self,
        measurements: Sequence[Any],
        leader: HpkeConfig,
        helper: HpkeConfig,
        report_time: int | None,
        randomized: bool = False,
    ) -> list[Report]:
        return prepare_reports(
            self.task,
            measurements,
            leader,
            helper,
            self.report_time() if report_time is None else report_time,
            batch=self._batch,
            randomized=randomized,
        )

    def _chunks(self, reports: Sequence[Report]) -> Iterator[Sequence[Report]]:
        return upload_batches(reports, self.batch_size)

    # -- the outbox's delivery plan ----------------------------------------

    def _delivery_plan(self) -> Generator[list[Report], Sent, UploadResult]:
        """Deliver what the outbox holds for the task (`delivery_plan`)."""
        assert self.outbox is not None
        return delivery_plan(self.outbox, self.task, self.clock(), self.batch_size, upload_batches)


def delivery_plan(
    box: Outbox[R],
    task: Task,
    now: float,
    batch_size: int,
    chunks: Callable[[Sequence[R], int], Iterator[Sequence[R]]],
) -> Generator[list[R], Sent, UploadResult]:
    """Deliver what `box` holds for `task`, oldest first, in the requests
    `chunks` makes of at most `batch_size` reports.

    A generator that yields each batch to send and is sent back what came
    of it, so that every client (blocking, asyncio, DAP) drives the same
    decisions: a batch acknowledged leaves the outbox; an error worth
    retrying later (leader unreachable after the retry policy), or one that
    is not about the reports (an unknown task, a wrong credential), stops
    the flush with everything still pending; a batch refused for a report's
    own sake (REPORT_REFUSALS) is sent again report by report, to keep the
    good ones apart from the refused, which stay in the outbox marked
    refused. A leader that names the reports it refused in its answer
    (DAP's UploadErrors: `PartlyRefused`) has the others acknowledged at
    once.
    """
    task_id, report_id = task.task_id, box.codec.report_id
    expired = box.drop_expired(task_id, task.report_horizon(now))
    if expired:
        log.warning("outbox: dropped %d reports past the task's report_expiry_age", expired)
    accepted = duplicates = refused = 0
    error: str | None = None
    retry_after: float | None = None
    after = 0
    while error is None:
        rows = box.pending(task_id, batch_size, after)
        if not rows:
            break
        after = rows[-1][0]
        for chunk in chunks([r for _, r in rows], batch_size):
            reports = list(chunk)
            outcome = yield reports
            if isinstance(outcome, PartlyRefused):
                for report in reports:
                    why = outcome.refused.get(report_id(report))
                    if why is not None:
                        log.warning("outbox: the leader refused a report for good: %s", why)
                        box.refuse(task_id, report_id(report), why)
                        refused += 1
                box.acknowledge(
                    task_id, [report_id(r) for r in reports if report_id(r) not in outcome.refused]
                )
                accepted += outcome.taken.accepted
                duplicates += outcome.taken.duplicates
                continue
            bisect = isinstance(outcome, UploadError) and _refuses_report(outcome)
            if bisect and len(reports) > 1:
                # One bad report refuses the whole request: find it.
                outcomes = []
                for r in reports:
                    outcomes.append((r, (yield [r])))
            else:
                outcomes = [(r, outcome) for r in reports]
            done = []
            for report, result in outcomes:
                if isinstance(result, UploadResult):
                    done.append(report_id(report))
                elif isinstance(result, PartlyRefused):
                    why = result.refused.get(report_id(report))
                    if why is None:
                        done.append(report_id(report))
                    else:
                        box.refuse(task_id, report_id(report), why)
                        refused += 1
                elif not _refuses_report(result):
                    error = str(result)
                    retry_after = result.retry_after
                else:
                    log.warning("outbox: the leader refused a report for good: %s", result)
                    box.refuse(task_id, report_id(report), str(result))
                    refused += 1
            box.acknowledge(task_id, done)
            # One result per request sent, however many reports it carried.
            for result in {id(o): o for _, o in outcomes}.values():
                if isinstance(result, UploadResult):
                    accepted += result.accepted
                    duplicates += result.duplicates
                elif isinstance(result, PartlyRefused):
                    accepted += result.taken.accepted
                    duplicates += result.taken.duplicates
            if error is not None:
                break
    pending = box.pending_count(task_id)
    if error is not None:
        log.warning("outbox: %d reports kept for a later flush: %s", pending, error)
    return UploadResult(accepted, duplicates, pending, refused, expired, error, retry_after)


def advance(
    plan: Generator[list[R], Sent, UploadResult], sent: Sent | None
) -> list[R] | UploadResult:
    """The plan's next batch to send, or its result once it is done."""
    try:
        return next(plan) if sent is None else plan.send(sent)
    except StopIteration as stop:
        result: UploadResult = stop.value
        return result
