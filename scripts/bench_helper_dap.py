"""The helper's CPU per Count report over DAP against veil's gRPC, both in
one process and one run, alternating (bench.helper_dap); prints each round
and a table of the medians.

    python scripts/bench_helper_dap.py --rounds 9 --reports 4000 --job-size 500
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.helper_dap import run, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reports", type=int, default=4000)
    parser.add_argument("--job-size", type=int, default=500)
    args = parser.parse_args()
    rounds = run(args.rounds, args.reports, args.job_size)
    print()
    print(table(rounds, args.reports, args.job_size))


if __name__ == "__main__":
    main()
