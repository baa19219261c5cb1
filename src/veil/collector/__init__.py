"""veil.collector: request a batch, open both aggregate shares, estimate.

`Collector` speaks veil's gRPC, `DapCollector` DAP's HTTP (a task with a
`[dap]` table), with the same `collect`; `collector_for` picks by task."""

from veil.collector.collector import (
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
    PrefixCounts,
    UnusableTask,
    WrongCollectorKey,
    prefix_to_bytes,
    text_agg_param,
)
from veil.collector.dap import DapCollector, collector_for

__all__ = [
    "CollectionError",
    "CollectionJobFailed",
    "CollectionResult",
    "Collector",
    "DapCollector",
    "PrefixCounts",
    "UnusableTask",
    "WrongCollectorKey",
    "collector_for",
    "prefix_to_bytes",
    "text_agg_param",
]
