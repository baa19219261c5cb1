"""A leader in this process, for the benchmarks of its upload path
(scripts/bench_upload.py): the leader logic on a fresh SQLite store, as
`veil serve` runs it on its default storage, its clock fixed at NOW, with no
gRPC and no helper. Uploads never call the helper; a job would fail."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from veil.aggregator.core import AggregationAnswer, VerifyInitItem
from veil.aggregator.leader import Leader
from veil.aggregator.leader.settings import LeaderParts
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.hpke import Ciphertext, HpkeConfig, generate_keypair
from veil.task import LeaderTask, TaskFiles

NOW = 1_800_000_000
TP = 3600


class _NoHelper:
    """The helper of a leader that only takes uploads."""

    def aggregate(
        self,
        task: LeaderTask,
        job_id: bytes,
        items: Sequence[VerifyInitItem],
        prefix_round: tuple[bytes, int, int, int] | None = None,
        batch_id: bytes | None = None,
    ) -> AggregationAnswer:
        raise RuntimeError("this leader takes uploads only")

    def aggregate_share(
        self,
        task: LeaderTask,
        collection_id: bytes,
        start: int,
        duration: int,
        report_count: int,
        checksum: bytes,
        agg_param: bytes = b"",
        batch_id: bytes | None = None,
    ) -> Ciphertext:
        raise RuntimeError("this leader takes uploads only")


@contextmanager
def upload_leader(files: TaskFiles, directory: Path) -> Iterator[tuple[Leader, HpkeConfig]]:
    """The leader of `files`' task on a store in `directory`, and an HPKE
    config for the helper's shares (which the leader stores unopened)."""
    store = SqliteDatastore(directory / "leader.db")
    try:
        privacy = PrivacyEngine(
            str(directory / "leader.db"), [files.leader], allow_exact_release=True
        )
        # The noise is drawn ahead in a thread: done before anything is timed.
        assert privacy.pool.wait_ready(60)
        parts = LeaderParts(store, _NoHelper(), privacy, clock=lambda: NOW)
        yield Leader({files.leader.task_id: files.leader}, parts), generate_keypair(1).config
    finally:
        store.close()
