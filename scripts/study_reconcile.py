"""Coverage and precision of reconciled breakdowns, with the exact noise
(bench.reconcile over veil.dp.reconcile). Prints a Markdown table
(docs/reports/ACCURACY.md); --joint for breakdowns that share a margin,
reconciled together.

    python scripts/study_reconcile.py --runs 2000
    python scripts/study_reconcile.py --runs 2000 --joint
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.reconcile import format_study, run, run_joint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000, help="releases per configuration")
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 2000], help="respondents")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--joint", action="store_true", help="breakdowns sharing a margin, reconciled together"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    points = (run_joint if args.joint else run)(
        args.sizes,
        args.runs,
        args.seed,
        progress=lambda p: print(
            f"{p.name} {p.budget} n={p.n}: reconciled {p.reconciled_cover:.3f}"
            f" shown {p.shown_cover:.3f} variance {p.measured_ratio:.3f}",
            file=sys.stderr,
        ),
    )
    print(format_study(points))
    print(
        f"\n{len(points)} configurations, {args.runs:,} releases each; lowest reconciled"
        f" coverage {min(p.reconciled_cover for p in points):.3f}, largest measured variance"
        f" ratio {max(p.measured_ratio for p in points):.3f};"
        f" {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
