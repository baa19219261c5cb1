"""veil.collector: request a batch, open both aggregate shares, estimate."""

from veil.collector.collector import (
    CollectionError,
    CollectionJobFailed,
    CollectionResult,
    Collector,
    UnusableTask,
    WrongCollectorKey,
)

__all__ = [
    "CollectionError",
    "CollectionJobFailed",
    "CollectionResult",
    "Collector",
    "UnusableTask",
    "WrongCollectorKey",
]
