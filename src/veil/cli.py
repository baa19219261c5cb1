"""The ``veil`` command."""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

from veil.localsim import run_local
from veil.vdaf import Prio3, Prio3Count, Prio3Histogram, Prio3Sum, Prio3SumVec


def _demo_local(respondents: int) -> int:
    """Prio3 shard -> verify -> aggregate -> unshard in one process, on
    simulated answers, without servers or noise."""
    rng = random.Random(secrets.randbits(64))
    questions: list[tuple[str, Prio3[Any, Any], Any]] = [
        ("yes/no (Count)", Prio3Count(2), lambda: int(rng.random() < 0.3)),
        ("age 0..120 (Sum)", Prio3Sum(2, 120), lambda: rng.randrange(18, 90)),
        ("favourite of 8 (Histogram)", Prio3Histogram(2, 8, 3), lambda: rng.randrange(8)),
        (
            "3 scores 0..10 (SumVec)",
            Prio3SumVec(2, 3, 10, 3),
            lambda: [rng.randrange(11) for _ in range(3)],
        ),
    ]
    print(f"veil local round trip: {respondents} simulated respondents, 2 aggregators in-process")
    print("(no servers, no DP noise: this checks the Prio3 core end to end)\n")
    for name, vdaf, draw in questions:
        answers = [draw() for _ in range(respondents)]
        start = time.perf_counter()
        run = run_local(vdaf, answers, b"veil demo")
        elapsed = time.perf_counter() - start
        if isinstance(answers[0], list):
            truth: Any = [sum(col) for col in zip(*answers, strict=True)]
        elif isinstance(vdaf, Prio3Histogram):
            truth = [answers.count(i) for i in range(8)]
        else:
            truth = sum(answers)
        status = "ok" if run.result == truth else "MISMATCH"
        print(
            f"{name:28s} truth={truth} aggregate={run.result} "
            f"accepted={run.accepted} [{status}, {elapsed:.2f}s]"
        )
        if run.result != truth:
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="veil", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the local demo")
    demo.add_argument("--respondents", type=int, default=300)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo_local(args.respondents)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
