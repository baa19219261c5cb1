"""The driver's state between passes: whether to stop, whether the helper
was reached, and how long a failed job or collection waits before its next
attempt."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass


class DriverControl:
    """What a leader's driver and the loop that runs it tell each other.

    The loop (the server's driver thread, `veil worker`) stops the driver
    from another thread, typically a signal handler's; the driver says after
    each pass whether the helper could be reached, so that the loop backs
    off. Both are events, safe to set and read from any thread."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        # The server's own stop event may be given, so that one `set` stops
        # the server and its driver together.
        self._stop = stop if stop is not None else threading.Event()
        self._helper_unreachable = threading.Event()
        self._away_because = ""
        self._away_helper: str | None = None

    def stop(self) -> None:
        """Stop the driver between two steps (the current one finishes)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, less if stopped; True if stopped."""
        return self._stop.wait(seconds)

    def begin_pass(self) -> None:
        """A new pass: the helper is presumed reachable until a call says not."""
        self._helper_unreachable.clear()

    def helper_away(self, because: str = "", helper: str | None = None) -> None:
        """The helper could not be reached (`because`: the failed call's
        error; `helper`: which one, as peer.helper_of names it, where the
        pending collections of its tasks may say so): the pass ends, the
        loop backs off."""
        self._away_because = because
        self._away_helper = helper
        self._helper_unreachable.set()

    @property
    def away_because(self) -> str:
        """Why the last pass found the helper unreachable ("" if it did not,
        or did not say)."""
        return self._away_because if self._helper_unreachable.is_set() else ""

    @property
    def away_helper(self) -> str | None:
        """Which helper the last pass found unreachable (None if it did not,
        or did not say)."""
        return self._away_helper if self._helper_unreachable.is_set() else None

    @property
    def helper_unreachable(self) -> bool:
        """Whether the last pass found the helper unreachable."""
        return self._helper_unreachable.is_set()


@dataclass(frozen=True)
class Backoff:
    """Seconds before the next attempt after some failed ones: exponential
    from `first`, capped at `most`, jittered so that retries do not come in
    step."""

    first: float
    most: float

    def __call__(self, failures: int) -> float:
        delay = min(self.most, self.first * 2.0 ** min(failures - 1, 30))
        return delay * (0.5 + secrets.randbelow(1000) / 1000)
