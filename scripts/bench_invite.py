"""What invitations cost: CPU per report at an aggregator against one RSA-2048
verification in the same run, and the issuer's invitations per second.

    python scripts/bench_invite.py [--reports 2000] [--questions 5] [--clients 1 8]

The example survey has 5 questions (one blind signature each per invitation).
The issuer is driven by 1 and by 8 concurrent clients (threads calling it as
the HTTP endpoint's thread pool does): each redemption's burn is written
while it signs, and concurrent ones share a commit and sign on every core.

The logic lives in ``bench.invite``; this only parses flags and prints.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

# The measurements (bench/) live beside scripts/, outside the veil package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.invite import aggregator_costs, issuer_rate, signing_per_core


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", type=int, default=2000)
    p.add_argument("--questions", type=int, default=5)
    p.add_argument("--invitations", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    args = p.parse_args()
    costs = aggregator_costs(args.reports)
    verify = costs["rsa-2048 verify"]
    print(f"{'step (CPU per report, median of 7 rounds)':<44} {'µs':>8} {'/ verify':>9}")
    for name, us in costs.items():
        print(f"{name:<44} {us:8.1f} {us / verify:9.2f}")
    leader = costs["leader check_token"]
    helper = costs["helper token check"]
    print(f"{'added at the leader':<44} {leader:8.1f} {leader / verify:9.2f}")
    print(f"{'added at the helper':<44} {helper:8.1f} {helper / verify:9.2f}")
    print()
    per_core = signing_per_core()
    ours = per_core["veil blind_sign"]
    theirs = per_core.get("openssl speed rsa2048 sign")
    against = f", {ours / theirs:.2f} of openssl speed rsa2048's {theirs:,.0f}/s" if theirs else ""
    print(f"blind signatures a second on one core (CPU time): {ours:,.0f}{against}")
    print()
    for clients in args.clients:
        rounds = issuer_rate(args.questions, args.invitations, args.rounds, clients)
        rates = [r for r, _ in rounds]
        ratios = [r / s for r, s in rounds]
        print(
            f"issuer, {args.questions} questions, {clients} concurrent clients:"
            f" {statistics.median(rates):,.0f} invitations/s (min {min(rates):,.0f},"
            f" max {max(rates):,.0f}), {statistics.median(ratios):.2f} of blind signing alone"
            f" in the same rounds ({statistics.median(s for _, s in rounds):,.0f}/s);"
            f" median of {len(rounds)} rounds of {args.invitations}"
        )


if __name__ == "__main__":
    main()
