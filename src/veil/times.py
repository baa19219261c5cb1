"""Times as people write them (RFC 3339) and as the protocol carries them
(whole seconds since the epoch, DAP section 4.1)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


class TimeFormatError(ValueError):
    """Not an RFC 3339 date-time with an offset (or whole epoch seconds, where allowed)."""


def parse_time(value: Any, *, epoch_seconds: bool = False) -> int:
    """Seconds since the epoch of an RFC 3339 date-time with an offset
    ("2026-05-01T09:00:00Z", "2026-05-01T11:00:00+02:00") or a TOML date-time
    carrying one. With `epoch_seconds`, a decimal integer is also accepted.

    A time without an offset is refused: read on another machine it would
    name another instant."""
    if isinstance(value, str) and epoch_seconds and value.strip().isdigit():
        return int(value.strip())
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise TimeFormatError(
                f"{value!r} is not an RFC 3339 date-time such as 2026-05-01T09:00:00Z"
                + (" (or epoch seconds)" if epoch_seconds else "")
            ) from None
    if not isinstance(value, datetime):
        raise TimeFormatError(f"{value!r} is not a date-time such as 2026-05-01T09:00:00Z")
    if value.tzinfo is None or value.utcoffset() is None:
        raise TimeFormatError(
            f"{value.isoformat()} has no UTC offset: write it as {value.isoformat()}Z (UTC)"
            " or with +HH:MM"
        )
    if value.microsecond:
        raise TimeFormatError(f"{value.isoformat()}: give whole seconds")
    return int(value.timestamp())


def format_time(seconds: int) -> str:
    """RFC 3339 in UTC, e.g. 2026-05-01T09:00:00Z."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_duration(seconds: float) -> str:
    """A duration for people: "2 h 5 min", "40 s", "3 d 4 h"."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (s, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"
