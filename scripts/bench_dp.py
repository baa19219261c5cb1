"""Benchmark: DP noise for one aggregate share, per aggregator.

Times veil.dp.add_noise (draw exact noise with the production rng,
secrets.SystemRandom, and add it mod p) on a 100,000-coordinate aggregate share, and
prints the median of several runs for a few mechanisms, modes and fields. The target
(issue 3) is under 2 s per aggregator.

    python scripts/bench_dp.py [--length 100000] [--runs 7]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time

from veil.dp import DPConfig, NoiseMode, NoisePlan, add_noise

FIELD64 = 2**32 * (2**32 - 1) + 1
FIELD128 = 2**66 * 4611686018427387897 + 1

CASES: list[tuple[str, DPConfig, str, dict[str, int]]] = [
    ("geometric ε=1, Count", DPConfig.geometric(1), "Prio3Count", {}),
    ("geometric ε=0.1, Histogram", DPConfig.geometric("0.1"), "Prio3Histogram", {"length": 8}),
    (
        "geometric ε=1 split, Count",
        DPConfig.geometric(1, NoiseMode.SPLIT),
        "Prio3Count",
        {},
    ),
    (
        "geometric ε=0.1 split, Histogram",
        DPConfig.geometric("0.1", NoiseMode.SPLIT),
        "Prio3Histogram",
        {"length": 8},
    ),
    ("laplace ε=1, 16 bits, Sum", DPConfig.laplace(1, 16), "Prio3Sum", {"max_measurement": 2**16}),
    ("gaussian ρ=0.1, Histogram", DPConfig.gaussian("0.1"), "Prio3Histogram", {"length": 8}),
    ("gaussian ρ=0.1, Sum 2**16", DPConfig.gaussian("0.1"), "Prio3Sum", {"max_measurement": 2**16}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rng = secrets.SystemRandom()
    print(f"add_noise on a {args.length}-coordinate aggregate share, median of {args.runs} runs")
    print(f"{'case':<36} {'field':>8} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, config, vdaf, params in CASES:
        plan = NoisePlan.for_task(config, vdaf, params)
        for field_name, modulus in (("Field64", FIELD64), ("Field128", FIELD128)):
            share = [rng.randrange(modulus) for _ in range(args.length)]
            add_noise(share[:1000], modulus, plan)  # warm caches (Pólya tables)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                add_noise(share, modulus, plan)
                times.append(time.perf_counter() - start)
            print(
                f"{name:<36} {field_name:>8} {statistics.median(times):>9.3f} "
                f"{min(times):>7.3f} {max(times):>7.3f}"
            )


if __name__ == "__main__":
    main()
