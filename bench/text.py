"""Text answers end to end: respondents' answers sharded and uploaded to a local
leader and helper (separate processes, loopback, SQLite), then the top answers
recovered level by level as `veil survey collect` finds them (issue 27's benchmark).

The answers are the issue's case (`bench.heavy_hitters.zipf_counts`): a Zipf(1)
distribution over 50 answers plus 500 answers given once. The descent is the
collector's (`veil.collector.text.descend`): each level queries the survivors of
the last one extended by the bytes an answer may hold next, and keeps the noisy
counts at or above the question's threshold
(`veil.dp.heavy_hitters.release_threshold`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from bench.heavy_hitters import zipf_counts
from bench.profiling import Profiler
from veil.client import Client
from veil.collector import Collector
from veil.collector.survey import level_query
from veil.collector.text import TextProgress, descend
from veil.dp.heavy_hitters import release_threshold
from veil.local.launcher import LocalDeployment
from veil.survey.text import MAX_PREFIXES
from veil.task import DpSpec, VdafSpec

UPLOAD_BATCH = 1000


@dataclass(frozen=True)
class Level:
    level: int
    candidates: int
    survivors: int
    seconds: float


@dataclass
class TextRun:
    respondents: int
    max_bytes: int
    epsilon: str
    threshold: int
    shard_seconds: float
    upload_seconds: float
    levels: list[Level] = field(default_factory=list)
    # CPU seconds each server process used (user + system), from start to
    # the last level: what the wall times above cost on an idle machine.
    leader_cpu: float = 0.0
    helper_cpu: float = 0.0
    recovered: dict[bytes, int] = field(default_factory=dict)
    truth: dict[bytes, int] = field(default_factory=dict)

    @property
    def collect_seconds(self) -> float:
        return sum(level.seconds for level in self.levels)

    @property
    def total_seconds(self) -> float:
        """Sharding included: all respondents' shards made here, one after another."""
        return self.shard_seconds + self.upload_seconds + self.collect_seconds

    @property
    def served_seconds(self) -> float:
        """Upload and collection: respondents shard on their own devices, at once."""
        return self.upload_seconds + self.collect_seconds


def answers(respondents: int, max_bytes: int) -> list[bytes]:
    """The issue's case, as padded byte strings of max_bytes."""
    once = min(500, respondents // 20)
    out: list[bytes] = []
    for k, count in enumerate(zipf_counts(respondents, 50, once)):
        out += [f"answer {k:02d}".encode().ljust(max_bytes, b"\0")[:max_bytes]] * count
    out += [f"once {i:05d}".encode().ljust(max_bytes, b"\0")[:max_bytes] for i in range(once)]
    return out[:respondents]


def run_once(
    respondents: int, max_bytes: int = 16, epsilon: str = "2", profile: Path | None = None
) -> TextRun:
    """One run; with `profile`, py-spy samples both servers during the collection."""
    values = answers(respondents, max_bytes)
    spec = VdafSpec("poplar1", bits=8 * max_bytes)
    dp = DpSpec("geometric", epsilon=epsilon)
    threshold = release_threshold(dp.text_plan(spec)).value
    now = int(time.time())
    t = now - now % 3600 - 3600
    with tempfile.TemporaryDirectory(prefix="veil-bench-text-") as tmp:
        dep = LocalDeployment.start(
            Path(tmp),
            {"text": (spec, dp, {"min_batch_size": 100})},
        )
        try:
            files = dep.tasks["text"]
            with Client(files.client) as client:
                began = time.perf_counter()
                prepared = []
                for i in range(0, len(values), UPLOAD_BATCH):
                    prepared += client.build_reports(values[i : i + UPLOAD_BATCH], t)
                shard = time.perf_counter() - began
                began = time.perf_counter()
                for i in range(0, len(prepared), UPLOAD_BATCH):
                    client.upload_reports(prepared[i : i + UPLOAD_BATCH])
                upload = time.perf_counter() - began
            run = TextRun(respondents, max_bytes, epsilon, threshold, shard, upload)
            assert dep.leader.proc is not None and dep.helper.proc is not None
            profiler = Profiler(
                profile,
                f"text-{respondents}-{max_bytes}",
                {"leader": dep.leader.proc.pid, "helper": dep.helper.proc.pid},
            )
            with Collector(files.collector) as collector:
                query = level_query(collector, t, 3600, lambda _: None, wait=3600)

                def timed(level: int, names: Sequence[bytes], job: bytes) -> Sequence[int]:
                    began = time.perf_counter()
                    counts = query(level, names, job)
                    seconds = time.perf_counter() - began
                    kept = sum(1 for n in counts if n >= threshold)
                    run.levels.append(Level(8 * level + 7, len(names), kept, seconds))
                    return counts

                # The answers are lower case, as a question that is not
                # case-sensitive counts them.
                done = descend(
                    TextProgress(max_bytes),
                    threshold,
                    MAX_PREFIXES,
                    timed,
                    save=lambda _: None,
                    lower_case=True,
                )
                run.recovered = dict(done.survivors)
            profiler.stop()
            run.leader_cpu = _cpu_seconds(dep.leader.proc.pid)
            run.helper_cpu = _cpu_seconds(dep.helper.proc.pid)
        finally:
            dep.stop()
    for v in values:
        run.truth[v] = run.truth.get(v, 0) + 1
    return run


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def share_floor_found(run: TextRun, share: Fraction = Fraction(2, 100)) -> tuple[int, int]:
    """(answers held by at least `share` of respondents, how many were recovered)."""
    big = [a for a, n in run.truth.items() if n >= share * run.respondents]
    return len(big), sum(1 for a in big if a in run.recovered)
