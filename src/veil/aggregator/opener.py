"""A job's HPKE opens spread over threads, so that one aggregator process
uses more than one core (issue 28).

An open is the largest cost of a report at either aggregator, and about
70 % of it is X25519, which `veil.hpke.decapsulate` runs in libsodium with
the GIL released: several threads can be inside it at once.
`KeyRing.open_shares` (veil.aggregator.keys) runs that step of a job's opens through
`OpenPool.map`, and the rest of each open (under the GIL) in the calling
thread. `map` cuts the items into as many contiguous chunks as there are
threads; the calling thread runs the first chunk itself and the pool's
threads the others, so a job costs one hand-over per extra thread, not one
per report. With one thread (or a job too small to be worth cutting) the
calling thread runs everything, as before there was a pool.

The pool belongs to the process (one per aggregator object) and is shared
by the jobs that run at once (the helper's concurrent calls): their chunks
queue for its threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# `open_threads = 0` in a server's configuration: one thread per core this
# process may run on, at most AUTO_OPEN_THREADS (beyond four the opens are no
# longer most of a job's time, and the rest of the job holds the GIL).
AUTO_OPEN_THREADS = 4
MAX_OPEN_THREADS = 64
# A chunk shorter than this is not handed to another thread: the hand-over
# (tens of µs) would cost more than the opens it moves.
MIN_CHUNK = 16


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity where the system
    tells it, else the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def threads_for(setting: int) -> int:
    """The threads a process opens with for its `open_threads` setting (0:
    one per available core, at most AUTO_OPEN_THREADS)."""
    if not 0 <= setting <= MAX_OPEN_THREADS:
        raise ValueError(f"open_threads must be between 0 and {MAX_OPEN_THREADS}, not {setting}")
    if setting == 0:
        return min(cores_available(), AUTO_OPEN_THREADS)
    return setting


class OpenPool:
    """Runs a function over a job's items in `threads` chunks at once."""

    def __init__(self, threads: int) -> None:
        if not 1 <= threads <= MAX_OPEN_THREADS:
            raise ValueError(f"an open pool has 1 to {MAX_OPEN_THREADS} threads, not {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        # Started at the first job that is cut: a process that never opens
        # (an upload front end) starts no threads.
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="veil-open")
            return self._pool

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """`[fn(x) for x in items]`, in order, the items cut into up to
        `threads` contiguous chunks run at once. `fn` must be safe to run
        on several threads; an exception it raises reaches the caller once
        every chunk has ended."""
        chunks = min(self.threads, len(items) // MIN_CHUNK)
        if chunks <= 1:
            return [fn(x) for x in items]
        size = -(-len(items) // chunks)
        pool = self._executor()
        others: list[Future[list[R]]] = [
            pool.submit(_run_chunk, fn, items[start : start + size])
            for start in range(size, len(items), size)
        ]
        try:
            out = [fn(x) for x in items[:size]]
        finally:
            # No chunk outlives the call, even when this thread's failed.
            wait(others)
        for future in others:
            out.extend(future.result())
        return out

    def close(self) -> None:
        """Stop the pool's threads (a pool is usable again after: it starts
        new ones)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _run_chunk(fn: Callable[[T], R], chunk: Sequence[T]) -> list[R]:
    return [fn(x) for x in chunk]
