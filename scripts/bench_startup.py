"""What one start of the `veil` command costs, per command: CPU seconds of the
process (median of N starts after a warm-up), and against another source tree.

    python scripts/bench_startup.py                     # 5 starts a command
    python scripts/bench_startup.py --starts 9 --vs ../other-checkout/src

The logic lives in ``bench.startup``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.startup import ROWS, format_table, measure


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=5, help="counted starts a command")
    p.add_argument(
        "--vs",
        type=Path,
        help="another checkout's src/ directory: its starts alternate with these",
    )
    p.add_argument("--only", nargs="+", choices=ROWS, metavar="ROW", help="only these rows")
    args = p.parse_args()
    print(format_table(measure(args.starts, args.only or ROWS, args.vs)))


if __name__ == "__main__":
    main()
