"""One aggregation job at the leader, for every kind of task: its reports'
shares opened, the leader's first verification step, the rounds with the
helper through the task's engine (veil.vdaf.engine.leader_steps), each
report's outcome and what the reports both aggregators accepted add.

The job driver (`jobs.py`) runs such jobs over a task's stored uploads,
leased from the store; a collection's query of one level
(`prefixes.py`) runs them over the batch's reports. What differs with where
a job's reports come from is a `JobSource`: how a wrong answer from the
helper is taken, whether a report the helper finds too early waits for a
later job, and which sum an accepted report adds to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from veil.aggregator.context import TaskContext
from veil.aggregator.core import (
    REPORT_DROPPED,
    AggregationAnswer,
    VerifyInitItem,
    VerifyResult,
    job_deltas,
    rejection_reason,
    task_vdaf_ctx,
)
from veil.aggregator.errors import ReportRejection
from veil.aggregator.store.records import BatchAggregate
from veil.hpke import Ciphertext
from veil.task import LeaderTask
from veil.vdaf import VerifyError
from veil.vdaf.engine import Round, leader_steps


class AnyReport(Protocol):
    """What a job reads of each of its reports (a stored upload's row, or a
    report of a queried batch)."""

    @property
    def report_id(self) -> bytes: ...

    @property
    def time(self) -> int: ...

    @property
    def public_share(self) -> bytes: ...

    @property
    def helper_ct(self) -> Ciphertext: ...

    @property
    def token(self) -> bytes: ...

    @property
    def leader_share_digest(self) -> bytes: ...


class JobSource(Protocol):
    """Where a job's reports come from, and what differs with it."""

    def check_answer(self, answer: AggregationAnswer, items: Sequence[VerifyInitItem]) -> None:
        """Raise if the helper did not answer for the reports it was sent."""
        ...

    def deferral(self, task: LeaderTask, result: VerifyResult, report: AnyReport) -> float | None:
        """Seconds after which a report the helper refused is sent again
        (None: its refusal is its outcome)."""
        ...

    def bucket(self, task: LeaderTask, report: AnyReport) -> int:
        """The sum an accepted report adds to."""
        ...


@dataclass(frozen=True)
class PreparedJob:
    """An aggregation job whose leader shares are opened and verified: what
    goes to the helper, and what finishing the job with its answer needs."""

    task: LeaderTask
    job_id: bytes
    began: float
    report_count: int
    agg_param: Any
    opened: list[Any]  # the JobReports whose leader share opened
    init: Round | None  # None: no report opened
    items: list[VerifyInitItem]
    row_of: dict[bytes, int]  # report id -> row of `opened` (and of `init`)
    outcomes: dict[bytes, ReportRejection | None]  # reports the leader already rejected
    # The leader-selected batch the job's reports join (None: their time buckets).
    batch_id: bytes | None = None


@dataclass(frozen=True)
class FinishedJob:
    """Each report's outcome (None: aggregated by both), the reports the
    helper found too early (seconds to wait before sending each again),
    what the accepted reports add, and how many reports the helper verified
    to the end (the floor of a level counts them)."""

    outcomes: dict[bytes, ReportRejection | None]
    deferred: dict[bytes, float]
    deltas: list[BatchAggregate]
    accepted: int
    verified: int


def verify_init_item(r: AnyReport, verifier_share: bytes, share_2: bytes = b"") -> VerifyInitItem:
    """What the helper gets of report `r` with the leader's verifier share(s):
    for a task with invitations, the report's token and the digest of the
    leader's sealed share, the one part of the token's challenge the helper
    cannot compute itself."""
    token = r.token
    return VerifyInitItem(
        r.report_id,
        r.time,
        r.public_share,
        r.helper_ct,
        verifier_share,
        share_2,
        token,
        r.leader_share_digest if token else b"",
    )


def prepare_job(
    ctx: TaskContext[LeaderTask],
    job_id: bytes,
    agg_param: Any,
    reports: Sequence[AnyReport],
    shares: Sequence[ReportRejection | bytes],
    init: Callable[[list[bytes], list[bytes], list[bytes]], Round],
    began: float | None = None,
) -> PreparedJob:
    """The leader's first step of a job: its reports' opened shares (or why
    each did not open) verified together on the batched path (`init` with
    the opened reports' ids, public shares and input shares); one bad
    report is rejected alone and never spoils the others."""
    outcomes: dict[bytes, ReportRejection | None] = {}
    opened: list[AnyReport] = []
    plaintexts: list[bytes] = []
    for r, share in zip(reports, shares, strict=True):
        # A share the leader cannot open is dropped here: the helper never sees it.
        if isinstance(share, ReportRejection):
            outcomes[r.report_id] = share
        else:
            opened.append(r)
            plaintexts.append(share)
    first: Round | None = None
    items: list[VerifyInitItem] = []
    row_of: dict[bytes, int] = {}
    if opened:
        first = init([r.report_id for r in opened], [r.public_share for r in opened], plaintexts)
        for i, (r, error, verifier_share) in enumerate(
            zip(opened, first.errors, first.verifier_shares, strict=True)
        ):
            # Reports whose shares do not decode or verify are not sent.
            if error is not None or verifier_share is None:
                outcomes[r.report_id] = rejection_reason(error or VerifyError("rejected"))
                continue
            row_of[r.report_id] = i
            items.append(verify_init_item(r, verifier_share))
    return PreparedJob(
        ctx.task,
        job_id,
        time.monotonic() if began is None else began,
        len(reports),
        agg_param,
        opened,
        first,
        items,
        row_of,
        outcomes,
    )


def finish_job(
    ctx: TaskContext[LeaderTask],
    source: JobSource,
    job: PreparedJob,
    answer: AggregationAnswer,
    ask_next: Callable[[list[VerifyInitItem]], AggregationAnswer] | None = None,
) -> FinishedJob:
    """The leader's steps from the helper's answer to the job's first round:
    its own next steps through the engine and, for a VDAF of two rounds, the
    helper's second round (`ask_next`, given the reports it answered with
    the leader's second shares); each report counted only where both
    aggregators accepted it."""
    task, engine = ctx.task, ctx.engine
    outcomes = dict(job.outcomes)
    deferred: dict[bytes, float] = {}
    if not job.items:
        return FinishedJob(outcomes, deferred, [], 0, 0)
    assert job.init is not None
    source.check_answer(answer, job.items)
    rows = len(job.opened)
    messages: list[bytes | None] = [None] * rows
    helper_next: list[bytes | None] = [None] * rows
    refused: dict[int, ReportRejection] = {}
    for res in answer.results:
        i = job.row_of[res.report_id]
        if res.verifier_message is None:
            wait = source.deferral(task, res, job.opened[i])
            if wait is not None:
                deferred[res.report_id] = wait
            else:
                refused[i] = res.reject or REPORT_DROPPED
        else:
            messages[i] = res.verifier_message
            helper_next[i] = res.helper_verifier_share
    out, later = leader_steps(
        engine,
        task_vdaf_ctx(task),
        job.agg_param,
        job.init,
        messages,
        helper_next if engine.ROUNDS > 1 else None,
    )
    answered = [
        i for i in (job.row_of[it.report_id] for it in job.items) if messages[i] is not None
    ]
    verified = len(answered)
    if later:
        # The next round carries every report the helper answered, with the
        # leader's first and second verifier shares.
        items = [
            verify_init_item(job.opened[i], job.init.verifier_shares[i] or b"", later[0][i] or b"")
            for i in answered
        ]
        answered = []
        if items and ask_next is not None:
            last = ask_next(items)
            source.check_answer(last, items)
            for res in last.results:
                i = job.row_of[res.report_id]
                if res.verifier_message is None:
                    refused[i] = res.reject or REPORT_DROPPED
                else:
                    answered.append(i)
        verified = len(items)
    both = set(answered)
    accepted: list[tuple[int, bytes, int]] = []  # bucket, report id, row of `out`
    for it in job.items:
        i = job.row_of[it.report_id]
        if it.report_id in deferred:
            continue
        reason = refused.get(i)
        error = out.errors[i]
        if reason is not None:
            outcomes[it.report_id] = reason
        elif error is not None or i not in both:
            outcomes[it.report_id] = rejection_reason(
                error or VerifyError("rejected by the helper")
            )
        else:
            outcomes[it.report_id] = None
            accepted.append((source.bucket(task, job.opened[i]), it.report_id, i))
    # What this job adds, per sum; the store adds it under its lock, since
    # other jobs may be finishing over the same sums.
    deltas = job_deltas(engine, out, accepted, job.agg_param)
    return FinishedJob(outcomes, deferred, deltas, len(accepted), verified)
