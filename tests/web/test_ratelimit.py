"""The per-address token bucket of `veil survey serve` (veil.web.app.RateLimiter)."""

from __future__ import annotations

from veil.web.app import RateLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bursts_then_refills_per_address() -> None:
    clock = Clock()
    limiter = RateLimiter(3, 60.0, clock)
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")  # another address has its own bucket
    clock.now += 20.0  # one token back (3 per 60 s)
    assert limiter.allow("a") and not limiter.allow("a")
    clock.now += 600.0  # never more than the burst
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]


def test_memory_stays_bounded_under_many_addresses() -> None:
    clock = Clock()
    limiter = RateLimiter(2, 60.0, clock)
    limiter.MAX_TRACKED = 100
    for i in range(1000):
        clock.now += 60.0  # each earlier bucket is full again by now
        assert limiter.allow(f"10.0.{i // 256}.{i % 256}")
        assert limiter.tracked <= 100
    # A limited address is remembered, not pruned while it is limited.
    limiter.allow("x")
    limiter.allow("x")
    assert not limiter.allow("x")
    assert not limiter.allow("x")
