"""The collector (draft-ietf-ppm-dap section 4.6, collector side).

It asks the leader to collect a batch (a time interval), polls the collection
job, opens the leader's and the helper's noised aggregate shares with its HPKE
key, adds them, lifts each field element to the centred integer (v >= p/2
means v - p, since noise can be negative) and returns the estimate with its
confidence interval, the report count and the ε spent.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import grpc

from veil.collector.estimate import collection_guarantee, estimates, interval_kind
from veil.dp import decode
from veil.dp.accounting import Guarantee
from veil.dp.bounds import AggregateBounds
from veil.dp.estimates import Estimate
from veil.dp.heavy_hitters import HeavyHittersPlan, count_estimates
from veil.grpc_util import RpcRefused, is_retryable, open_channel
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeError, agg_share_info, open_
from veil.messages.wire import ciphertext_from_pb
from veil.protocol.v1 import leader_pb2, leader_pb2_grpc, messages_pb2
from veil.task import CollectorTask, expect_role
from veil.trust import check_roots
from veil.vdaf import Prio3
from veil.vdaf.errors import AggParamError
from veil.vdaf.spec.idpf import to_bits
from veil.vdaf.spec.poplar1 import Poplar1, Poplar1AggParam

log = logging.getLogger(__name__)


class UnusableTask(ValueError):
    """The task's results could not be computed (its parameters are too extreme)."""


class CollectionError(RpcRefused):
    """The collection was refused or failed; `code` is the gRPC status."""


class CollectionJobFailed(CollectionError):
    """The leader ran the collection job and it failed (the job is over: a
    new job may be tried; the aggregators still collect a batch at most once)."""


class WrongCollectorKey(CollectionError):
    """The task seals aggregate shares to another collector key than ours."""


@dataclass(frozen=True)
class CollectionResult:
    """A collected batch.

    `estimate` is a Fraction for count and sum tasks and a list of Fractions
    for vector tasks; `lower`/`upper` bound each coordinate at `confidence`:
    each coordinate on its own, or all of them at once, as `intervals` says
    ("per-coordinate", "simultaneous (exact max-of-k)" or "simultaneous
    (Bonferroni)", the latter with a local layer). `spent` is what the ledgers charged, in `unit`
    ("epsilon", "rho" for the gaussian mechanism, None for none): the weaker
    guarantee, which in split mode is more than the collector's ε.
    `against_collector` is this collection's guarantee against the collector (ρ
    is shown with the (ε, δ) it implies). With mechanism "none" the estimate is
    the exact aggregate and the bounds equal it.
    """

    start: int
    duration: int
    report_count: int
    estimate: Any
    lower: Any
    upper: Any
    confidence: float
    intervals: str
    spent: Fraction
    unit: str | None
    against_collector: Guarantee
    mechanism: str
    noisy_aggregate: list[int]
    seconds: float
    # Coordinates whose decoded value lies outside [-B, n·max + B] (B: the noise
    # bound, veil.dp.bounds): impossible for an honest batch that did not wrap
    # around the field, except with probability 1e-12. Empty when all is well.
    out_of_range: tuple[int, ...] = ()
    # The aggregator roles whose noise the result carries: both, or veil's one
    # when the other runs another DAP implementation (which adds none).
    noise_added_by: tuple[str, ...] = ("leader", "helper")
    # The leader's collection job of a batch it chose (DAP's leader-selected
    # mode, `DapCollector.collect_next`): its id names the batch to the
    # collector, whom DAP's CollectionJobResp does not tell the batch id.
    collection_job_id: bytes | None = None

    @property
    def epsilon_spent(self) -> Fraction:
        """The ε this collection gives against the collector: pure ε, or for zCDP the
        ε implied at the task's δ (see `against_collector` for ρ and δ); 0 for none."""
        return self.against_collector.epsilon or Fraction(0)


@dataclass(frozen=True)
class PrefixCounts:
    """One level of a poplar1 batch, collected.

    `prefixes` are the aggregation parameter's, each `level + 1` bools (at a
    byte level, `prefix_bytes` gives them as bytes); `noisy_counts[i]` is the
    noised number of reports whose string begins with `prefixes[i]` (both
    aggregators' noise, decoded to a signed integer); `estimates[i]` its
    value and interval at `confidence` (each on its own). `report_count` is
    the number of reports both aggregators accepted at this level (0 for a
    task with add_remove neighbouring, where it is protected). `spent` is what
    this level charged on each ledger, in `unit`.
    """

    start: int
    duration: int
    level: int
    prefixes: tuple[tuple[bool, ...], ...]
    noisy_counts: list[int]
    estimates: list[Estimate]
    confidence: float
    report_count: int
    spent: Fraction
    unit: str | None
    seconds: float

    def prefix_bytes(self) -> list[bytes]:
        """The prefixes as byte strings (at a byte level: 7, 15, ...)."""
        return [prefix_to_bytes(p) for p in self.prefixes]


def text_agg_param(candidates: Iterable[bytes]) -> Poplar1AggParam:
    """The aggregation parameter asking for the counts of `candidates`, byte
    strings all of one length k: level 8k - 1, prefixes sorted and distinct
    (the draft's order)."""
    unique = sorted(set(candidates))
    if not unique:
        raise ValueError("no candidate prefixes")
    length = len(unique[0])
    if length == 0 or any(len(c) != length for c in unique):
        raise ValueError("candidate prefixes must be non-empty byte strings of one length")
    return Poplar1AggParam(8 * length - 1, tuple(tuple(to_bits(c)) for c in unique))


def prefix_to_bytes(prefix: Sequence[bool]) -> bytes:
    """A prefix of whole bytes as bytes (ValueError otherwise)."""
    if len(prefix) % 8:
        raise ValueError(f"a prefix of {len(prefix)} bits is not whole bytes")
    return Poplar1.prefix_to_bytes(prefix)


def _reason(message: str) -> str:
    """The leader's reason for retrying a job, without its own "retrying: "."""
    return message.removeprefix("retrying: ")


# How often, at least, a collection that waits says why (seconds).
WAIT_REPORT = 5.0
# The longest wait between two polls of a collection job. A text question's
# levels run one after another, each a few seconds, so their polls stay
# short: a level's result is not left waiting for the next poll.
MAX_POLL = 2.0
PREFIX_POLL = 0.25


class _Waiting:
    """Says what a collection waits for, the first time and then at most every
    WAIT_REPORT seconds (a message that changes is said at once)."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float]) -> None:
        self._say = say
        self._clock = clock
        self._last = float("-inf")
        self._said = ""

    def say(self, what: str, next_try: float) -> None:
        now = self._clock()
        if what == self._said and now - self._last < WAIT_REPORT:
            return
        self._last, self._said = now, what
        self._say(f"{what}; next try in {max(next_try, 0.1):.1f} s")


def _code(n: int) -> grpc.StatusCode:
    for c in grpc.StatusCode:
        if c.value[0] == n:
            return c
    return grpc.StatusCode.UNKNOWN


class Collector:
    """Collects batches of one task; `task` is the collector's task file.

    The collector talks to the leader only (the helper's aggregate share
    reaches it sealed to its own HPKE key, through the leader), so it takes
    the leader's trust alone: `leader_root_certificates` (PEM, None: the
    system roots), which must be the CA the task pins for the leader, if it
    pins one. Raises veil.trust.TrustError otherwise.
    """

    def __init__(
        self,
        task: CollectorTask,
        *,
        leader_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task: CollectorTask = expect_role(task, CollectorTask)
        # Everything the results need that can fail is computed now, before a
        # collection request makes both aggregators spend budget.
        try:
            self.bounds = task.dp.bounds(task.vdaf)
            self.bounds.check_batch_floor(task.min_batch_size)
            if task.vdaf.is_prefix:
                self.poplar1: Poplar1 | None = task.vdaf.instantiate_poplar1()
                self.text_plan: HeavyHittersPlan | None = task.dp.text_plan(task.vdaf)
            else:
                self.poplar1, self.text_plan = None, None
                self.vdaf = task.vdaf.instantiate()
                estimates(task, [0] * len(self.vdaf.agg_init(None)), 0.95, task.min_batch_size)
        except ValueError as e:
            raise UnusableTask(
                f"this task's results cannot be computed ({e}); nothing was collected or spent"
            ) from None
        self.timeout = timeout
        self.clock = clock
        check_roots(leader_root_certificates, None, task.leader_ca_sha256)
        self._channel = open_channel(
            task.leader_address, leader_root_certificates, private_key, certificate_chain
        )
        self._leader = leader_pb2_grpc.LeaderStub(self._channel)  # type: ignore[no-untyped-call]
        self._metadata = (("authorization", f"Bearer {task.collector_token}"),)

    def close(self) -> None:
        """Close the channel to the leader."""
        self._channel.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: Callable[..., Any],
        request: Any,
        deadline: float,
        waiting: _Waiting | None = None,
    ) -> Any:
        delay = 0.2
        while True:
            try:
                return method(request, metadata=self._metadata, timeout=self.timeout)
            except grpc.RpcError as e:
                # The same request again (the same collection job id), as long
                # as the leader says it may succeed later.
                if is_retryable(e) and self.clock() + delay < deadline:
                    pause = delay * (0.5 + secrets.randbelow(1000) / 1000)
                    if waiting is not None:
                        refused = CollectionError.from_rpc(e)
                        waiting.say(
                            f"retrying: the leader at {self.task.leader_address} answered"
                            f" {refused.code.name}: {refused.message or 'no reason given'}",
                            pause,
                        )
                    time.sleep(pause)
                    delay = min(delay * 2, 5.0)
                    continue
                error = CollectionError.from_rpc(e)
                raise error.naming_peer("leader", self.task.leader_address) from None

    def job_state(self, job_id: bytes, wait: float = 15.0) -> tuple[str, str]:
        """(state, why) of a collection job the leader knows: "pending" with the
        reason it is being retried ("" if none yet), "finished", or "failed"
        with its message; ("unknown", message) if the leader does not know it."""
        request = leader_pb2.GetCollectionRequest(
            task_id=self.task.task_id, collection_job_id=job_id
        )
        try:
            job = self._call(self._leader.GetCollection, request, self.clock() + wait)
        except CollectionError as e:
            if e.code is grpc.StatusCode.NOT_FOUND:
                return "unknown", e.message
            raise
        state = {
            leader_pb2.CollectionJob.PENDING: "pending",
            leader_pb2.CollectionJob.FINISHED: "finished",
            leader_pb2.CollectionJob.FAILED: "failed",
        }.get(job.state, "unknown")
        return state, _reason(job.error_message)

    def task_info(self, wait: float = 15.0) -> Any:
        """The leader's TaskInfo of this task (leader.proto): the collector key
        it seals to, reports received and rejected, collections finished."""
        request = leader_pb2.TaskInfoRequest(task_id=self.task.task_id)
        return self._call(self._leader.GetTaskInfo, request, self.clock() + wait)

    def check_collector_key(self, wait: float = 15.0) -> None:
        """Asks the leader which collector HPKE key the task seals aggregate
        shares to; WrongCollectorKey unless it is ours. Run it before closing a
        batch: a share sealed to another key cannot be opened, and the batch
        it came from is spent."""
        assert self.task.collector_hpke_keypair is not None
        reply = self.task_info(wait).collector_hpke_config
        ours = self.task.collector_hpke_keypair.config
        if (reply.config_id, reply.public_key) != (ours.config_id, ours.public_key):
            raise WrongCollectorKey(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the leader's task {self.task.id_text} seals aggregate shares to another"
                " collector key than this task file's: this file is not the collector's file of"
                " the deployment the leader runs (nothing was collected)",
            )

    def collect(
        self,
        start: int,
        duration: int,
        *,
        wait: float = 300.0,
        poll_interval: float = 0.05,
        confidence: float = 0.95,
        simultaneous: bool = False,
        collection_job_id: bytes | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> CollectionResult:
        """Collect the batch [start, start + duration) (seconds since the epoch).

        Both bounds must be multiples of the task's time_precision. Waits up to
        `wait` seconds for the aggregators. `simultaneous` asks for intervals that
        cover every coordinate at once (a whole question) at `confidence`. While
        it waits, `on_wait` is told what it waits for (the leader's reason when it
        retries, and when the next try is), at least every WAIT_REPORT seconds.
        Raises CollectionError.
        """
        if self.poplar1 is not None:
            raise UnusableTask(
                "a poplar1 task is collected level by level: use collect_prefixes with an"
                " aggregation parameter"
            )
        began = self.clock()
        job = self._run(
            start, duration, b"", wait, poll_interval, collection_job_id, on_wait, MAX_POLL
        )
        return self._finish(job, start, duration, confidence, simultaneous, self.clock() - began)

    def _run(
        self,
        start: int,
        duration: int,
        agg_param: bytes,
        wait: float,
        poll_interval: float,
        collection_job_id: bytes | None,
        on_wait: Callable[[str], None] | None,
        max_poll: float,
    ) -> Any:
        """Create the collection job (or resume it) and poll it until it
        finishes, the interval growing from `poll_interval` to `max_poll`:
        the finished CollectionJob; CollectionError otherwise."""
        began = self.clock()
        waiting = None if on_wait is None else _Waiting(on_wait, self.clock)
        deadline = began + wait
        job_id = collection_job_id or secrets.token_bytes(16)
        interval = messages_pb2.Interval(start=start, duration=duration)
        request = leader_pb2.CreateCollectionRequest(
            task_id=self.task.task_id,
            collection_job_id=job_id,
            batch_interval=interval,
            agg_param=agg_param,
        )
        # An unreachable leader fails fast here; later polls ride out restarts.
        job = self._call(
            self._leader.CreateCollection, request, min(deadline, began + 15.0), waiting
        )
        poll = leader_pb2.GetCollectionRequest(task_id=self.task.task_id, collection_job_id=job_id)
        while job.state == leader_pb2.CollectionJob.PENDING:
            if self.clock() > deadline:
                raise CollectionError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"collection job {job_id.hex()} still pending after {wait} s"
                    + (f" ({job.error_message})" if job.error_message else "")
                    + "; collect again with the same collection_job_id to resume",
                )
            # A retried job says why at once; a job that merely takes time
            # after WAIT_REPORT seconds (most finish before).
            if waiting is not None and (job.error_message or self.clock() - began >= WAIT_REPORT):
                waiting.say(
                    f"retrying: {_reason(job.error_message)}"
                    if job.error_message
                    else f"waiting for the aggregators to finish the job {job_id.hex()}",
                    poll_interval,
                )
            time.sleep(poll_interval)
            poll_interval = min(poll_interval * 1.5, max_poll)
            job = self._call(self._leader.GetCollection, poll, deadline, waiting)
        if job.state != leader_pb2.CollectionJob.FINISHED:
            raise CollectionJobFailed(_code(job.error_code), job.error_message)
        return job

    def collect_prefixes(
        self,
        start: int,
        duration: int,
        agg_param: Poplar1AggParam,
        *,
        wait: float = 600.0,
        poll_interval: float = 0.05,
        confidence: float = 0.95,
        collection_job_id: bytes | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> PrefixCounts:
        """Collect one level of a poplar1 task's batch [start, start + duration):
        the noisy count of reports under each prefix of `agg_param` (a level
        and its candidate prefixes; see `text_agg_param`), with intervals.

        Each level of a batch is collected once, levels increasing, each
        prefix extending one of the previous level's (both aggregators refuse
        otherwise), and each costs the task's per-level ε on both ledgers.
        Raises CollectionError; a collection interrupted while pending is
        resumed by calling again with the same `collection_job_id`.
        """
        if self.poplar1 is None or self.text_plan is None:
            raise UnusableTask(f"task {self.task.id_text} is not a poplar1 task: use collect")
        try:
            encoded = self.poplar1.encode_agg_param(agg_param)
        except AggParamError as e:
            raise ValueError(f"aggregation parameter: {e}") from None
        began = self.clock()
        job = self._run(
            start, duration, encoded, wait, poll_interval, collection_job_id, on_wait, PREFIX_POLL
        )
        count = job.report_count
        shares = [
            self._open(role, pb, start, duration, count, (agg_param, encoded))
            for role, pb in (
                (ROLE_LEADER, job.leader_encrypted_agg_share),
                (ROLE_HELPER, job.helper_encrypted_agg_share),
            )
        ]
        p = self.poplar1.idpf.current_field(agg_param.level).MODULUS
        noisy = decode(list(self.poplar1.merge(agg_param, shares)), p)
        est = count_estimates(noisy, self.text_plan, 1 - confidence)
        return PrefixCounts(
            start=start,
            duration=duration,
            level=agg_param.level,
            prefixes=tuple(agg_param.prefixes),
            noisy_counts=noisy,
            estimates=est,
            confidence=confidence,
            report_count=count,
            spent=self.text_plan.level_charge or Fraction(0),
            unit=self.task.dp.unit,
            seconds=self.clock() - began,
        )

    def _open(
        self,
        role: int,
        pb: Any,
        start: int,
        duration: int,
        count: int,
        prefixes: tuple[Poplar1AggParam, bytes] | None = None,
    ) -> list[int]:
        """One aggregator's share, opened and decoded: Prio3's, or with
        ``prefixes`` (the parameter and its encoding) Poplar1's prefix counts."""
        info = agg_share_info(
            role,
            self.task.task_id,
            start,
            duration,
            count,
            dp_params=self.task.dp.binding(self.task.vdaf),
            agg_param=b"" if prefixes is None else prefixes[1],
        )
        try:
            ct = ciphertext_from_pb(pb, "aggregate share")
            plaintext = open_(self.task.collector_hpke_keypair, ct, info)
            if prefixes is None:
                return list(self.vdaf.decode_agg_share(None, plaintext))
            assert self.poplar1 is not None
            return list(self.poplar1.decode_agg_share(prefixes[0], plaintext))
        except (HpkeError, ValueError) as e:
            if prefixes is not None:
                why = (
                    "it must be sealed for this task's DP parameters and this very"
                    " aggregation parameter"
                )
                what = "an aggregate share of prefix counts"
            else:
                why = (
                    "a share sealed under other DP parameters than this task file's does not"
                    " open: check that the leader, the helper and the collector hold the same"
                    " [dp] table"
                )
                what = "an aggregate share"
            raise CollectionError(
                grpc.StatusCode.DATA_LOSS, f"cannot open {what}: {e} ({why})"
            ) from None

    def _finish(
        self,
        job: Any,
        start: int,
        duration: int,
        confidence: float,
        simultaneous: bool,
        seconds: float,
    ) -> CollectionResult:
        count = job.report_count
        leader = self._open(ROLE_LEADER, job.leader_encrypted_agg_share, start, duration, count)
        helper = self._open(ROLE_HELPER, job.helper_encrypted_agg_share, start, duration, count)
        return batch_result(
            self.task, self.vdaf, self.bounds, [leader, helper], count,
            (start, duration), confidence, simultaneous, seconds,
        )  # fmt: skip


def batch_result(
    task: CollectorTask,
    vdaf: Prio3[Any, Any],
    bounds: AggregateBounds,
    shares: list[list[int]],
    count: int,
    batch: tuple[int, int],
    confidence: float,
    simultaneous: bool,
    seconds: float,
) -> CollectionResult:
    """The result of a batch from both aggregators' opened shares (the
    leader's first), whichever protocol carried them: merged, decoded to
    signed integers, and estimated with the task's public noise."""
    start, duration = batch
    p = vdaf.field.MODULUS
    noisy = decode(vdaf.merge(None, shares), p)
    est, spent = estimates(task, noisy, confidence, count, simultaneous=simultaneous)
    odd = tuple(bounds.out_of_range(noisy, count))
    if odd:
        low, high = bounds.plausible(count)
        log.warning(
            "collected batch [%d, +%d): coordinates %s decode outside [%d, %d], where"
            " %d reports plus noise lie: a sum wrapped around the field, or an"
            " aggregator misbehaved",
            start,
            duration,
            list(odd),
            low,
            high,
            count,
        )
    scalar = not task.vdaf.kind.vector

    def pick(values: list[Fraction]) -> Any:
        return values[0] if scalar else values

    return CollectionResult(
        start=start,
        duration=duration,
        report_count=count,
        estimate=pick([e.value for e in est]),
        lower=pick([e.low for e in est]),
        upper=pick([e.high for e in est]),
        confidence=confidence,
        intervals=interval_kind(task, len(noisy), simultaneous),
        spent=spent,
        unit=task.dp.unit,
        against_collector=collection_guarantee(task),
        mechanism=task.dp.mechanism,
        noisy_aggregate=noisy,
        seconds=seconds,
        out_of_range=odd,
        noise_added_by=task.noise_added_by if task.dp.has_noise else (),
    )
