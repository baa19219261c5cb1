"""Coverage of the published intervals at 5 to 50 respondents, every kind of
question, with the exact noise (bench.coverage). Prints a Markdown table
(docs/reports/ACCURACY.md).

    python scripts/coverage_small.py --runs 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from fractions import Fraction
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.coverage import format_coverage, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000, help="collections per point")
    parser.add_argument("--sizes", type=int, nargs="+", default=[5, 7, 10, 20, 30, 50])
    parser.add_argument("--epsilon", nargs="+", default=["0.25", "2"], help="ε per question")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args()
    started = time.perf_counter()
    points = run(
        [Fraction(e) for e in args.epsilon],
        args.sizes,
        args.runs,
        args.seed,
        progress=lambda p: print(
            f"{p.neighbouring} ε={float(p.epsilon):g} {p.kind} n={p.n} {p.case}: {p.shown:.3f}",
            file=sys.stderr,
        ),
    )
    print(format_coverage(points))
    low = min(p.shown for p in points)
    print(
        f"\n{len(points)} points, {args.runs:,} collections each; lowest shown coverage"
        f" {low:.3f}; {time.perf_counter() - started:.0f} s",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
