"""Throughput benchmarks of the batched Prio3 path (issue 5).

``scripts/bench_vdaf.py`` is the command-line front end; the logic lives
here so that simulations and tests can reuse it. Times are wall-clock
medians over several runs, reported per report: "shard" is
``shard_batch``; "verify" is both aggregators' ``verify_init_batch``, one
``verifier_shares_to_message_batch`` and both ``verify_next_batch``.
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from veil.vdaf import Prio3Count, Prio3Histogram, Prio3Sum, Prio3SumVec
from veil.vdaf.batch.prio3 import BatchPrio3, OutShareBatch, ShardBatch
from veil.vdaf.spec.prio3 import Prio3

CTX = b"veil benchmark"


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], Prio3[Any, Any]]
    measurement: Callable[[random.Random], Any]
    # Reports per batch in the full run; the largest circuit uses fewer so
    # that five runs finish in minutes (the per-report cost is flat by then).
    batch: int = 10_000
    # The draft's reference implementation: its constructor call and how
    # many reports one of its runs takes (it is two orders slower); no
    # reference run where empty.
    reference: str = ""
    reference_reports: int = 0


def cases() -> list[Case]:
    return [
        Case(
            "Prio3Count",
            lambda: Prio3Count(2),
            lambda r: r.randrange(2),
            reference="Prio3Count(2)",
            reference_reports=200,
        ),
        Case(
            "Prio3Sum(255)",
            lambda: Prio3Sum(2, 255),
            lambda r: r.randrange(256),
            reference="Prio3Sum(2, 255)",
            reference_reports=100,
        ),
        Case(
            "Prio3Sum(4294967295)",
            lambda: Prio3Sum(2, 2**32 - 1),
            lambda r: r.randrange(2**32),
        ),
        Case(
            "Prio3Histogram(100,10)",
            lambda: Prio3Histogram(2, 100, 10),
            lambda r: r.randrange(100),
            reference="Prio3Histogram(2, 100, 10)",
            reference_reports=20,
        ),
        Case(
            "Prio3Histogram(10000,100)",
            lambda: Prio3Histogram(2, 10_000, 100),
            lambda r: r.randrange(10_000),
            batch=1_000,
        ),
        Case(
            "Prio3SumVec(100,255,30)",
            lambda: Prio3SumVec(2, 100, 255, 30),
            lambda r: [r.randrange(256) for _ in range(100)],
            reference="Prio3SumVec(2, 100, 255, 30)",
            reference_reports=10,
        ),
    ]


@dataclass(frozen=True)
class Inputs:
    measurements: list[Any]
    nonces: list[bytes]
    rands: list[bytes]
    verify_key: bytes


def make_inputs(vdaf: Prio3[Any, Any], case: Case, count: int, seed: int = 1) -> Inputs:
    rng = random.Random(seed)
    return Inputs(
        [case.measurement(rng) for _ in range(count)],
        [rng.randbytes(vdaf.NONCE_SIZE) for _ in range(count)],
        [rng.randbytes(vdaf.RAND_SIZE) for _ in range(count)],
        rng.randbytes(vdaf.VERIFY_KEY_SIZE),
    )


def verify_all(
    batch: BatchPrio3[Any, Any], verify_key: bytes, nonces: Sequence[bytes], sharded: ShardBatch
) -> list[OutShareBatch]:
    """Both aggregators' verification of a sharded batch, in one process."""
    inits = [
        batch.verify_init_batch(
            verify_key, CTX, j, nonces, sharded.public_shares, sharded.input_shares[j]
        )
        for j in range(batch.SHARES)
    ]
    msgs = batch.verifier_shares_to_message_batch(CTX, [i.verifier_shares for i in inits])
    return [batch.verify_next_batch(CTX, i.state, msgs.messages) for i in inits]


def _chunks(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(total, start + size))


@dataclass(frozen=True)
class Row:
    name: str
    batch: int
    shard_us: float
    verify_us: float
    runs: int
    # Process CPU time (all threads), median per report: a cross-check when
    # other work competes for the cores and inflates wall-clock time.
    shard_cpu_us: float = 0.0
    verify_cpu_us: float = 0.0


def run_case(case: Case, batch_size: int, runs: int = 5, chunk: int = 10_000) -> Row:
    """Median over ``runs`` of the per-report shard and verify times for a
    batch of ``batch_size`` reports, processed ``chunk`` reports at a time."""
    vdaf = case.make()
    batch = BatchPrio3(vdaf)
    inputs = make_inputs(vdaf, case, batch_size)
    shard_times = []
    verify_times = []
    shard_cpu = []
    verify_cpu = []
    for _ in range(runs):
        sharded_parts = []
        start, start_cpu = time.perf_counter(), time.process_time()
        for s in _chunks(batch_size, chunk):
            sharded_parts.append(
                batch.shard_batch(CTX, inputs.measurements[s], inputs.nonces[s], inputs.rands[s])
            )
        shard_times.append(time.perf_counter() - start)
        shard_cpu.append(time.process_time() - start_cpu)
        start, start_cpu = time.perf_counter(), time.process_time()
        accepted = 0
        for s, sharded in zip(_chunks(batch_size, chunk), sharded_parts, strict=True):
            outs = verify_all(batch, inputs.verify_key, inputs.nonces[s], sharded)
            accepted += int(outs[0].ok.sum())
        verify_times.append(time.perf_counter() - start)
        verify_cpu.append(time.process_time() - start_cpu)
        if accepted != batch_size:
            raise RuntimeError(f"{case.name}: {batch_size - accepted} valid reports rejected")
    per_report = 1e6 / batch_size
    return Row(
        case.name,
        batch_size,
        statistics.median(shard_times) * per_report,
        statistics.median(verify_times) * per_report,
        runs,
        statistics.median(shard_cpu) * per_report,
        statistics.median(verify_cpu) * per_report,
    )


def stream_histogram(reports: int, chunk: int) -> tuple[list[int], float]:
    """Shard, verify and aggregate ``reports`` Histogram(100, 10) reports
    ``chunk`` at a time; returns the aggregate result and the seconds taken.
    Memory stays bounded by one chunk."""
    case = next(c for c in cases() if c.name == "Prio3Histogram(100,10)")
    vdaf = case.make()
    batch = BatchPrio3(vdaf)
    agg = [vdaf.agg_init(None) for _ in range(vdaf.SHARES)]
    start = time.perf_counter()
    for index, s in enumerate(_chunks(reports, chunk)):
        inputs = make_inputs(vdaf, case, s.stop - s.start, seed=index)
        sharded = batch.shard_batch(CTX, inputs.measurements, inputs.nonces, inputs.rands)
        outs = verify_all(batch, inputs.verify_key, inputs.nonces, sharded)
        for j, out in enumerate(outs):
            agg[j] = vdaf.field.vec_add(agg[j], batch.aggregate_batch(out))
    elapsed = time.perf_counter() - start
    return vdaf.unshard(None, agg, reports), elapsed


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Run by the reference's interpreter (it needs Python 3.12): shard, then
# both aggregators' verification, of ``reports`` reports; prints the CPU
# time per report of each, in microseconds, as JSON. The reference's shard
# returns objects, where ours encodes them too: the comparison leans its way.
_REFERENCE_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from vdaf_poc.vdaf_prio3 import Prio3Count, Prio3Histogram, Prio3Sum, Prio3SumVec
vdaf = eval(sys.argv[2])
given = json.load(sys.stdin)
inputs = [(m, bytes.fromhex(n), bytes.fromhex(r)) for m, n, r in given["reports"]]
reports = len(inputs)
key = bytes.fromhex(given["key"])
ctx = b"veil benchmark"
start = time.process_time()
sharded = [vdaf.shard(ctx, m, n, r) for m, n, r in inputs]
shard = time.process_time() - start
start = time.process_time()
for (public, shares), (_, nonce, _) in zip(sharded, inputs):
    inits = [vdaf.verify_init(key, ctx, j, None, nonce, public, shares[j]) for j in range(2)]
    message = vdaf.verifier_shares_to_message(ctx, None, [share for _, share in inits])
    for state, _ in inits:
        vdaf.verify_next(ctx, state, message)
verify = time.process_time() - start
print(json.dumps([shard * 1e6 / reports, verify * 1e6 / reports]))
"""


def reference_run(python: str, path: str, case: Case) -> tuple[float, float]:
    """One run of the draft's reference implementation (its ``poc``
    directory at ``path``, run by ``python``): CPU microseconds per report
    to shard and to verify (both aggregators)."""
    vdaf = case.make()
    inputs = make_inputs(vdaf, case, case.reference_reports)
    given = {
        "reports": [
            [m, n.hex(), r.hex()]
            for m, n, r in zip(inputs.measurements, inputs.nonces, inputs.rands, strict=True)
        ],
        "key": inputs.verify_key.hex(),
    }
    done = subprocess.run(
        [python, "-c", _REFERENCE_CHILD, path, case.reference],
        input=json.dumps(given),
        check=True,
        capture_output=True,
        text=True,
    )
    shard, verify = json.loads(done.stdout)
    return float(shard), float(verify)


@dataclass(frozen=True)
class Compared:
    row: Row
    reference_shard_us: float
    reference_verify_us: float

    @property
    def shard_ratio(self) -> float:
        return self.reference_shard_us / self.row.shard_cpu_us

    @property
    def verify_ratio(self) -> float:
        return self.reference_verify_us / self.row.verify_cpu_us


def compare_with_reference(
    case: Case, batch_size: int, python: str, path: str, runs: int = 5
) -> Compared:
    """Runs of veil's batched path and of the reference, interleaved (one
    of each in turn, so that the machine's load falls on both alike); the
    medians of the CPU time per report."""
    ours: list[Row] = []
    theirs: list[tuple[float, float]] = []
    for _ in range(runs):
        ours.append(run_case(case, batch_size, runs=1))
        theirs.append(reference_run(python, path, case))
    return Compared(
        Row(
            case.name,
            batch_size,
            statistics.median(r.shard_us for r in ours),
            statistics.median(r.verify_us for r in ours),
            runs,
            statistics.median(r.shard_cpu_us for r in ours),
            statistics.median(r.verify_cpu_us for r in ours),
        ),
        statistics.median(t[0] for t in theirs),
        statistics.median(t[1] for t in theirs),
    )


@dataclass(frozen=True)
class LiftedRow:
    """One circuit's hand-vectorised form against the generic lifted one
    (its scalar circuit run on columns of the batch), CPU per report."""

    name: str
    batch: int
    shard_us: float
    lifted_shard_us: float
    verify_us: float
    lifted_verify_us: float


def compare_lifted(case: Case, batch_size: int, runs: int = 5) -> LiftedRow:
    """Median CPU per report of shard and verify (both aggregators), the
    hand-vectorised circuit and the lifted one in alternating runs."""
    vdaf = case.make()
    inputs = make_inputs(vdaf, case, batch_size)
    engines = {lifted: BatchPrio3(vdaf, lifted=lifted) for lifted in (False, True)}
    shard: dict[bool, list[float]] = {False: [], True: []}
    verify: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(runs):
        for lifted, batch in engines.items():
            start = time.process_time()
            sharded = batch.shard_batch(CTX, inputs.measurements, inputs.nonces, inputs.rands)
            middle = time.process_time()
            outs = verify_all(batch, inputs.verify_key, inputs.nonces, sharded)
            shard[lifted].append(middle - start)
            verify[lifted].append(time.process_time() - middle)
            if int(outs[0].ok.sum()) != batch_size:
                raise RuntimeError(f"{case.name}: valid reports rejected (lifted={lifted})")
    per_report = 1e6 / batch_size
    return LiftedRow(
        case.name,
        batch_size,
        *(
            statistics.median(times[lifted]) * per_report
            for times in (shard, verify)
            for lifted in (False, True)
        ),
    )
