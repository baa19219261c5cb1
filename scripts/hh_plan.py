"""What a text question (Poplar1 heavy hitters) states: threshold, release probability of
an answer given once, detection floor, for issue 27's case (bench.heavy_hitters). Prints
Markdown tables (docs/ACCURACY.md, "Text questions").

    python scripts/hh_plan.py
    python scripts/hh_plan.py --epsilon 2/7 1 2.5 --respondents 10000
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.heavy_hitters import (
    case_row,
    default_text_epsilon,
    floor_table,
    format_case,
    format_floor_table,
    least_epsilon_for_share,
)
from veil.dp.accounting import Guarantee, Neighbouring, pure_to_rho
from veil.dp.mechanisms import DPConfig, NoiseMode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--respondents", type=int, default=10_000)
    parser.add_argument(
        "--epsilon", nargs="+", default=None, help="the text question's ε (default: 2/7, 1, 2.5)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--candidates",
        type=int,
        default=50 * 256,
        help="prefixes one level queries, for the threshold that also bounds empty ones",
    )
    args = parser.parse_args()
    default = default_text_epsilon()
    epsilons = (
        [Fraction(e) for e in args.epsilon]
        if args.epsilon
        else [default, Fraction(1), Fraction(5, 2)]
    )
    n = args.respondents
    print(f"Default ε of a text question (weight 1, example survey): {default}")
    print("\nThreshold for P(release of an answer given once) <= 1e-3:\n")
    configs = [DPConfig.geometric(e, m) for e in epsilons for m in NoiseMode]
    rows = [case_row(c, r, n) for c in configs for r in Neighbouring]
    print(format_case(rows, n))
    print(f"\nThe same, T also keeping <= 0.05 empty prefixes of {args.candidates} per level:\n")
    rows = [case_row(c, r, n, candidates=args.candidates) for c in configs for r in Neighbouring]
    print(format_case(rows, n))
    print("\nThe gaussian mechanism (zCDP survey), ρ of the question, T for 1e-3:\n")
    rhos = [pure_to_rho(e) for e in epsilons]
    rows = [case_row(DPConfig.gaussian(rho), r, n) for rho in rhos for r in Neighbouring]
    print(format_case(rows, n))
    for rho in rhos:
        print(f"- ρ = {float(rho):.4g}: {Guarantee.zcdp(rho).text()}")
    print(f"\nLeast ε (multiple of 0.05) with a detection floor <= 2% at n = {n}:\n")
    for relation in Neighbouring:
        for mode in NoiseMode:
            eps = least_epsilon_for_share(Fraction(1, 50), relation, mode, n)
            print(f"- {relation}, {mode}: ε = {float(eps):g}")
    print("\nDetection floor at the default release target:\n")
    print(format_floor_table(floor_table(epsilons, args.sizes), args.sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
