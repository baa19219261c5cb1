"""The leader's release of a collection (draft-ietf-ppm-dap section 4.6,
leader side), one step for every kind of task: a batch of a task's time
buckets, or one level of a batch's queries.

The leader has summed what it aggregated (and checked its floor and
ceiling) before it releases anything. It asks the helper for its noised
share first, with its count and checksum, which the helper checks against
its own; only once the helper's share exists does the leader charge its own
ledger, draw its noise in the field the engine names, seal its share and
commit the finished collection with both ciphertexts. So a refusal by the
helper leaves nothing charged or drawn at the leader, and every step is
safe to repeat after a crash: the helper serves its stored share again,
the leader's spend is keyed by the collection job id, and a share drawn but
not stored never left this process. `commit` is the one thing the kinds do
differently: a level's commit also keeps the leader's sum in its query.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from veil.aggregator.context import TaskContext
from veil.aggregator.core import seal_share
from veil.aggregator.errors import AggregatorError
from veil.aggregator.leader.dap import seal_leader_share
from veil.aggregator.leader.peer import HelperApi
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import CollectionRecord
from veil.hpke import ROLE_LEADER, Ciphertext
from veil.task import LeaderTask


class HelperRefused(Exception):
    """The helper did not give its share (`error`: its refusal or why it
    could not be reached); the leader charged and drew nothing."""

    def __init__(self, error: AggregatorError) -> None:
        super().__init__(str(error))
        self.error = error


def release(
    ctx: TaskContext[LeaderTask],
    privacy: PrivacyEngine,
    api: HelperApi,
    record: CollectionRecord,
    agg_param: Any,
    count: int,
    checksum: bytes,
    share: Sequence[int],
    commit: Callable[[CollectionRecord], None],
    drawn: Ciphertext | None = None,
    batch_id: bytes | None = None,
) -> CollectionRecord:
    """Release the collection `record` of `count` reports (XOR of their
    checksums `checksum`, the leader's aggregate share `share`): the
    helper's share, then the leader's (`drawn`: the one an earlier veil
    drew and stored first), committed as the finished record.
    HelperRefused for the helper's refusal; AggregatorError for the
    leader's own ledger or noise. `batch_id` names a leader-selected
    batch (DAP's), whose bucket is the record's [start, +1)."""
    task = ctx.task
    start, duration = record.start, record.duration
    args = (task, record.job_id, start, duration, count, checksum, record.agg_param)
    try:
        if batch_id is None:
            helper_ct = api.aggregate_share(*args)
        else:
            helper_ct = api.aggregate_share(*args, batch_id=batch_id)
    except AggregatorError as e:
        raise HelperRefused(e) from None
    leader_ct = drawn or leader_share(ctx, privacy, record, agg_param, count, share)
    finished = CollectionRecord(
        task.task_id,
        record.job_id,
        start,
        duration,
        "finished",
        count,
        checksum,
        leader_ct,
        helper_ct,
        agg_param=record.agg_param,
    )
    commit(finished)
    return finished


def leader_share(
    ctx: TaskContext[LeaderTask],
    privacy: PrivacyEngine,
    record: CollectionRecord,
    agg_param: Any,
    count: int,
    share: Sequence[int],
) -> Ciphertext:
    """The leader's own share of a collection: its ledger charged (keyed by
    the collection job), its noise added in the engine's field, sealed to
    the collector under the collection's context."""
    task, engine = ctx.task, ctx.engine
    noised, _ = privacy.release_in(
        task,
        engine.noise_modulus(agg_param),
        record.job_id,
        record.start,
        record.duration,
        list(share),
    )
    encoded = engine.encode_agg_share(agg_param, noised)
    if task.dap is not None:
        return seal_leader_share(task, record.start, record.duration, encoded)
    return seal_share(
        task, ROLE_LEADER, record.start, record.duration, count, encoded, record.agg_param
    )
