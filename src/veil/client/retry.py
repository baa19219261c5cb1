"""What `Client` and `AsyncClient` do when a call fails: one policy for both.

A call that failed on the way (the leader unreachable, restarting or slow),
or that the leader refused saying a retry may succeed (veil.grpc_util.
is_retryable), is sent again, unchanged, after an exponentially growing, jittered delay: an
upload keeps its report ids, and the leader acknowledges a report id it
already holds without storing it twice, so a retry never counts twice
(draft-ietf-ppm-dap section 4.4.2: report ids make uploads idempotent). Any
other failure is raised at once as `UploadError`.

A leader whose backlog is full refuses an upload with advice on when to
send it again (`retry_after`, veil.grpc_util.RETRY_AFTER_KEY): the client
waits at least that long, and up to half as long again at random so that
the clients refused together do not all come back together. Advice longer
than `max_delay` ends the retries: the error, still retryable, carries the
advice to the caller (an outbox keeps the reports for a later flush).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from veil.grpc_util import RpcRefused


class UploadError(RpcRefused):
    """The leader refused an upload (or stayed unreachable); `code` is the gRPC
    status, `message` the server's explanation, `kind` the server's error
    kind (veil.aggregator.errors) when it said.

    `retryable` says whether the same request may succeed later (the leader
    unreachable, or saying so): the client retries those, and with an
    outbox such reports stay pending for the next `flush()`.
    """


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a failed call.

    `retries` more attempts after the first, waiting `backoff` seconds before
    the first retry and twice as long before each next one (at most
    `max_delay`), each wait drawn uniformly from [delay/2, delay) so that
    clients cut off together do not come back together; when the server
    advised a wait, at least that wait (drawn from [advice, 1.5 advice)).

    >>> import grpc
    >>> down = UploadError(grpc.StatusCode.UNAVAILABLE, "down", retryable=True)
    >>> RetryPolicy(retries=3, backoff=0.5).should_retry(down, attempt=0)
    True
    """

    retries: int = 5
    backoff: float = 0.5
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff < 0 or self.max_delay < 0:
            raise ValueError("retries, backoff and max_delay must not be negative")

    def should_retry(self, error: UploadError, attempt: int) -> bool:
        """Whether to send again after attempt number `attempt` (0 = the first) failed."""
        advised = error.retry_after
        return (
            error.retryable
            and attempt < self.retries
            and (advised is None or advised <= self.max_delay)
        )

    def delay(self, attempt: int, advised: float | None = None) -> float:
        """Seconds to wait before retry number `attempt` + 1; at least
        `advised`, the server's advice, when it gave one."""
        full = min(self.backoff * 2.0**attempt, self.max_delay)
        wait = full * (0.5 + _uniform() / 2)
        if advised is not None:
            wait = max(wait, advised * (1 + _uniform() / 2))
        return wait


def _uniform() -> float:
    """A number drawn uniformly from [0, 1) (jitter needs no more than 16 bits)."""
    return secrets.randbelow(1 << 16) / (1 << 16)
