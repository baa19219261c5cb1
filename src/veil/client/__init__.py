"""veil.client."""
