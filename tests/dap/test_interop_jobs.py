"""veil's aggregator paths against another implementation's: dap-ts (an
independent TypeScript implementation of draft-ietf-ppm-dap-19) was fed the
bytes a veil leader sent its veil helper for a Prio3Count task, and veil's
collection, all recorded in tests/fixtures/dap/veil_jobs.json
(make_veil_jobs.py, then make_veil_jobs.ts under Node). Here, without Node:
veil's helper, given the recorded AggregationJobInitReq again under the
recorded task and keys, answers dap-ts's helper's AggregationJobResp byte for
byte; dap-ts's leader, given the same reports, built veil's leader's
AggregationJobInitReq byte for byte and finished its job on veil's helper's
answer; dap-ts's helper took veil's leader's AggregateShareReq (its report
count and checksum are those of dap-ts's own bucket) and sealed the same
aggregate share veil's helper seals; dap-ts's collector built veil's
CollectionJobReq byte for byte and decrypted veil's collection to the
measurements' count."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.dap_helper import INIT, MAX_BODY, SHARE_REQ, asgi
from veil.aggregator.helper import Helper
from veil.aggregator.privacy import PrivacyEngine
from veil.aggregator.run.dap_helper_http import dap_helper_app
from veil.aggregator.store.records import HpkeKey
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.dap.jobs import (
    AggregateShare,
    AggregateShareReq,
    AggregationJobInitReq,
    AggregationJobResp,
    CollectionJobReq,
    CollectionJobResp,
    VerifyRespType,
)
from veil.dap.shares import open_aggregate_share
from veil.dap.versions import DapVersion, Role
from veil.hpke import HpkeConfig, HpkeKeypair
from veil.task import CollectorTask, HelperTask, LeaderTask, load_task

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "dap" / "veil_jobs.json").read_text()
)
VEIL, DAP_TS = FIXTURE["veil"], FIXTURE["dap_ts"]
V19 = DapVersion.DAP_19


def _exchange(path: str) -> dict[str, str]:
    (found,) = [e for e in VEIL["exchanges"] if e["path"] == path]
    return found


def _task(tmp_path: Path, role: str, kind: type[Any]) -> Any:
    path = tmp_path / f"{role}.toml"
    path.write_text(VEIL["tasks"][role])
    return load_task(path, kind)


class RecordedHelper:
    """A veil helper holding the recorded task, verification key and HPKE
    key, its clock at the recording's, its DAP routes called in process."""

    def __init__(self, tmp_path: Path) -> None:
        self.task: HelperTask = _task(tmp_path, "helper", HelperTask)
        self.leader: LeaderTask = _task(tmp_path, "leader", LeaderTask)
        self.collector: CollectorTask = _task(tmp_path, "collector", CollectorTask)
        self.store = SqliteDatastore(tmp_path / "helper.db")
        private = bytes.fromhex(VEIL["helper_hpke_private_key"])
        spec = VEIL["dap_ts_input"]
        config = HpkeConfig(spec["helper_config_id"], bytes.fromhex(spec["helper_public_key"]))
        assert self.store.add_first_hpke_key(
            HpkeKey(HpkeKeypair(config, private), "active", VEIL["now"])
        )
        self.helper = Helper(
            {self.task.task_id: self.task},
            self.store,
            PrivacyEngine(str(tmp_path / "ledger.db"), [self.task], allow_exact_release=True),
            clock=lambda: VEIL["now"],
        )
        assert self.helper.privacy.pool.wait_ready(60)
        self.app = dap_helper_app(self.helper.dap, MAX_BODY)

    def close(self) -> None:
        self.helper.opener.close()
        self.store.close()

    def post(self, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
        headers = {
            "authorization": f"Bearer {self.leader.aggregator_token}",
            "content-type": content_type,
        }
        status, _, answer = asyncio.run(
            asgi(self.app, "POST", f"/tasks/{self.task.id_text}/{path}", body, headers)
        )
        return status, answer

    def open_share(self, body: bytes) -> bytes:
        return open_aggregate_share(
            V19,
            self.collector.collector_hpke_keypair,
            Role.HELPER,
            self.task.task_id,
            self.task.dap_configuration(),
            CollectionJobReq.decode(bytes.fromhex(VEIL["collection_job_req"])),
            AggregateShare.decode(body).encrypted_aggregate_share,
        )


@pytest.fixture
def recorded(tmp_path: Path) -> Any:
    helper = RecordedHelper(tmp_path)
    yield helper
    helper.close()


def test_the_fixture_is_what_dap_ts_answered() -> None:
    assert FIXTURE["dap_ts_commit"].startswith("a3412ee")
    # dap-ts built the task's configuration from its parameters: veil's bytes.
    assert DAP_TS["task_configuration"] == VEIL["task_configuration"]
    # Every report veil's leader sent was accepted by dap-ts's helper.
    init = AggregationJobInitReq.decode(bytes.fromhex(_exchange("aggregation_jobs")["request"]))
    ids = [vi.report_share.metadata.report_id for vi in init.verify_inits]
    assert len(ids) == len(VEIL["measurements"]) == len(DAP_TS["reports"])
    assert all(r["error"] is None for r in DAP_TS["reports"])


def test_veils_helper_answers_the_job_as_dap_ts_does(recorded: RecordedHelper) -> None:
    exchange = _exchange("aggregation_jobs")
    assert exchange["content_type"] == INIT
    body = bytes.fromhex(exchange["request"])
    status, answer = recorded.post("aggregation_jobs", body, INIT)
    assert status == 200, answer
    # The recorded answer is veil's helper's of the time, and today's is the
    # same: byte for byte what dap-ts's helper answered (Count's verifier
    # message is empty, the answer has no randomness).
    assert answer.hex() == exchange["response"] == DAP_TS["aggregation_job_resp"]
    resps = AggregationJobResp.decode(answer, V19).verify_resps
    assert [r.type for r in resps] == [VerifyRespType.CONTINUE] * len(resps)


def test_dap_ts_takes_veils_aggregate_share_request(recorded: RecordedHelper) -> None:
    request = AggregateShareReq.decode(bytes.fromhex(_exchange("aggregate_shares")["request"]))
    # dap-ts's bucket: share (8) || report count (8) || checksum (32) || times.
    bucket = bytes.fromhex(DAP_TS["bucket"])
    assert request.report_count == int.from_bytes(bucket[8:16], "big") == len(VEIL["measurements"])
    assert request.checksum == bucket[16:48]
    # Both helpers seal the same aggregate share: veil's today, from the
    # recorded job, and dap-ts's, opened with veil's collector code.
    status, _ = recorded.post(
        "aggregation_jobs", bytes.fromhex(_exchange("aggregation_jobs")["request"]), INIT
    )
    assert status == 200
    status, answer = recorded.post(
        "aggregate_shares", bytes.fromhex(_exchange("aggregate_shares")["request"]), SHARE_REQ
    )
    assert status == 200, answer
    veils = recorded.open_share(answer)
    assert veils == recorded.open_share(bytes.fromhex(_exchange("aggregate_shares")["response"]))
    assert recorded.open_share(bytes.fromhex(DAP_TS["aggregate_share"])) == veils == bucket[:8]


def test_dap_ts_collects_veils_collection() -> None:
    # dap-ts's collector encodes the same query as veil's collector sent,
    # and the leader's and helper's shares of veil's answer open under it.
    assert DAP_TS["collection_job_req"] == VEIL["collection_job_req"]
    resp = CollectionJobResp.decode(bytes.fromhex(VEIL["collection_job_resp"]))
    assert DAP_TS["collected"] == {
        "count": sum(VEIL["measurements"]),
        "report_count": resp.report_count,
        "start": resp.interval.start,
        "duration": resp.interval.duration,
    }


def test_dap_ts_leader_builds_veils_job_and_finishes_on_veils_answer(
    recorded: RecordedHelper,
) -> None:
    exchange = _exchange("aggregation_jobs")
    # dap-ts's leader, given the uploaded reports in the job's order, sends
    # what veil's leader sent: the same verifier shares, the same encoding.
    assert DAP_TS["leader_rejected"] == []
    assert DAP_TS["leader_request"] == exchange["request"]
    # veil's helper answers dap-ts's leader's request with the answer dap-ts's
    # leader finished on: every report continued, an output share each.
    status, answer = recorded.post(
        "aggregation_jobs", bytes.fromhex(DAP_TS["leader_request"]), INIT
    )
    assert status == 200 and answer.hex() == exchange["response"]
    finished = DAP_TS["leader_finished"]
    assert [f["error"] for f in finished] == [None] * len(VEIL["measurements"])
    # dap-ts's leader's output shares and veil's helper's aggregate share of
    # the same reports sum to the measurements' count.
    status, share = recorded.post(
        "aggregate_shares", bytes.fromhex(_exchange("aggregate_shares")["request"]), SHARE_REQ
    )
    assert status == 200, share
    p = 2**64 - 2**32 + 1
    leader = sum(int.from_bytes(bytes.fromhex(f["output_share"]), "little") for f in finished)
    helper = int.from_bytes(recorded.open_share(share), "little")
    assert (leader + helper) % p == sum(VEIL["measurements"])
