"""A helper's aggregation jobs without its leader: verify-init items built as
an honest leader builds them, for the benchmark of the helper's steps
(scripts/bench_helper_steps.py) and the tests that speak to a helper as its
leader (tests/support imports it from here: a benchmark imports nothing
from tests/). The request itself is the product's
(veil.aggregator.leader.helper_client.aggregation_job_request)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from veil.aggregator.core import VerifyInitItem
from veil.client import prepare_reports
from veil.hpke import ROLE_LEADER, HpkeConfig, generate_keypair, input_share_info, open_
from veil.messages import Report, vdaf_ctx
from veil.task import LeaderTask
from veil.vdaf.engine import engine_for


class CallContext:
    """What the helper's gRPC servicer reads of a call, run in this process
    without a server: the leader's token."""

    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> Any:
        return self.metadata

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def honest_items(
    leader: LeaderTask,
    measurements: Sequence[Any],
    helper_config: HpkeConfig,
    report_time: int,
    *,
    report_ids: Sequence[bytes] | None = None,
    tokens: Callable[[Report], bytes] | None = None,
) -> list[VerifyInitItem]:
    """One item per measurement of `leader`'s task (a Prio3 task: its one
    round takes no aggregation parameter), as the leader's job sends it.

    Each report is built as an honest client builds it
    (veil.client.prepare_reports: at `report_time` rounded down, with
    `report_ids` where given; for a task with invitations `tokens` gives
    each sealed report's token, sent with the digest of the leader's sealed
    share as the leader sends them), its helper share sealed to
    `helper_config`; the leader's shares are opened and verified together
    on the batched path with the task's verify key, as the leader's first
    step does (veil.aggregator.leader.job.prepare_job). The leader's shares
    are sealed to a keypair made for the call, since the helper never sees
    them. ValueError if a report fails the leader's own verification (an
    invalid measurement is refused by prepare_reports before)."""
    leader_keys = generate_keypair(1)
    reports = prepare_reports(
        leader,
        measurements,
        leader_keys.config,
        helper_config,
        report_time,
        report_ids=report_ids,
        invited=tokens is not None,
    )
    plaintexts = [
        open_(
            leader_keys,
            r.leader_ct,
            input_share_info(ROLE_LEADER, leader.task_id, r.report_id, r.time, r.public_share),
        )
        for r in reports
    ]
    first = engine_for(leader.vdaf.instantiate()).verify_init(
        leader.verify_key,
        vdaf_ctx(leader.task_id),
        0,
        None,
        [r.report_id for r in reports],
        [r.public_share for r in reports],
        plaintexts,
    )
    items = []
    for i, (r, error, share) in enumerate(
        zip(reports, first.errors, first.verifier_shares, strict=True)
    ):
        if error is not None or share is None:
            raise ValueError(f"report {i}: the leader's verification failed: {error}")
        token = tokens(r) if tokens is not None else b""
        digest = r.leader_share_digest if token else b""
        items.append(
            VerifyInitItem(
                r.report_id, r.time, r.public_share, r.helper_ct, share, b"", token, digest
            )
        )
    return items
