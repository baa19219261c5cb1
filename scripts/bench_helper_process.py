"""The helper's whole-process CPU per Count report over DAP against veil's
gRPC: a real `veil helper` serving both listeners, fed by this process as
its leader, the two paths alternating (bench.helper_process); prints each
round and a table of the medians.

    python scripts/bench_helper_process.py --rounds 9 --reports 4000 --job-size 500
    python scripts/bench_helper_process.py --postgres   # a throwaway PostgreSQL
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.helper_process import run, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reports", type=int, default=4000)
    parser.add_argument("--job-size", type=int, default=500)
    parser.add_argument(
        "--postgres", action="store_true", help="store in a throwaway PostgreSQL, not SQLite"
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy's flame graph and stacks of the helper into DIR"
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        storage = None
        if args.postgres:
            from bench.postgres import as_url, postgres_dsn

            storage = as_url(stack.enter_context(postgres_dsn()))
        result = run(args.rounds, args.reports, args.job_size, storage, profile=args.profile)
    print()
    print(table(result, args.reports, args.job_size, "PostgreSQL" if args.postgres else "SQLite"))


if __name__ == "__main__":
    main()
