"""Text answers end to end: respondents' answers sharded and uploaded to a local
leader and helper (separate processes, loopback, SQLite), then the top answers
recovered level by level through the collector library (issue 27's benchmark).

The answers are the issue's case (`bench.heavy_hitters.zipf_counts`): a Zipf(1)
distribution over 50 answers plus 500 answers given once. Each level queries the
survivors of the last one extended by every byte (a survivor that already ends in
padding only by padding), and keeps the noisy counts at or above the question's
threshold (`veil.dp.heavy_hitters.release_threshold`).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from bench.heavy_hitters import zipf_counts
from veil.client import Client
from veil.collector import Collector, text_agg_param
from veil.dp.heavy_hitters import release_threshold
from veil.local.launcher import LocalDeployment
from veil.task import MAX_QUERY_PREFIXES, DpSpec, VdafSpec

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
        return self.shard_seconds + self.upload_seconds + self.collect_seconds


def answers(respondents: int, max_bytes: int) -> list[bytes]:
    """The issue's case, as padded byte strings of max_bytes."""
    once = min(500, respondents // 20)
    out: list[bytes] = []
    for k, count in enumerate(zipf_counts(respondents, 50, once)):
        out += [f"answer {k:02d}".encode().ljust(max_bytes, b"\0")[:max_bytes]] * count
    out += [f"once {i:05d}".encode().ljust(max_bytes, b"\0")[:max_bytes] for i in range(once)]
    return out[:respondents]


def run_once(respondents: int, max_bytes: int = 16, epsilon: str = "2") -> TextRun:
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
            with Collector(files.collector) as collector:
                survivors = [b""]
                for _ in range(max_bytes):
                    candidates = sorted(
                        {
                            s + bytes([c])
                            for s in survivors
                            for c in ((0,) if s.endswith(b"\0") else range(256))
                        }
                    )[:MAX_QUERY_PREFIXES]
                    began = time.perf_counter()
                    result = collector.collect_prefixes(
                        t, 3600, text_agg_param(candidates), wait=3600, poll_interval=0.05
                    )
                    seconds = time.perf_counter() - began
                    kept = {
                        p: n
                        for p, n in zip(result.prefix_bytes(), result.noisy_counts, strict=True)
                        if n >= threshold
                    }
                    run.levels.append(Level(result.level, len(candidates), len(kept), seconds))
                    survivors = sorted(kept)
                    run.recovered = kept
                    if not survivors:
                        break
            assert dep.leader.proc is not None and dep.helper.proc is not None
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
