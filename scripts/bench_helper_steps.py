"""Where the helper's CPU goes: its gRPC method run in this process, without the network.

The helper's logic (`Helper`, on SQLite or a throwaway PostgreSQL) behind
the servicer the server registers (`HelperService`), fed the request bytes
a leader sends (built as `GrpcHelperClient` builds them, with the leader's
verifier shares computed here): each job is parsed, aggregated, answered
and serialised as in the server's worker thread, and timed by this
thread's CPU clock. What the server adds on top (gRPC's transport, the
event loop, the hand-over to the worker thread) is not in these figures;
`bench_workers.py` measures the whole process.

Rounds alternate between measuring one HPKE open (the floor) and running
the jobs, so the ratio printed is to a floor measured at the same time.

    python scripts/bench_helper_steps.py --vdaf count --job-size 500 --reports 6000

With --profile FILE, cProfile's statistics of the jobs of the last round.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench_workers import VDAFS, hpke_open_floor
from tests.support.postgres import postgres_dsn, with_schema
from veil.aggregator.helper import Helper
from veil.aggregator.postgres import PostgresDatastore, PostgresLedgerStore
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.service import HelperService
from veil.aggregator.storage import SqliteDatastore
from veil.client import prepare_reports
from veil.hpke import ROLE_LEADER, generate_keypair, input_share_info, open_
from veil.messages import vdaf_ctx
from veil.messages.wire import ciphertext_to_pb
from veil.protocol.v1 import helper_pb2
from veil.task import DpSpec, new_task
from veil.vdaf.batch.prio3 import BatchPrio3

TP = 3600


class Context:
    """What the servicer reads of a call: the leader's token."""

    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> Any:
        return self.metadata

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def requests(vdaf: str, reports: int, job_size: int, helper: Helper, files: Any) -> list[bytes]:
    """The serialised AggregationJobRequest of each job, as a leader sends it."""
    spec, value = VDAFS[vdaf]
    leader_kp = generate_keypair(7)
    now = int(time.time())
    t = now - now % TP - TP
    built = prepare_reports(
        files.client,
        [value(i) for i in range(reports)],
        leader_kp.config,
        helper.current_config,
        t,
    )
    batch = BatchPrio3(spec.instantiate())
    task_id = files.client.task_id
    out = []
    for start in range(0, reports, job_size):
        chunk = built[start : start + job_size]
        plaintexts = [
            open_(
                leader_kp,
                r.leader_ct,
                input_share_info(ROLE_LEADER, task_id, r.report_id, r.time, r.public_share),
            )
            for r in chunk
        ]
        init = batch.verify_init_batch(
            files.leader.verify_key,
            vdaf_ctx(task_id),
            0,
            [r.report_id for r in chunk],
            [r.public_share for r in chunk],
            plaintexts,
        )
        request = helper_pb2.AggregationJobRequest(
            task_id=task_id, aggregation_job_id=secrets.token_bytes(16)
        )
        for r, share in zip(chunk, init.verifier_shares, strict=True):
            assert share is not None
            v = request.verify_inits.add(leader_verifier_share=share)
            v.report_share.metadata.report_id = r.report_id
            v.report_share.metadata.time = r.time
            v.report_share.public_share = r.public_share
            v.report_share.encrypted_input_share.CopyFrom(ciphertext_to_pb(r.helper_ct))
        out.append(request.SerializeToString())
    return out


def one_round(
    dsn: str | None, vdaf: str, reports: int, job_size: int, profile: cProfile.Profile | None
) -> float:
    """CPU µs per report of the helper's method over `reports` fresh reports."""
    spec, _ = VDAFS[vdaf]
    files = new_task(spec, "127.0.0.1:1", "127.0.0.1:2", min_batch_size=1, dp=DpSpec("none"))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        if dsn is None:
            store: Any = SqliteDatastore(Path(tmp) / "helper.db")
            ledger: Any = str(Path(tmp) / "ledger.db")
        else:
            conninfo = with_schema(dsn, f"bench_helper_{secrets.token_hex(4)}")
            store = PostgresDatastore(conninfo, pool_size=2)
            ledger = PostgresLedgerStore(conninfo)
        stack.callback(store.close)
        helper = Helper(
            {files.helper.task_id: files.helper},
            store,
            PrivacyEngine(ledger, [files.helper], allow_exact_release=True),
        )
        service = HelperService(helper)
        context = Context(files.leader.aggregator_token)
        jobs = requests(vdaf, reports, job_size, helper, files)
        parse = helper_pb2.AggregationJobRequest.FromString
        serialize = helper_pb2.AggregationJobResponse.SerializeToString
        if profile is not None:
            profile.enable()
        began = time.thread_time()
        for raw in jobs:
            response = service.Aggregate(parse(raw), context)
            serialize(response)
        spent = time.thread_time() - began
        if profile is not None:
            profile.disable()
        assert all(r.WhichOneof("result") == "verifier_message" for r in response.verify_resps)
    return spent * 1e6 / reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vdaf", choices=sorted(VDAFS), default="count")
    parser.add_argument("--reports", type=int, default=6000)
    parser.add_argument("--job-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL store")
    parser.add_argument("--dsn", help="an existing PostgreSQL (implies --postgres)")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    args = parser.parse_args()
    with ExitStack() as stack:
        dsn = args.dsn
        if dsn is None and args.postgres:
            dsn = stack.enter_context(postgres_dsn())
        floors, costs = [], []
        profile = cProfile.Profile() if args.profile else None
        for i in range(args.rounds):
            floors.append(hpke_open_floor())
            last = i == args.rounds - 1
            costs.append(
                one_round(dsn, args.vdaf, args.reports, args.job_size, profile if last else None)
            )
            print(f"  round {i + 1}: open {floors[-1]:.1f} µs, helper {costs[-1]:.1f} µs")
        if profile is not None:
            profile.dump_stats(args.profile)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    ratio = statistics.median(c / f for c, f in zip(costs, floors, strict=True))
    print(
        f"{args.vdaf}, jobs of {args.job_size}, {'PostgreSQL' if dsn else 'SQLite'}:"
        f" helper method {statistics.median(costs):.1f} µs per report, HPKE open"
        f" {statistics.median(floors):.1f} µs, ratio {ratio:.2f} (median of {args.rounds})"
    )


if __name__ == "__main__":
    main()
