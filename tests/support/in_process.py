"""The leader and helper logic in one process, without gRPC: a task's two
aggregators on one storage backend, the helper reached by direct calls, the
clock fixed at NOW. The aggregator tests build on it to check each rule."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from tests.support.backends import Backend
from tests.support.helper_rpc import honest_items
from veil.aggregator.core import AggregationAnswer, VerifyInitItem
from veil.aggregator.helper import Helper
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts, LeaderSettings
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.records import CollectionRecord
from veil.client import prepare_report
from veil.hpke import Ciphertext
from veil.messages import Report
from veil.task import Task, TaskFiles

NOW = 1_800_000_000
TP = 3600
T = NOW - NOW % TP - TP


class InProcessHelper:
    """HelperApi calling the helper logic directly, with the leader's token."""

    def __init__(self, helper: Helper) -> None:
        self.helper = helper
        self.calls = 0

    def aggregate(
        self,
        task: Task,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
    ) -> AggregationAnswer:
        self.calls += 1
        token = task.aggregator_token
        if prefix_round is not None:
            agg_param, start, duration, round_ = prefix_round
            results = self.helper.aggregate(
                task.task_id, token, job_id, items, agg_param, start, duration, round_
            )
        else:
            results = self.helper.aggregate(task.task_id, token, job_id, items)
        return AggregationAnswer(results, self.helper.clock())

    def aggregate_share(
        self,
        task: Task,
        collection_id: bytes,
        start: int,
        duration: int,
        count: int,
        checksum: bytes,
        agg_param: bytes = b"",
    ) -> Ciphertext:
        return self.helper.aggregate_share(
            task.task_id,
            task.aggregator_token,
            collection_id,
            start,
            duration,
            count,
            checksum,
            agg_param,
        )


class World:
    def __init__(
        self, backend: Backend, files: TaskFiles, clock: Callable[[], float] = lambda: NOW
    ) -> None:
        self.files = files
        self.helper_store = backend.store("helper")
        self.leader_store = backend.store("leader")
        self.helper = Helper(
            {files.helper.task_id: files.helper},
            self.helper_store,
            PrivacyEngine(backend.ledger("helper"), [files.helper], allow_exact_release=True),
            clock=clock,
        )
        self.link = InProcessHelper(self.helper)
        self.leader = Leader(
            {files.leader.task_id: files.leader},
            LeaderParts(
                self.leader_store,
                self.link,
                PrivacyEngine(backend.ledger("leader"), [files.leader], allow_exact_release=True),
                clock=clock,
            ),
            LeaderSettings(job_size=4),
        )
        self.vdaf = files.client.vdaf.instantiate()
        # Collections are refused (retryable) until the noise is drawn ahead.
        for side in (self.helper, self.leader):
            assert side.privacy.pool.wait_ready(60)

    def report(self, value: int, t: int = T) -> Report:
        return prepare_report(
            self.files.client, value, self.leader.current_config, self.helper.current_config, t
        )

    def collect(self) -> CollectionRecord:
        """Ask for the batch [T, T + TP) and drive the leader until it is done."""
        task_id = self.files.client.task_id
        token = self.files.collector.collector_token
        job = secrets.token_bytes(16)
        self.leader.create_collection(task_id, token, job, T, TP)
        while self.leader.run_once():
            pass
        return self.leader.get_collection(task_id, token, job)


def verify_init_items(world: World, n: int) -> list[VerifyInitItem]:
    """Verify-init items of the values 0, 1, 0, ... at T as the leader would
    send them (tests.support.helper_rpc.honest_items)."""
    return honest_items(
        world.files.leader, [v % 2 for v in range(n)], world.helper.current_config, T
    )
