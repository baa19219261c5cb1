"""Report times for tests that upload into past buckets."""

from __future__ import annotations

import time

TP = 3600


def past_bucket(hours_ago: int, tp: int = TP, now: int | None = None) -> int:
    """The start of the bucket `hours_ago` buckets of `tp` seconds before the
    one holding `now` (the clock when not given)."""
    t = int(time.time()) if now is None else now
    return t - t % tp - hours_ago * tp
