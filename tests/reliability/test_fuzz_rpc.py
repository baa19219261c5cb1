"""Fuzzing every RPC handler of a real leader and helper (separate processes).

Requests are random bytes, mutations of valid serialized requests, and
structured requests whose fields are drawn from valid, edge and random
values, with and without the right bearer token. For every call:

- the answer is OK or one of the documented statuses (docs/CLIENT.md, "Errors");
  bytes that are not the method's message are INVALID_ARGUMENT from veil's
  own parsing, naming the method, and INTERNAL is never an answer;
- a refused call changes nothing in the server's database;
- an accepted call changes only what it acknowledges (an upload stores
  exactly `accepted` reports; a helper job adds exactly the reports it
  answered with a verifier message);
- the servers stay up and log no internal error.

The task's min_batch_size is out of reach and the leader's driver idles, so
no collection or aggregation can start behind the fuzzer's back. Short mode
runs a few thousand cases; long mode (VEIL_TEST_LONG=1) over 100,000.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.deployment import Deployment
from tests.support.modes import LONG
from tests.support.mutate import mutate, mutations
from tests.support.reliability import (
    DOCUMENTED,
    TP,
    bucket,
    leader_verify_init_item,
    record,
    state_digest,
)
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.leader.helper_client import aggregation_job_request
from veil.hpke import Ciphertext
from veil.local.launcher import LocalDeployment
from veil.protocol.v1 import helper_pb2, leader_pb2, messages_pb2
from veil.task import DpSpec, VdafSpec

pytestmark = [pytest.mark.slow, pytest.mark.fuzz]

# Long mode: 42,000 byte-level cases over all seven methods, 15,000 structured
# cases for each of the four request families, 1,400 wrong-token calls.
RAW_EXAMPLES = 42_000 if LONG else 300
STRUCTURED_EXAMPLES = 15_000 if LONG else 200


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


RAW = _settings(RAW_EXAMPLES)
FUZZ = _settings(STRUCTURED_EXAMPLES)
# veil's answer to request bytes that do not parse as the method's message.
_UNPARSEABLE = "malformed {method} request: "

METHODS = {
    "leader": [
        "GetHpkeConfig",
        "UploadReports",
        "CreateCollection",
        "GetCollection",
        "GetTaskInfo",
    ],
    "helper": ["GetHpkeConfig", "Aggregate", "GetAggregateShare"],
}
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tasks: dict[str, tuple[VdafSpec, DpSpec, dict[str, Any]]] = {
        "fuzz": (VdafSpec("sum", max_measurement=10), DpSpec("none"), {"min_batch_size": 10**9}),
    }
    root = Path(tmp_path_factory.mktemp("fuzz"))
    # No driver and no garbage collection: the databases change only through
    # the fuzzer's calls (a driver pass aggregating accepted fuzz uploads, or
    # GC dropping the helper's records of malformed jobs, would change them
    # under the oracle's feet; GC has its own tests).
    local = LocalDeployment.start(
        root, tasks, extra_config={"driver": {"enabled": False}, "gc": {"interval": 0}}
    )
    d = Deployment(local)
    try:
        yield d
        for server in (d.leader, d.helper):
            assert server.proc is not None and server.proc.poll() is None, "server died"
        for role in ("leader", "helper"):
            log = (root / f"{role}.log").read_text()
            assert "internal error" not in log and "Traceback" not in log, log[-3000:]
        record("fuzz_rpc", cases=dict(CASES), total=sum(CASES.values()))
    finally:
        d.stop()


def _connect(db: Path) -> sqlite3.Connection:
    # Autocommit: each SELECT reads the latest committed state.
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30, isolation_level=None)


def _light(conn: sqlite3.Connection) -> tuple[Any, ...]:
    """Row counts and the sums that count: cheap enough to take on every call."""
    tables = [
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1")
    ]
    counts = tuple(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)
    sums = conn.execute(
        "SELECT (SELECT TOTAL(count) FROM rejections),"
        " (SELECT TOTAL(report_count) FROM batch_aggregates),"
        " (SELECT COUNT(*) FROM batch_aggregates WHERE collected_by IS NOT NULL)"
    ).fetchone()
    return (*counts, *sums)


def _reports(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0])


def _helper_total(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT TOTAL(report_count) FROM batch_aggregates").fetchone()[0])


def _call(
    channel: grpc.Channel, service: str, method: str, payload: bytes, metadata: Any
) -> tuple[grpc.StatusCode, bytes | str]:
    call = channel.unary_unary(f"/veil.protocol.v1.{service}/{method}")
    try:
        return grpc.StatusCode.OK, call(payload, metadata=metadata, timeout=30)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""


def _check_refusal(code: grpc.StatusCode, details: Any, method: str, raw: bool) -> None:
    assert code in DOCUMENTED, (code, details)
    if details.startswith(_UNPARSEABLE.format(method=method)):
        # Only bytes can fail to parse; they are refused by veil, not gRPC.
        assert raw and code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)


class Env:
    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.task = dep.tasks["fuzz"]
        self.task_id = self.task.client.task_id
        self.client = dep.client("fuzz")
        self.t = bucket(2)
        self.leader_db = dep.local.root / "leader.db"
        self.helper_db = dep.local.root / "helper.db"
        self.conns = {"leader": _connect(self.leader_db), "helper": _connect(self.helper_db)}
        self.channels = {
            "leader": grpc.insecure_channel(dep.leader.address),
            "helper": grpc.insecure_channel(dep.helper.address),
        }
        self.tokens = {
            "leader": f"Bearer {self.task.collector.collector_token}",
            "helper": f"Bearer {self.task.leader.aggregator_token}",
        }
        report = self.client.build_report(3, self.t)
        upload = leader_pb2.UploadRequest(task_id=self.task_id)
        pb = upload.reports.add(public_share=report.public_share)
        pb.metadata.report_id = report.report_id
        pb.metadata.time = report.time
        for field, ct in (
            (pb.leader_encrypted_input_share, report.leader_ct),
            (pb.helper_encrypted_input_share, report.helper_ct),
        ):
            field.config_id, field.enc, field.payload = ct.config_id, ct.enc, ct.payload
        self.report = report
        # Aggregation jobs the helper ran, with its answer.
        self.answered_jobs: dict[tuple[bytes, bytes], helper_pb2.AggregationJobResponse] = {}
        self.item = leader_verify_init_item(dep, "fuzz", self.t, 2)
        job = aggregation_job_request(self.task_id, secrets.token_bytes(16), [self.item])
        interval = messages_pb2.Interval(start=self.t, duration=TP)
        self.valid: dict[tuple[str, str], bytes] = {
            ("leader", "GetHpkeConfig"): messages_pb2.HpkeConfigRequest(
                task_id=self.task_id
            ).SerializeToString(),
            ("helper", "GetHpkeConfig"): messages_pb2.HpkeConfigRequest(
                task_id=self.task_id
            ).SerializeToString(),
            ("leader", "UploadReports"): upload.SerializeToString(),
            ("leader", "CreateCollection"): leader_pb2.CreateCollectionRequest(
                task_id=self.task_id, collection_job_id=bytes(16), batch_interval=interval
            ).SerializeToString(),
            ("leader", "GetCollection"): leader_pb2.GetCollectionRequest(
                task_id=self.task_id, collection_job_id=bytes(16)
            ).SerializeToString(),
            ("leader", "GetTaskInfo"): leader_pb2.TaskInfoRequest(
                task_id=self.task_id
            ).SerializeToString(),
            ("helper", "Aggregate"): job.SerializeToString(),
            ("helper", "GetAggregateShare"): helper_pb2.AggregateShareRequest(
                task_id=self.task_id,
                collection_job_id=bytes(16),
                batch_interval=interval,
                report_count=0,
                checksum=bytes(32),
            ).SerializeToString(),
        }

    def close(self) -> None:
        for c in self.channels.values():
            c.close()
        for conn in self.conns.values():
            conn.close()

    def db(self, role: str) -> Path:
        return self.leader_db if role == "leader" else self.helper_db

    def send(self, role: str, method: str, payload: bytes, authorized: bool, raw: bool) -> None:
        """One call and its oracle."""
        metadata = (("authorization", self.tokens[role]),) if authorized else ()
        service = "Leader" if role == "leader" else "Helper"
        db = self.conns[role]
        before = _light(db)
        stored = _reports(self.conns["leader"])
        aggregated = _helper_total(self.conns["helper"])
        code, answer = _call(self.channels[role], service, method, payload, metadata)
        CASES[f"{role}.{method}{'' if raw else ' (structured)'}"] += 1
        if code != grpc.StatusCode.OK:
            _check_refusal(code, answer, method, raw)
            assert _light(db) == before, (role, method, code, answer)
            return
        assert isinstance(answer, bytes)
        if method == "UploadReports":
            request = leader_pb2.UploadRequest.FromString(payload)
            reply = leader_pb2.UploadResponse.FromString(answer)
            assert reply.accepted + reply.duplicates == len(request.reports)
            assert _reports(self.conns["leader"]) == stored + reply.accepted
        elif method == "Aggregate":
            request = helper_pb2.AggregationJobRequest.FromString(payload)
            reply = helper_pb2.AggregationJobResponse.FromString(answer)
            assert len(reply.verify_resps) == len(request.verify_inits)
            job = (request.task_id, request.aggregation_job_id)
            earlier = self.answered_jobs.get(job)
            # helper_time_ms is the helper's clock at each answer: the same
            # job answered again differs in it and in nothing else.
            if earlier is not None and list(earlier.verify_resps) == list(reply.verify_resps):
                # The same job again (a mutation can undo itself): the helper's
                # stored answer, and nothing added.
                assert _helper_total(self.conns["helper"]) == aggregated
                return
            # Without GC the helper never forgets a job: its id again with other
            # content is refused (ALREADY_EXISTS), never answered anew.
            assert earlier is None, (earlier, reply)
            self.answered_jobs[job] = reply
            ok = 0
            for r in reply.verify_resps:
                if r.WhichOneof("result") == "verifier_message":
                    ok += 1
                else:
                    assert r.reject != helper_pb2.REPORT_ERROR_UNSPECIFIED
            assert _helper_total(self.conns["helper"]) == aggregated + ok
        else:
            # Configs and collection polls are reads.
            assert method in ("GetHpkeConfig", "GetCollection", "GetTaskInfo"), method
            assert _light(db) == before, (role, method)


@pytest.fixture(scope="module")
def env(dep: Deployment) -> Iterator[Env]:
    e = Env(dep)
    try:
        yield e
    finally:
        e.close()


ALL_METHODS = [(role, m) for role, ms in METHODS.items() for m in ms]


@RAW
@given(
    target=st.sampled_from(ALL_METHODS),
    how=st.sampled_from(["random", "mutated"]),
    data=st.data(),
    authorized=st.booleans(),
)
def test_random_and_mutated_bytes(
    env: Env, target: tuple[str, str], how: str, data: st.DataObject, authorized: bool
) -> None:
    role, method = target
    good = env.valid[target]
    if how == "random":
        payload = data.draw(st.binary(max_size=2 * len(good) + 16))
    else:
        payload = mutate(good, data.draw(mutations))
    env.send(role, method, payload, authorized, raw=True)


def _bytes(valid: bytes, size: int | None = None) -> st.SearchStrategy[bytes]:
    n = len(valid) if size is None else size
    return st.one_of(
        st.just(valid),
        st.binary(min_size=n, max_size=n),
        st.binary(max_size=2 * n + 8),
        mutations.map(lambda ops: mutate(valid, ops)),
    )


def _ints(valid: int, bits: int = 64) -> st.SearchStrategy[int]:
    return st.one_of(
        st.just(valid),
        st.sampled_from([0, 1, valid + 1, valid - 1, valid + TP, 2**bits - 1]).filter(
            lambda v: 0 <= v < 2**bits
        ),
        st.integers(0, 2**bits - 1),
    )


@FUZZ
@given(data=st.data(), authorized=st.booleans())
def test_structured_uploads(env: Env, data: st.DataObject, authorized: bool) -> None:
    r = env.report
    request = leader_pb2.UploadRequest(task_id=data.draw(_bytes(env.task_id)))
    for _ in range(data.draw(st.integers(0, 3))):
        pb = request.reports.add(public_share=data.draw(_bytes(r.public_share)))
        fresh = data.draw(st.booleans())
        pb.metadata.report_id = secrets.token_bytes(16) if fresh else data.draw(_bytes(r.report_id))
        pb.metadata.time = data.draw(_ints(r.time))
        for field, ct in (
            (pb.leader_encrypted_input_share, r.leader_ct),
            (pb.helper_encrypted_input_share, r.helper_ct),
        ):
            field.config_id = data.draw(_ints(ct.config_id, 32))
            field.enc = data.draw(_bytes(ct.enc))
            field.payload = data.draw(_bytes(ct.payload))
    env.send("leader", "UploadReports", request.SerializeToString(), authorized, raw=False)


@FUZZ
@given(data=st.data(), authorized=st.booleans(), create=st.booleans())
def test_structured_collections(
    env: Env, data: st.DataObject, authorized: bool, create: bool
) -> None:
    task_id = data.draw(_bytes(env.task_id))
    job_id = data.draw(_bytes(bytes(16)))
    if create:
        request: Any = leader_pb2.CreateCollectionRequest(
            task_id=task_id,
            collection_job_id=job_id,
            batch_interval=messages_pb2.Interval(
                start=data.draw(_ints(env.t)), duration=data.draw(_ints(TP))
            ),
        )
    else:
        request = leader_pb2.GetCollectionRequest(task_id=task_id, collection_job_id=job_id)
    method = "CreateCollection" if create else "GetCollection"
    env.send("leader", method, request.SerializeToString(), authorized, raw=False)


@FUZZ
@given(data=st.data(), authorized=st.booleans())
def test_structured_aggregation_jobs(env: Env, data: st.DataObject, authorized: bool) -> None:
    # Each field of each report drawn from the honest item's value, edge
    # values and random ones, then put on the wire as the leader puts it.
    item = env.item
    ct = item.encrypted_input_share
    items = [
        VerifyInitItem(
            data.draw(st.one_of(st.just(secrets.token_bytes(16)), _bytes(item.report_id))),
            data.draw(_ints(item.time)),
            data.draw(_bytes(item.public_share)),
            Ciphertext(
                data.draw(_ints(ct.config_id, 32)),
                data.draw(_bytes(ct.enc)),
                data.draw(_bytes(ct.payload)),
            ),
            data.draw(_bytes(item.leader_verifier_share)),
        )
        for _ in range(data.draw(st.integers(0, 3)))
    ]
    request = aggregation_job_request(
        data.draw(_bytes(env.task_id)), data.draw(_bytes(secrets.token_bytes(16))), items
    )
    env.send("helper", "Aggregate", request.SerializeToString(), authorized, raw=False)


@FUZZ
@given(data=st.data(), authorized=st.booleans())
def test_structured_aggregate_share_requests(
    env: Env, data: st.DataObject, authorized: bool
) -> None:
    request = helper_pb2.AggregateShareRequest(
        task_id=data.draw(_bytes(env.task_id)),
        collection_job_id=data.draw(_bytes(bytes(16))),
        batch_interval=messages_pb2.Interval(
            start=data.draw(_ints(env.t)), duration=data.draw(_ints(TP))
        ),
        report_count=data.draw(_ints(0)),
        checksum=data.draw(_bytes(bytes(32))),
    )
    env.send("helper", "GetAggregateShare", request.SerializeToString(), authorized, raw=False)


def test_refusals_changed_nothing_at_all(env: Env) -> None:
    """The per-call oracle compares row counts and sums; here the whole
    database, before and after a burst of refused calls, byte for byte."""
    before = {role: state_digest(env.db(role)) for role in ("leader", "helper")}
    for _ in range(200 if LONG else 50):
        for role, method in ALL_METHODS:
            payload = mutate(env.valid[(role, method)], [(1, secrets.randbelow(64), 0)])
            # Wrong token: every call that reaches the logic is refused.
            code, _ = _call(
                env.channels[role],
                "Leader" if role == "leader" else "Helper",
                method,
                payload,
                (("authorization", "Bearer " + secrets.token_urlsafe(16)),),
            )
            CASES["wrong token, truncated request"] += 1
            if method != "GetHpkeConfig":
                assert code != grpc.StatusCode.OK
    assert {role: state_digest(env.db(role)) for role in ("leader", "helper")} == before
