"""Benchmark: what the survey page's connection guard costs an honest client.

GET /survey.json over keep-alive and over a new connection per request, the
page through veil.web.guard against uvicorn's own h11 protocol as the page was
served before; medians over alternating rounds. See bench.page.

    python scripts/bench_page.py [--rounds 5] [--keepalive 1000] [--fresh 500]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.page import format_table, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keepalive", type=int, default=1000, help="requests per round")
    parser.add_argument("--fresh", type=int, default=500, help="connections per round")
    args = parser.parse_args()
    print(format_table(measure(args.rounds, args.keepalive, args.fresh)))


if __name__ == "__main__":
    main()
