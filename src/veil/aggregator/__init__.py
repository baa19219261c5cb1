"""veil.aggregator."""
