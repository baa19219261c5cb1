"""Throughput benchmarks of the batched Prio3 path (issue 5) and of
Poplar1 (issue 27).

``scripts/bench_vdaf.py`` is the command-line front end; the logic lives
here so that simulations and tests can reuse it. Times are wall-clock
medians over several runs, reported per report: "shard" is
``shard_batch``; "verify" is both aggregators' ``verify_init_batch``, one
``verifier_shares_to_message_batch`` and both ``verify_next_batch``.
"""

from __future__ import annotations

import itertools
import json
import random
import resource
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from veil.vdaf import Prio3Count, Prio3Histogram, Prio3L1BoundSum, Prio3Sum, Prio3SumVec
from veil.vdaf.batch.idpf import IdpfCache
from veil.vdaf.batch.poplar1 import (
    BatchPoplar1,
    Poplar1OutShareBatch,
    VerifyRoundBatch,
)
from veil.vdaf.batch.prio3 import BatchPrio3, OutShareBatch
from veil.vdaf.batch.prio3_shard import ShardBatch
from veil.vdaf.spec.idpf import DST_CONVERT, DST_EXTEND
from veil.vdaf.spec.poplar1 import Poplar1, Poplar1AggParam
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
        # SumVec's length and bound, the bound on the sum (issue 42 holds
        # it to 1.5x SumVec's time: `l1_against_sumvec`).
        Case(
            "Prio3L1BoundSum(100,255,30)",
            lambda: Prio3L1BoundSum(2, 100, 255, 30),
            lambda r: within_l1(r, 100, 255),
        ),
    ]


def within_l1(rng: random.Random, length: int, bound: int) -> list[int]:
    """``length`` non-negative ints summing to a uniform draw from
    ``[0, bound]``, each unit of the sum placed at random."""
    values = [0] * length
    for _ in range(rng.randrange(bound + 1)):
        values[rng.randrange(length)] += 1
    return values


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


def run_interleaved(cases: Sequence[Case], batch_size: int, runs: int = 5) -> list[Row]:
    """``run_case`` of each case in turn, ``runs`` times (so that the
    machine's load falls on all alike); the medians per case."""
    rows: list[list[Row]] = [[] for _ in cases]
    for _ in range(runs):
        for case, done in zip(cases, rows, strict=True):
            done.append(run_case(case, batch_size, runs=1))
    return [
        Row(
            case.name,
            batch_size,
            statistics.median(r.shard_us for r in done),
            statistics.median(r.verify_us for r in done),
            runs,
            statistics.median(r.shard_cpu_us for r in done),
            statistics.median(r.verify_cpu_us for r in done),
        )
        for case, done in zip(cases, rows, strict=True)
    ]


def l1_against_sumvec(batch_size: int, runs: int = 5) -> tuple[Row, Row]:
    """Prio3L1BoundSum(100,255,30) and Prio3SumVec(100,255,30), interleaved, on
    the same answers (vectors within the L1 bound, which SumVec takes too: its
    shard is about a tenth slower on entries drawn uniformly from [0, 255])."""
    l1 = next(c for c in cases() if c.name == "Prio3L1BoundSum(100,255,30)")
    sumvec = Case("Prio3SumVec(100,255,30)", lambda: Prio3SumVec(2, 100, 255, 30), l1.measurement)
    first, second = run_interleaved([l1, sumvec], batch_size, runs)
    return first, second


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


# -- Poplar1 (issue 27) --------------------------------------------------------
#
# Reports of 16-byte strings (bits=128) drawn from a few heavy strings and
# some strings held once; the candidates at a level are the heavy strings'
# prefixes and each one's sibling (the prefixes a heavy-hitters run keeps
# plus the ones it rules out), about 16. "verify" is both aggregators'
# two rounds (verify_init, two messages, verify_next twice), per report
# and per level: "cold" starts each report's IDPF walk at the root (the
# reference always does), "warm" starts from the previous level's cache, as
# a collection going level by level does.

POPLAR1_BITS = 128
POPLAR1_HEAVY = 8
POPLAR1_LEVELS = (0, 7, 63, 127)


@dataclass(frozen=True)
class Poplar1Inputs:
    measurements: list[tuple[bool, ...]]
    nonces: list[bytes]
    rands: list[bytes]
    verify_key: bytes
    heavy: list[tuple[bool, ...]]


def poplar1_inputs(count: int, seed: int = 1) -> Poplar1Inputs:
    """``count`` reports: three in four hold one of ``POPLAR1_HEAVY`` strings."""
    rng = random.Random(seed)
    vdaf = Poplar1(POPLAR1_BITS)
    heavy = [vdaf.measurement_from_bytes(rng.randbytes(16)) for _ in range(POPLAR1_HEAVY)]
    measurements = [
        rng.choice(heavy) if rng.random() < 0.75 else vdaf.measurement_from_bytes(rng.randbytes(16))
        for _ in range(count)
    ]
    return Poplar1Inputs(
        measurements,
        [rng.randbytes(vdaf.NONCE_SIZE) for _ in range(count)],
        [rng.randbytes(vdaf.RAND_SIZE) for _ in range(count)],
        rng.randbytes(vdaf.VERIFY_KEY_SIZE),
        heavy,
    )


def poplar1_candidates(heavy: Sequence[tuple[bool, ...]], level: int) -> Poplar1AggParam:
    """The heavy strings' prefixes at ``level`` and their siblings."""
    prefixes = {w[: level + 1] for w in heavy}
    prefixes |= {(*w[:level], not w[level]) for w in heavy}
    return Poplar1AggParam(level, tuple(sorted(prefixes)))


def poplar1_verify(
    batch: BatchPoplar1,
    agg_param: Poplar1AggParam,
    inputs: Poplar1Inputs,
    sharded: ShardBatch,
    caches: Sequence[IdpfCache | None],
) -> tuple[list[Poplar1OutShareBatch], list[IdpfCache | None]]:
    """Both aggregators' two rounds over a sharded batch, in one process."""
    inits = [
        batch.verify_init_batch(
            inputs.verify_key,
            CTX,
            j,
            agg_param,
            inputs.nonces,
            sharded.public_shares,
            sharded.input_shares[j],
            caches[j],
        )
        for j in (0, 1)
    ]
    msgs = batch.verifier_shares_to_message_batch(
        CTX, agg_param, [i.verifier_shares for i in inits]
    )
    rounds = [batch.verify_next_batch(CTX, i.state, msgs) for i in inits]
    shares = [r.verifier_shares for r in rounds if isinstance(r, VerifyRoundBatch)]
    finals = batch.verifier_shares_to_message_batch(CTX, agg_param, shares)
    outs = [
        batch.verify_next_batch(CTX, r.state, finals)
        for r in rounds
        if isinstance(r, VerifyRoundBatch)
    ]
    return [o for o in outs if isinstance(o, Poplar1OutShareBatch)], [i.cache for i in inits]


@dataclass(frozen=True)
class Poplar1Row:
    """CPU microseconds per report: the batched shard, the scalar (client)
    shard, and at each level both aggregators' verification cold and warm;
    the mean per level of a sweep of every level (warm)."""

    batch: int
    shard_us: float
    client_shard_ms: float
    cold_us: dict[int, float]
    warm_us: dict[int, float]
    sweep_us: float
    runs: int


def run_poplar1(
    batch_size: int, runs: int = 5, levels: Sequence[int] = POPLAR1_LEVELS, sweep: bool = True
) -> Poplar1Row:
    """Medians over ``runs`` of the per-report CPU times of ``Poplar1Row``."""
    vdaf = Poplar1(POPLAR1_BITS)
    batch = BatchPoplar1(vdaf)
    inputs = poplar1_inputs(batch_size)
    shard, client, sweep_times = [], [], []
    cold: dict[int, list[float]] = {level: [] for level in levels}
    warm: dict[int, list[float]] = {level: [] for level in levels if level > 0}
    clock = time.process_time
    for _ in range(runs):
        start = clock()
        sharded = batch.shard_batch(CTX, inputs.measurements, inputs.nonces, inputs.rands)
        shard.append((clock() - start) / batch_size)
        # The client's shard of one answer, through the scalar path.
        one = []
        for i in range(min(batch_size, 20)):
            start = clock()
            vdaf.shard(CTX, inputs.measurements[i], inputs.nonces[i], inputs.rands[i])
            one.append(clock() - start)
        client.append(statistics.median(one))
        no_cache: list[IdpfCache | None] = [None, None]
        for level in levels:
            agg_param = poplar1_candidates(inputs.heavy, level)
            start = clock()
            outs, _ = poplar1_verify(batch, agg_param, inputs, sharded, no_cache)
            cold[level].append((clock() - start) / batch_size)
            _check_counts(vdaf, batch, agg_param, inputs, outs)
            if level > 0:
                before = poplar1_candidates(inputs.heavy, level - 1)
                _, caches = poplar1_verify(batch, before, inputs, sharded, no_cache)
                start = clock()
                outs, _ = poplar1_verify(batch, agg_param, inputs, sharded, caches)
                warm[level].append((clock() - start) / batch_size)
                _check_counts(vdaf, batch, agg_param, inputs, outs)
        if sweep:
            caches = no_cache
            start = clock()
            for level in range(POPLAR1_BITS):
                agg_param = poplar1_candidates(inputs.heavy, level)
                outs, caches = poplar1_verify(batch, agg_param, inputs, sharded, caches)
            sweep_times.append((clock() - start) / batch_size / POPLAR1_BITS)
            _check_counts(vdaf, batch, agg_param, inputs, outs)
    us = 1e6
    return Poplar1Row(
        batch_size,
        statistics.median(shard) * us,
        statistics.median(client) * 1e3,
        {level: statistics.median(t) * us for level, t in cold.items()},
        {level: statistics.median(t) * us for level, t in warm.items()},
        statistics.median(sweep_times) * us if sweep_times else 0.0,
        runs,
    )


def _check_counts(
    vdaf: Poplar1,
    batch: BatchPoplar1,
    agg_param: Poplar1AggParam,
    inputs: Poplar1Inputs,
    outs: Sequence[Poplar1OutShareBatch],
) -> None:
    counts = vdaf.unshard(agg_param, [batch.aggregate_batch(o) for o in outs], len(outs[0].errors))
    level = agg_param.level
    truth = Counter(m[: level + 1] for m in inputs.measurements)
    if counts != [truth[p] for p in agg_param.prefixes]:
        raise RuntimeError(f"Poplar1 level {level}: counts differ from the truth")


# Where a cold level's time goes (``--parts``): both aggregators' decoding
# of their shares, the fixed AES keys (TurboSHAKE128 of each nonce, two
# usages), the IDPF walk (with those keys), the rest of verify_init (the
# sketch's randomness and arithmetic), and the messages and second round.
POPLAR1_PARTS = ("decode", "fixed AES keys", "IDPF walk", "sketch", "messages, round 2")


def run_poplar1_parts(batch_size: int, level: int = 0, runs: int = 5) -> dict[str, float]:
    """Medians over ``runs`` of the CPU microseconds per report of each of
    ``POPLAR1_PARTS`` at a cold ``level`` (both aggregators), and of the
    whole (``"total"``, timed apart). Each part is timed alone: "IDPF walk"
    includes "fixed AES keys", and "sketch" is verify_init less decoding
    and walk."""
    vdaf = Poplar1(POPLAR1_BITS)
    batch = BatchPoplar1(vdaf)
    inputs = poplar1_inputs(batch_size)
    sharded = batch.shard_batch(CTX, inputs.measurements, inputs.nonces, inputs.rands)
    agg_param = poplar1_candidates(inputs.heavy, level)
    clock = time.process_time
    times: dict[str, list[float]] = {name: [] for name in (*POPLAR1_PARTS, "total")}
    no_cache: list[IdpfCache | None] = [None, None]
    for _ in range(runs):
        spent = dict.fromkeys(times, 0.0)
        for j in (0, 1):
            start = clock()
            d = batch._decode(j, inputs.nonces, sharded.public_shares, sharded.input_shares[j])
            spent["decode"] += clock() - start
            start = clock()
            for dst in (DST_EXTEND, DST_CONVERT):
                batch.walk.fixed_keys(dst + CTX, d.idpf.nonces)
            spent["fixed AES keys"] += clock() - start
            start = clock()
            batch.walk.eval(j, level, agg_param.prefixes, CTX, d.idpf, None)
            spent["IDPF walk"] += clock() - start
            start = clock()
            batch.verify_init_batch(
                inputs.verify_key,
                CTX,
                j,
                agg_param,
                inputs.nonces,
                sharded.public_shares,
                sharded.input_shares[j],
            )
            spent["sketch"] += clock() - start
        start = clock()
        poplar1_verify(batch, agg_param, inputs, sharded, no_cache)
        spent["total"] = clock() - start
        # verify_init itself was timed whole: its sketch is what remains.
        spent["sketch"] -= spent["decode"] + spent["IDPF walk"]
        init = spent["decode"] + spent["IDPF walk"] + spent["sketch"]
        spent["messages, round 2"] = spent["total"] - init
        for name, seconds in spent.items():
            times[name].append(seconds / batch_size * 1e6)
    return {name: statistics.median(t) for name, t in times.items()}


# Run by the reference's interpreter: shard ``reports`` reports, then both
# aggregators' two rounds at each level (each walk from the root, as the
# reference does); CPU microseconds per report as JSON.
_POPLAR1_REFERENCE_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from vdaf_poc.vdaf_poplar1 import Poplar1
given = json.load(sys.stdin)
vdaf = Poplar1(given["bits"])
ctx = b"veil benchmark"
key = bytes.fromhex(given["key"])
inputs = [(tuple(m), bytes.fromhex(n), bytes.fromhex(r)) for m, n, r in given["reports"]]
start = time.process_time()
sharded = [vdaf.shard(ctx, m, n, r) for m, n, r in inputs]
result = {"shard": (time.process_time() - start) * 1e6 / len(inputs)}
for level, prefixes in given["levels"]:
    agg_param = (level, tuple(tuple(p) for p in prefixes))
    start = time.process_time()
    for (public, shares), (_, nonce, _) in zip(sharded, inputs):
        inits = [vdaf.verify_init(key, ctx, j, agg_param, nonce, public, shares[j]) for j in (0, 1)]
        message = vdaf.verifier_shares_to_message(ctx, agg_param, [s for _, s in inits])
        seconds = [vdaf.verify_next(ctx, state, message) for state, _ in inits]
        final = vdaf.verifier_shares_to_message(ctx, agg_param, [s for _, s in seconds])
        for state, _ in seconds:
            vdaf.verify_next(ctx, state, final)
    result[str(level)] = (time.process_time() - start) * 1e6 / len(inputs)
print(json.dumps(result))
"""


def poplar1_reference_run(
    python: str, path: str, reports: int, levels: Sequence[int] = POPLAR1_LEVELS
) -> dict[str, float]:
    """One run of the draft's reference Poplar1 (bits=128) on the same kind
    of reports and candidates: CPU microseconds per report to shard
    (``"shard"``) and to verify at each level (``"<level>"``)."""
    inputs = poplar1_inputs(reports)
    given = {
        "bits": POPLAR1_BITS,
        "key": inputs.verify_key.hex(),
        "reports": [
            [list(m), n.hex(), r.hex()]
            for m, n, r in zip(inputs.measurements, inputs.nonces, inputs.rands, strict=True)
        ],
        "levels": [
            [level, [list(p) for p in poplar1_candidates(inputs.heavy, level).prefixes]]
            for level in levels
        ],
    }
    done = subprocess.run(
        [python, "-c", _POPLAR1_REFERENCE_CHILD, path],
        input=json.dumps(given),
        check=True,
        capture_output=True,
        text=True,
    )
    return {k: float(v) for k, v in json.loads(done.stdout).items()}


@dataclass(frozen=True)
class Poplar1Compared:
    row: Poplar1Row
    reference: dict[str, float]  # medians of poplar1_reference_run


def compare_poplar1_with_reference(
    batch_size: int, python: str, path: str, reference_reports: int = 4, runs: int = 5
) -> Poplar1Compared:
    """Runs of veil's paths and of the reference, interleaved; medians."""
    ours: list[Poplar1Row] = []
    theirs: list[dict[str, float]] = []
    for _ in range(runs):
        ours.append(run_poplar1(batch_size, runs=1, sweep=False))
        theirs.append(poplar1_reference_run(python, path, reference_reports))
    levels = ours[0].cold_us.keys()
    return Poplar1Compared(
        Poplar1Row(
            batch_size,
            statistics.median(r.shard_us for r in ours),
            statistics.median(r.client_shard_ms for r in ours),
            {lv: statistics.median(r.cold_us[lv] for r in ours) for lv in levels},
            {lv: statistics.median(r.warm_us[lv] for r in ours) for lv in ours[0].warm_us},
            0.0,
            runs,
        ),
        {k: statistics.median(t[k] for t in theirs) for k in theirs[0]},
    )


# A text question's queries (veil.dp.heavy_hitters): one per byte, each
# survivor of the previous byte extended by all 256 byte values. Measured
# at the first byte (256 candidates), the second (survivors x 256; from
# the root, "cold", and from the first byte's cache, "warm") and the last,
# the leaf level (XofTurboShake128 per node and Field255).


@dataclass(frozen=True)
class TextRow:
    batch: int
    strings: int
    survivors: int  # distinct first bytes: the second byte's survivors
    first_us: float
    second_cold_us: float
    second_warm_us: float
    last_us: float
    candidates: tuple[int, int, int]


def run_poplar1_text(batch_size: int, survivors: int = 50, runs: int = 3) -> TextRow:
    """Medians over ``runs`` of one aggregator's ``verify_init_batch`` CPU
    per report at the byte levels 7, 15 and 127 (bits=128), the reports
    holding ``survivors`` distinct strings."""
    vdaf = Poplar1(POPLAR1_BITS)
    batch = BatchPoplar1(vdaf)
    rng = random.Random(5)
    words = [vdaf.measurement_from_bytes(rng.randbytes(16)) for _ in range(survivors)]
    inputs = Poplar1Inputs(
        [rng.choice(words) for _ in range(batch_size)],
        [rng.randbytes(vdaf.NONCE_SIZE) for _ in range(batch_size)],
        [rng.randbytes(vdaf.RAND_SIZE) for _ in range(batch_size)],
        rng.randbytes(vdaf.VERIFY_KEY_SIZE),
        words,
    )
    sharded = batch.shard_batch(CTX, inputs.measurements, inputs.nonces, inputs.rands)
    byte_values = list(itertools.product((False, True), repeat=8))

    def query(level: int) -> Poplar1AggParam:
        kept = {w[: level - 7] for w in words}
        return Poplar1AggParam(level, tuple(sorted(k + v for k in kept for v in byte_values)))

    def timed(agg_param: Poplar1AggParam, cache: IdpfCache | None) -> tuple[float, Any]:
        start = time.process_time()
        init = batch.verify_init_batch(
            inputs.verify_key,
            CTX,
            0,
            agg_param,
            inputs.nonces,
            sharded.public_shares,
            sharded.input_shares[0],
            cache,
        )
        return (time.process_time() - start) / batch_size * 1e6, init.cache

    levels = (query(7), query(15), query(127))
    first, cold, warm, last = [], [], [], []
    for _ in range(runs):
        seconds, cache = timed(levels[0], None)
        first.append(seconds)
        cold.append(timed(levels[1], None)[0])
        warm.append(timed(levels[1], cache)[0])
        last.append(timed(levels[2], None)[0])
    return TextRow(
        batch_size,
        survivors,
        len({w[:8] for w in words}),
        statistics.median(first),
        statistics.median(cold),
        statistics.median(warm),
        statistics.median(last),
        (len(levels[0].prefixes), len(levels[1].prefixes), len(levels[2].prefixes)),
    )
