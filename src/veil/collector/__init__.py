"""veil.collector: request a batch, open both aggregate shares, estimate."""

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

__all__ = [
    "CollectionError",
    "CollectionJobFailed",
    "CollectionResult",
    "Collector",
    "PrefixCounts",
    "UnusableTask",
    "WrongCollectorKey",
    "prefix_to_bytes",
    "text_agg_param",
]
