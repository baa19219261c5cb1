"""What invitations cost (scripts/bench_invite.py prints the tables).

- At an aggregator, per report: the leader's `check_token` with the
  report's redemption context (hashing the report's shares) and the
  helper's `helper_token_valid` (the same from its job item: decode, the
  challenge's hashes, constant-time compares, one RSA-2048 PSS
  verification), against one bare RSA-2048 verification measured in the
  same run; all as CPU time (time.process_time), medians of rounds.
- One blind signature (`Signer.blind_sign`: the private operation and its
  check) as CPU time, against `openssl speed rsa2048`'s sign rate on one
  core measured in the same run (the bare private operation in C).
- At the issuer: invitations redeemed per second for a survey of Q questions
  (one blind signature per question, the group commit of the burns) with C
  concurrent clients, against the same blind signatures alone in the same
  round (the ceiling: what the issuer adds is its reads and commits).
"""

from __future__ import annotations

import re
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from veil.aggregator.core import VerifyInitItem, check_token, helper_token_valid
from veil.client.prepare import prepare_reports
from veil.hpke import generate_keypair
from veil.invite import blindrsa
from veil.invite.issuer import Issuer, mint, write_keys
from veil.invite.token import PendingToken, public_key_bytes, report_context
from veil.task import DpSpec, VdafSpec, new_task


def _cpu_us(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Median over `rounds` of the CPU µs per call of `fn` (n calls a round)."""
    runs = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        runs.append((time.process_time() - start) / n * 1e6)
    return statistics.median(runs)


def aggregator_costs(n: int = 2000, rounds: int = 7) -> dict[str, float]:
    """CPU µs per report of each token step and of one bare verification."""
    sk = blindrsa.generate_key()
    der = public_key_bytes(sk.public_key())
    files = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1,
        dp=DpSpec("none"), issuer_public_key=der,
    )  # fmt: skip
    task = files.helper
    kp = generate_keypair(1)
    (report,) = prepare_reports(
        files.client, [1], kp.config, kp.config, int(time.time()), invited=True
    )
    context = report_context(task.task_id, report)
    pending = PendingToken.start(der, context)
    token = pending.finish(blindrsa.Signer(sk).blind_sign(pending.blinded_msg))
    item = VerifyInitItem(
        report.report_id,
        report.time,
        report.public_share,
        report.helper_ct,
        b"",
        b"",
        token,
        report.leader_share_digest,
    )
    assert helper_token_valid(task, item)
    prepared = blindrsa.prepare(b"x" * 66)
    sig = blindrsa.finalize(
        sk.public_key(), prepared, blindrsa.Signer(sk).blind_sign(
            (b := blindrsa.blind(sk.public_key(), prepared)).blinded_msg
        ), b.inv,
    )  # fmt: skip
    pk = sk.public_key()
    tokened = replace(report, token=token)
    return {
        "rsa-2048 verify": _cpu_us(lambda: blindrsa.verify(pk, prepared, sig), n, rounds),
        "leader check_token": _cpu_us(
            lambda: check_token(
                task, tokened.token, report_context(task.task_id, tokened), "report"
            ),
            n,
            rounds,
        ),
        "helper token check": _cpu_us(lambda: helper_token_valid(task, item), n, rounds),
    }


def signing_per_core(n: int = 500, rounds: int = 5) -> dict[str, float]:
    """Blind signatures a second on one core (CPU time, median of rounds),
    and `openssl speed rsa2048`'s RSA-2048 signs a second (absent where no
    openssl command is found)."""
    signer = blindrsa.Signer(blindrsa.generate_key())
    n_mod = signer.public_key.public_numbers().n
    messages = [(secrets.randbelow(n_mod)).to_bytes(blindrsa.K_LEN, "big") for _ in range(n)]
    it = iter(messages * rounds)
    out = {"veil blind_sign": 1e6 / _cpu_us(lambda: signer.blind_sign(next(it)), n, rounds)}
    openssl = shutil.which("openssl")
    if openssl is not None:
        done = subprocess.run(
            [openssl, "speed", "-seconds", "3", "rsa2048"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        match = re.search(r"^rsa 2048 bits\s+\S+s\s+\S+s\s+([\d.]+)", done.stdout, re.M)
        if match:
            out["openssl speed rsa2048 sign"] = float(match.group(1))
    return out


def issuer_rate(
    questions: int, invitations: int = 300, rounds: int = 3, clients: int = 8
) -> list[tuple[float, float]]:
    """Per round: (invitations redeemed per second, invitations' worth of
    blind signatures alone per second), both wall clock with `clients`
    threads at once (the HTTP endpoint's thread pool), measured one after
    the other in the round: redemptions first in even rounds, signatures
    first in odd ones, each after `clients` of its kind untimed (the pool's
    threads started, each thread's database connection open)."""
    keys = [blindrsa.generate_key() for _ in range(questions)]
    pubs = [public_key_bytes(k.public_key()) for k in keys]
    signers = [blindrsa.Signer(k) for k in keys]

    def sign_only(req: list[bytes]) -> list[bytes]:
        return [s.blind_sign(b) for s, b in zip(signers, req, strict=True)]

    out = []
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            write_keys(d, keys)
            codes = mint(d, clients + invitations)
            issuer = Issuer(d)
            requests = [
                [PendingToken.start(p, secrets.token_bytes(32)).blinded_msg for p in pubs]
                for _ in codes
            ]
            w = clients  # the untimed ones
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(issuer.redeem, codes[:w], requests[:w]))
                list(pool.map(sign_only, requests[:w]))
                timed: dict[str, tuple[Callable[..., object], tuple[list[Any], ...]]] = {
                    "redeem": (issuer.redeem, (codes[w:], requests[w:])),
                    "sign": (sign_only, (requests[w:],)),
                }
                rates = {}
                for name in ("redeem", "sign") if round_ % 2 == 0 else ("sign", "redeem"):
                    fn, args = timed[name]
                    start = time.perf_counter()
                    list(pool.map(fn, *args))
                    rates[name] = invitations / (time.perf_counter() - start)
            out.append((rates["redeem"], rates["sign"]))
    return out
