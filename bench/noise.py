"""Does the time of requests served after a release tell anything of the noise?

`scripts/bench_noise_timing.py` is the command line; the logic lives here.

The noise pool refills right after a release, drawing the vector the *next*
release will use, and the exact samplers take longer for larger noise. A
caller who times its own requests just after a release may then learn
something of that vector. This measures it as a caller would: the pool keeps
one vector ready per task; each trial takes it (a release), then times a burst
of requests served by this thread (a fixed pure-Python workload, as a gRPC
handler runs, each after a short wait for the network) while the pool draws
the replacement; the next trial's take returns that very replacement, whose
|noise| (sum of absolute values) is paired with the burst's time. Reported:
the Spearman rank correlation between burst time and |noise| (what a caller
sees), and between draw time and |noise| (what
the sampler does, measured directly), for the pool as it is (drawing in a
thread of the serving process) and for the alternative of drawing in a child
process (`NoiseProcess` below, started as `python -m bench.noise --child`),
which issue 25 considered; docs/OBSERVATIONS.md has the figures and the call.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from veil.aggregator.privacy import NoisePool
from veil.dp import DPConfig, NoisePlan, draw_noise

TASK = b"\x01" * 32


_LENGTH = struct.Struct(">I")


def _write(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _read(stream: IO[bytes]) -> Any:
    """The next frame's value; EOFError when the other side closed."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the other side closed the pipe")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other side closed the pipe")
    return pickle.loads(data)


_ROOT = Path(__file__).resolve().parent.parent


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child: draw what is asked until the parent closes the pipe."""
    while True:
        try:
            request = _read(requests)
        except EOFError:
            return
        if request is None:
            return
        plan, length = request
        try:
            reply: tuple[bool, Any] = (True, draw_noise(plan, length))
        except Exception as e:
            reply = (False, f"{type(e).__name__}: {e}")
        try:
            _write(replies, reply)
        except (BrokenPipeError, OSError):
            return


class NoiseProcess:
    """A child process that draws noise vectors on request."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.noise", "--child"],
            cwd=_ROOT,  # where `bench` is importable from
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def draw(self, plan: NoisePlan, length: int) -> list[int]:
        """`draw_noise(plan, length)`, drawn in the child. RuntimeError if the
        sampler raised; OSError or EOFError if the child is gone."""
        assert self._process.stdin is not None and self._process.stdout is not None
        with self._lock:
            _write(self._process.stdin, (plan, length))
            ok, value = _read(self._process.stdout)
        if not ok:
            raise RuntimeError(f"the child could not draw: {value}")
        noise: list[int] = value
        return noise

    def close(self) -> None:
        with self._lock:
            for stream in (self._process.stdin, self._process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


_child: NoiseProcess | None = None


def draw_in_child(plan: NoisePlan, length: int) -> list[int]:
    """draw_noise in this process's benchmark child (started on first use)."""
    global _child
    if _child is None:
        _child = NoiseProcess()
    return _child.draw(plan, length)


@dataclass(frozen=True)
class Timing:
    mode: str
    trials: int
    burst_ms: float  # median extra time of the burst after a release (draw: its time)
    spearman: float  # burst time vs |noise| of the vector drawn meanwhile
    p_value: float
    # burst time vs how long the draw made meanwhile took (how much of a
    # draw's duration shows through; None for the sampler itself)
    shows_draw: float | None = None


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman's rank correlation and its two-sided p-value (normal approximation,
    good for the thousands of trials used here). Ties get their mean rank."""

    def ranks(v: Sequence[float]) -> Any:
        a = np.asarray(v, dtype=float)
        order = a.argsort(kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for value in np.unique(a):  # mean rank over ties
            tied = a == value
            r[tied] = r[tied].mean()
        return r

    rho = float(np.corrcoef(ranks(x), ranks(y))[0, 1])
    p = math.erfc(abs(rho) * math.sqrt(len(x) - 1) / math.sqrt(2))
    return rho, p


def plan_for(epsilon: str = "1", length: int = 4) -> NoisePlan:
    return NoisePlan.for_task(DPConfig.geometric(epsilon), "Prio3Histogram", {"length": length})


def _request(work: int) -> None:
    """A fixed pure-Python workload, about as long as a small handler."""
    acc = 0
    for i in range(work):
        acc = (acc * 31 + i) % 1_000_003


def _burst(burst: int, work: int, gap: float) -> float:
    """The time `burst` requests take, each after a short wait for the network,
    during which any other thread of the process may take the interpreter (the
    sampler's reads of os.urandom give it back often, so a draw slows the
    requests around it by about its own length)."""
    started = time.perf_counter()
    for _ in range(burst):
        time.sleep(gap)
        _request(work)
    return time.perf_counter() - started


def caller_view(
    draw: Callable[[NoisePlan, int], list[int]],
    mode: str,
    plan: NoisePlan,
    length: int,
    trials: int,
    burst: int = 20,
    work: int = 100,
    gap: float = 0.00005,
) -> Timing:
    """How much longer a burst of requests takes right after each release than
    just before it, against |noise| of the vector drawn meanwhile (the next
    release's)."""
    durations: list[float] = []

    def timed(plan: NoisePlan, length: int) -> list[int]:
        started = time.perf_counter()
        noise = draw(plan, length)
        durations.append(time.perf_counter() - started)
        return noise

    pool = NoisePool(ready_per_task=1, draw=timed)
    pool.add(TASK, plan, length)
    times: list[float] = []
    magnitudes: list[int] = []
    drawn: list[float] = []
    pending: float | None = None
    for _ in range(trials + 1):
        if not pool.wait_ready(60):
            raise RuntimeError("the noise pool did not refill within 60 s")
        time.sleep(0.002)  # the refill is over: start each trial alike
        # The same burst just before the release is the caller's baseline: it
        # takes out how busy the machine is at the moment (other processes).
        baseline = _burst(burst, work, gap)
        noise = pool.take(TASK)
        after = _burst(burst, work, gap)
        if pending is not None:
            times.append(pending)
            magnitudes.append(sum(abs(z) for z in noise))
        pending = after - baseline
        if not pool.wait_ready(60):
            raise RuntimeError("the noise pool did not refill within 60 s")
        drawn.append(durations[-1])  # the draw that ran during this burst
    rho, p = spearman(times, magnitudes)
    shows, _ = spearman(times, drawn[: len(times)])
    return Timing(mode, trials, statistics.median(times) * 1e3, rho, p, shows)


def sampler_view(plan: NoisePlan, length: int, trials: int) -> Timing:
    """Draw time against |noise|, drawn here directly (the sampler's own channel)."""
    times: list[float] = []
    magnitudes: list[int] = []
    for _ in range(trials):
        started = time.perf_counter()
        noise = draw_noise(plan, length)
        times.append(time.perf_counter() - started)
        magnitudes.append(sum(abs(z) for z in noise))
    rho, p = spearman(times, magnitudes)
    return Timing("draw itself", trials, statistics.median(times) * 1e3, rho, p)


def measure(trials: int, epsilon: str = "1", length: int = 4) -> list[Timing]:
    global _child
    plan = plan_for(epsilon, length)
    try:
        return [
            sampler_view(plan, length, trials),
            caller_view(draw_noise, "pool drawing in a thread (veil)", plan, length, trials),
            caller_view(draw_in_child, "drawing in a child (alternative)", plan, length, trials),
        ]
    finally:
        if _child is not None:
            _child.close()
            _child = None


def format_table(rows: list[Timing]) -> str:
    out = [
        f"{'what is timed':<36} {'trials':>7} {'median ms':>10} {'ρ |noise|':>10} {'p':>9}"
        f" {'ρ draw time':>12}",
    ]
    for r in rows:
        shows = "" if r.shows_draw is None else f"{r.shows_draw:+.3f}"
        out.append(
            f"{r.mode:<36} {r.trials:>7} {r.burst_ms:>10.3f} {r.spearman:>+10.3f}"
            f" {r.p_value:>9.2g} {shows:>12}"
        )
    return "\n".join(out)


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    serve(sys.stdin.buffer, sys.stdout.buffer)
