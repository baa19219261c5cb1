"""Text answers end to end (issue 27): respondents' answers sharded, uploaded to
a local leader and helper (loopback, SQLite) and the top answers recovered level
by level. Prints one row per level and the totals.

    python scripts/bench_text.py                      # 10,000 respondents, 16 bytes
    python scripts/bench_text.py --respondents 1000 --max-bytes 4
    python scripts/bench_text.py --profile prof/   # py-spy flame graphs of both servers

The logic lives in ``bench.text``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.text import run_once, share_floor_found
from veil.logs import configure_logging
from veil.tuning import limit_blas_threads, tune_allocator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--respondents", type=int, default=10_000)
    parser.add_argument("--max-bytes", type=int, default=16)
    parser.add_argument("--epsilon", default="2", help="the question's total ε")
    parser.add_argument(
        "--profile",
        type=Path,
        help="directory for py-spy's flame graphs of both servers during the collection",
    )
    args = parser.parse_args()
    configure_logging("warning")
    limit_blas_threads()
    tune_allocator()
    run = run_once(args.respondents, args.max_bytes, args.epsilon, args.profile)
    print(
        f"{run.respondents} respondents, {run.max_bytes}-byte answers, ε = {run.epsilon}"
        f" over {run.max_bytes} levels, threshold {run.threshold}"
    )
    print(f"{'level':>5} {'candidates':>10} {'survivors':>9} {'seconds':>8}")
    for level in run.levels:
        print(f"{level.level:>5} {level.candidates:>10} {level.survivors:>9} {level.seconds:>8.1f}")
    print(
        f"CPU: leader {run.leader_cpu:.1f} s, helper {run.helper_cpu:.1f} s (start to last level)"
    )
    big, found = share_floor_found(run)
    print(
        f"shard {run.shard_seconds:.1f} s, upload {run.upload_seconds:.1f} s,"
        f" collect {run.collect_seconds:.1f} s"
    )
    print(
        f"end to end: {run.served_seconds:.1f} s from upload (respondents shard on their own"
        f" devices), {run.total_seconds:.1f} s with every shard made here in turn"
    )
    print(f"answers held by >= 2% of respondents: {big}, recovered: {found}")
    top = sorted(run.recovered.items(), key=lambda kv: -kv[1])[:10]
    for answer, count in top:
        print(
            f"  {answer.rstrip(bytes(1)).decode(errors='replace'):<16} noisy {count:>6}"
            f"  true {run.truth.get(answer, 0):>6}"
        )


if __name__ == "__main__":
    main()
