"""veil.dp."""
