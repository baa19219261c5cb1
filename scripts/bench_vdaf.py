"""Per-report cost of the batched Prio3 path (issue 5) and of Poplar1 (issue 27).

    python scripts/bench_vdaf.py            # table, full batches, 5 runs
    python scripts/bench_vdaf.py --json     # one JSON object, name -> numbers
    python scripts/bench_vdaf.py --quick    # small batches, under a minute
    python scripts/bench_vdaf.py --memory   # 100,000 Histogram(100) reports, streamed
    python scripts/bench_vdaf.py --untuned  # without veil.tuning (allocator, BLAS threads)
    python scripts/bench_vdaf.py --reference DRAFT/poc   # and the draft's reference, interleaved
    python scripts/bench_vdaf.py --l1       # L1BoundSum over SumVec of the same length, interleaved

Poplar1 (bits=128, 16-byte answers) follows the Prio3 cases (``--only
Poplar1`` for it alone): the batched shard and the client's scalar shard
of one answer, then both aggregators' two verification rounds per report
at levels 0, 7, 63 and 127 with about 16 candidates, "cold" (each report's
IDPF walked from the root, as the reference does) and "warm" (from the
previous level's cache, as a collection going level by level does), and
the mean per level of a sweep of all 128 levels. ``--text`` measures the
queries of a text question instead (one per byte, every survivor extended
by all 256 byte values: the first byte, the second cold and warm, the
last). ``--parts`` adds where a cold level 0's time goes (decoding, the
fixed AES keys, the IDPF walk, the sketch, the messages), measured in the
same invocation; alone, it prints only that.

--reference takes the ``poc`` directory of a checkout of the draft's
repository (draft-irtf-cfrg-vdaf, the tag of the draft veil implements) and
runs it with --reference-python (Python 3.12 or later, with pycryptodomex),
one run of each in turn; the ratios are CPU time per report, reference over
veil, measured in the same run.

The logic lives in ``bench.vdaf``; this only parses flags and prints.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.vdaf import (
    POPLAR1_BITS,
    POPLAR1_PARTS,
    Poplar1Row,
    cases,
    compare_lifted,
    compare_poplar1_with_reference,
    compare_with_reference,
    l1_against_sumvec,
    peak_rss_mib,
    run_case,
    run_poplar1,
    run_poplar1_parts,
    run_poplar1_text,
    stream_histogram,
)
from veil.tuning import limit_blas_threads, tune_allocator
from veil.vdaf.batch.aes import backend as aes_backend


def _memory_child(reports: int, chunk: int, tune: bool, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    if tune:
        tune_allocator()
        limit_blas_threads(1)
    result, seconds = stream_histogram(reports, chunk)
    queue.put((sum(result), seconds, peak_rss_mib()))


def _memory(reports: int, chunk: int, tune: bool) -> tuple[int, float, float]:
    # A fresh process, so that its peak RSS is this workload's alone.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_memory_child, args=(reports, chunk, tune, queue))
    proc.start()
    total, seconds, rss = queue.get()
    proc.join()
    return total, seconds, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="small batches (< 60 s)")
    parser.add_argument("--runs", type=int, default=5, help="runs per case (median)")
    parser.add_argument("--only", default="", help="comma-free substring of the case names")
    parser.add_argument("--memory", action="store_true", help="streamed 100k Histogram(100)")
    parser.add_argument(
        "--untuned",
        action="store_true",
        help="skip veil.tuning (allocator thresholds, one BLAS thread)",
    )
    parser.add_argument(
        "--lifted",
        action="store_true",
        help="each hand-vectorised circuit against the generic lifted one (CPU per report)",
    )
    parser.add_argument(
        "--l1",
        action="store_true",
        help="Prio3L1BoundSum(100,255,30) over Prio3SumVec(100,255,30), interleaved (CPU)",
    )
    parser.add_argument(
        "--reference",
        default="",
        metavar="DIR",
        help="the draft's reference implementation (its poc directory), run side by side",
    )
    parser.add_argument(
        "--reference-python",
        default="python3.12",
        metavar="PYTHON",
        help="interpreter for --reference (default python3.12)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="Poplar1: where a cold level 0's time goes",
    )
    parser.add_argument(
        "--text",
        action="store_true",
        help="Poplar1 as a text question queries it: one byte at a time",
    )
    args = parser.parse_args()
    if args.text:
        _text(args)
        return
    if args.reference:
        _compare(args)
        return
    if args.parts:
        tune_allocator()
        limit_blas_threads(1)
        _print_poplar1_parts(200 if args.quick else 2000, max(5, args.runs))
        return
    if args.lifted:
        _lifted(args)
        return
    if args.l1:
        _l1(args)
        return
    runs = max(5, args.runs)
    tuned = not args.untuned and tune_allocator() and limit_blas_threads(1)

    if args.memory:
        total, seconds, rss = _memory(100_000, 10_000, not args.untuned)
        print(
            f"100000 Prio3Histogram(100,10) reports streamed in chunks of 10000: "
            f"{seconds:.1f} s, {total} counted, peak RSS {rss:.0f} MiB"
            f" ({'untuned' if args.untuned else 'tuned'})"
        )
        return

    rows = []
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        size = case.batch
        if args.quick:
            size = 20 if "10000" in case.name else 500
        rows.append(run_case(case, size, runs=runs))
    poplar1 = None
    if not args.only or args.only in "Poplar1":
        poplar1 = run_poplar1(200 if args.quick else 2000, runs=runs)

    if args.json:
        results: dict[str, object] = {
            r.name: {
                "shard_us": round(r.shard_us, 1),
                "verify_us": round(r.verify_us, 1),
                "batch": r.batch,
            }
            for r in rows
        }
        if poplar1 is not None:
            results[f"Poplar1({POPLAR1_BITS})"] = _poplar1_json(poplar1)
        print(json.dumps(results))
        return
    print(
        f"{'VDAF':28} {'batch':>7} {'shard us':>11} {'verify us':>11}"
        f" {'(cpu shard':>11} {'verify)':>9}"
        f"   median of {runs}; {'tuned' if tuned else 'untuned'}"
    )
    for r in rows:
        print(
            f"{r.name:28} {r.batch:>7} {r.shard_us:>11.1f} {r.verify_us:>11.1f}"
            f" {r.shard_cpu_us:>11.1f} {r.verify_cpu_us:>9.1f}"
        )
    if poplar1 is not None:
        _print_poplar1(poplar1)
    print(f"peak RSS {peak_rss_mib():.0f} MiB")


def _lifted(args: argparse.Namespace) -> None:
    """Whether each hand-vectorised circuit earns its code: the same work
    through the lifted scalar circuit, alternating, in one process."""
    runs = max(5, args.runs)
    print(
        f"{'VDAF':28} {'batch':>6} {'shard us':>9} {'lifted':>9} {'ratio':>6}"
        f" {'verify us':>10} {'lifted':>9} {'ratio':>6}   CPU per report, median of {runs}"
    )
    for case in cases():
        if args.only and args.only not in case.name:
            continue
        size = 200 if "10000" in case.name else 300 if "SumVec" in case.name else 2_000
        if args.quick:
            size //= 4
        r = compare_lifted(case, size, runs)
        print(
            f"{r.name:28} {r.batch:>6} {r.shard_us:>9.1f} {r.lifted_shard_us:>9.1f}"
            f" {r.lifted_shard_us / r.shard_us:>5.2f}x {r.verify_us:>10.1f}"
            f" {r.lifted_verify_us:>9.1f} {r.lifted_verify_us / r.verify_us:>5.2f}x"
        )


def _l1(args: argparse.Namespace) -> None:
    """Issue 42's bound: L1BoundSum's shard and verify within 1.5x those of
    SumVec of the same length, measured in the same run."""
    runs = max(5, args.runs)
    tune_allocator()
    limit_blas_threads(1)
    l1, sumvec = l1_against_sumvec(500 if args.quick else 5_000, runs)
    if args.json:
        print(
            json.dumps(
                {
                    r.name: {
                        "shard_cpu_us": round(r.shard_cpu_us, 1),
                        "verify_cpu_us": round(r.verify_cpu_us, 1),
                        "batch": r.batch,
                    }
                    for r in (l1, sumvec)
                }
                | {
                    "shard_ratio": round(l1.shard_cpu_us / sumvec.shard_cpu_us, 3),
                    "verify_ratio": round(l1.verify_cpu_us / sumvec.verify_cpu_us, 3),
                }
            )
        )
        return
    print(
        f"{'VDAF':28} {'batch':>6} {'shard us':>9} {'verify us':>10}"
        f"   CPU per report, median of {runs}, interleaved, the same answers"
    )
    for r in (l1, sumvec):
        print(f"{r.name:28} {r.batch:>6} {r.shard_cpu_us:>9.1f} {r.verify_cpu_us:>10.1f}")
    print(
        f"{'ratio':28} {'':>6} {l1.shard_cpu_us / sumvec.shard_cpu_us:>8.2f}x"
        f" {l1.verify_cpu_us / sumvec.verify_cpu_us:>9.2f}x"
    )


def _text(args: argparse.Namespace) -> None:
    tune_allocator()
    r = run_poplar1_text(50 if args.quick else 200, runs=max(3, min(args.runs, 5)))
    first, second, last = r.candidates
    print(
        f"Poplar1(bits={POPLAR1_BITS}) queried a byte at a time, {r.batch} reports holding"
        f" {r.strings} strings ({r.survivors} first bytes); one aggregator's verify_init,"
        " CPU us per report"
    )
    print(f"  {f'byte 1 (level 7, {first} candidates)':44} {r.first_us:>10.1f}")
    print(f"  {f'byte 2 (level 15, {second} candidates), cold':44} {r.second_cold_us:>10.1f}")
    print(f"  {f'byte 2 (level 15, {second} candidates), warm':44} {r.second_warm_us:>10.1f}")
    print(f"  {f'byte 16 (level 127, {last} candidates), cold':44} {r.last_us:>10.1f}")


def _poplar1_json(r: Poplar1Row, reference: dict[str, float] | None = None) -> dict[str, object]:
    out: dict[str, object] = {
        "batch": r.batch,
        "shard_cpu_us": round(r.shard_us, 1),
        "client_shard_ms": round(r.client_shard_ms, 2),
        "verify_cold_cpu_us": {str(k): round(v, 1) for k, v in r.cold_us.items()},
        "verify_warm_cpu_us": {str(k): round(v, 1) for k, v in r.warm_us.items()},
    }
    if r.sweep_us:
        out["sweep_cpu_us_per_level"] = round(r.sweep_us, 1)
    if reference is not None:
        out["reference_cpu_us"] = {k: round(v, 1) for k, v in reference.items()}
    return out


def _print_poplar1(r: Poplar1Row) -> None:
    print(
        f"\nPoplar1(bits={POPLAR1_BITS}), {r.batch} reports, ~16 candidates a level;"
        f" CPU us per report, median of {r.runs}; AES: {aes_backend()}"
    )
    print(f"  {'shard, batched':34} {r.shard_us:>10.1f}")
    print(f"  {'shard, client (scalar), ms':34} {r.client_shard_ms:>10.2f}")
    for level, cold in r.cold_us.items():
        warm = r.warm_us.get(level)
        print(
            f"  {f'verify level {level}, cold / warm':34} {cold:>10.1f}"
            + (f" {warm:>10.1f}" if warm is not None else f" {'-':>10}")
        )
    if r.sweep_us:
        print(f"  {f'verify, sweep of {POPLAR1_BITS} levels, per level':34} {r.sweep_us:>10.1f}")


def _compare(args: argparse.Namespace) -> None:
    runs = max(5, args.runs)
    tune_allocator()
    limit_blas_threads(1)
    if not args.json:
        print(
            f"{'VDAF':28} {'batch':>6} {'cpu shard us':>13} {'ref':>9} {'x':>6}"
            f" {'cpu verify us':>14} {'ref':>9} {'x':>6}   median of {runs}, interleaved"
        )
    results: dict[str, object] = {}
    for case in cases():
        if not case.reference or (args.only and args.only not in case.name):
            continue
        size = 500 if args.quick else case.batch
        c = compare_with_reference(case, size, args.reference_python, args.reference, runs)
        r = c.row
        results[case.name] = {
            "shard_cpu_us": round(r.shard_cpu_us, 2),
            "verify_cpu_us": round(r.verify_cpu_us, 2),
            "reference_shard_us": round(c.reference_shard_us, 1),
            "reference_verify_us": round(c.reference_verify_us, 1),
            "shard_ratio": round(c.shard_ratio, 1),
            "verify_ratio": round(c.verify_ratio, 1),
        }
        if not args.json:
            print(
                f"{r.name:28} {r.batch:>6} {r.shard_cpu_us:>13.2f} {c.reference_shard_us:>9.0f}"
                f" {c.shard_ratio:>6.0f} {r.verify_cpu_us:>14.2f} {c.reference_verify_us:>9.0f}"
                f" {c.verify_ratio:>6.0f}",
                flush=True,
            )
    if not args.only or args.only in "Poplar1":
        size = 200 if args.quick else 2000
        pc = compare_poplar1_with_reference(size, args.reference_python, args.reference, runs=runs)
        results[f"Poplar1({POPLAR1_BITS})"] = _poplar1_json(pc.row, pc.reference)
        if not args.json:
            _print_poplar1_compared(pc.row, pc.reference)
            if args.parts:
                _print_poplar1_parts(size, runs)
    if args.json:
        print(json.dumps(results))


def _print_poplar1_parts(size: int, runs: int) -> None:
    parts = run_poplar1_parts(size, level=0, runs=runs)
    print(
        f"\nPoplar1(bits={POPLAR1_BITS}) verify level 0, cold, {size} reports, both aggregators;"
        f" CPU us per report, median of {runs}; AES: {aes_backend()}"
    )
    for name in POPLAR1_PARTS:
        of = " (of the walk)" if name == "fixed AES keys" else ""
        print(f"  {name + of:34} {parts[name]:>10.2f}")
    print(f"  {'total (timed apart)':34} {parts['total']:>10.2f}")


def _print_poplar1_compared(r: Poplar1Row, ref: dict[str, float]) -> None:
    print(
        f"\nPoplar1(bits={POPLAR1_BITS}), {r.batch} reports (reference: a few),"
        f" ~16 candidates a level; CPU us per report, median of {r.runs}, interleaved;"
        f" AES: {aes_backend()}"
    )
    print(f"  {'':30} {'veil':>10} {'ref':>10} {'x':>6}")
    print(
        f"  {'shard, batched':30} {r.shard_us:>10.1f} {ref['shard']:>10.0f}"
        f" {ref['shard'] / r.shard_us:>6.0f}"
    )
    client = r.client_shard_ms * 1e3
    print(
        f"  {'shard, client (scalar)':30} {client:>10.1f} {ref['shard']:>10.0f}"
        f" {ref['shard'] / client:>6.1f}"
    )
    for level, cold in r.cold_us.items():
        theirs = ref[str(level)]
        print(
            f"  {f'verify level {level}, cold':30} {cold:>10.1f} {theirs:>10.0f}"
            f" {theirs / cold:>6.0f}"
        )
        warm = r.warm_us.get(level)
        if warm is not None:
            print(
                f"  {f'verify level {level}, warm':30} {warm:>10.1f} {theirs:>10.0f}"
                f" {theirs / warm:>6.0f}"
            )


if __name__ == "__main__":
    main()
