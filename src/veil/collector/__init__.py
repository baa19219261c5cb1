"""veil.collector: request a batch, open both aggregate shares, estimate."""

from veil.collector.collector import CollectionError, CollectionResult, Collector

__all__ = ["CollectionError", "CollectionResult", "Collector"]
