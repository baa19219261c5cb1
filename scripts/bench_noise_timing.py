"""Benchmark: how much of the noise's magnitude a caller's request timing shows.

Spearman rank correlation between |noise| and (1) the sampler's own draw time,
(2) the time of a burst of requests served right after a release while the
pool draws the next release's vector, in a thread (before issue 25) and in a
child process (now). See bench.noise and docs/OBSERVATIONS.md.

    python scripts/bench_noise_timing.py [--trials 2000] [--epsilon 1] [--length 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.noise import format_table, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--epsilon", default="1")
    parser.add_argument("--length", type=int, default=4, help="Histogram length")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for run in range(args.runs):
        print(f"run {run + 1}: geometric ε = {args.epsilon}, Histogram({args.length})")
        print(format_table(measure(args.trials, args.epsilon, args.length)))
        print()


if __name__ == "__main__":
    main()
