"""veil.collector."""
