"""veil's aggregator paths against another implementation's: dap-ts (an
independent TypeScript implementation of draft-ietf-ppm-dap-19) was fed the
bytes a veil leader sent its veil helper for a Prio3Count, a Prio3Sum and
a Prio3Histogram task, and veil's collection, all recorded in
tests/fixtures/dap/veil_jobs.json (make_veil_jobs.py, then make_veil_jobs.ts
under Node). Here, without Node: veil's helper, given the recorded
AggregationJobInitReq again under the recorded task and keys, answers dap-ts's
helper's AggregationJobResp byte for byte; dap-ts's leader, given the same
reports, built veil's leader's AggregationJobInitReq byte for byte and
finished its job on veil's helper's answer; dap-ts's helper took veil's
leader's AggregateShareReq (its report count and checksum are those of
dap-ts's own bucket) and sealed the same aggregate share veil's helper seals;
dap-ts's collector built veil's CollectionJobReq byte for byte and decrypted
veil's Count collection to the measurements' count; dap-ts's leader asked
veil's helper for the batch's share with veil's leader's AggregateShareReq,
byte for byte, and its CollectionJobResp opens with veil's collector code."""

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
JOBS: dict[str, dict[str, Any]] = FIXTURE["jobs"]
V19 = DapVersion.DAP_19


def _exchange(job: dict[str, Any], path: str) -> dict[str, str]:
    (found,) = [e for e in job["veil"]["exchanges"] if e["path"] == path]
    return found


def _load(tmp_path: Path, job: dict[str, Any], role: str, kind: type[Any]) -> Any:
    """`role`'s recorded task, read from its file's text."""
    path = tmp_path / f"{role}.toml"
    path.write_text(job["veil"]["tasks"][role])
    return load_task(path, kind)


class RecordedHelper:
    """A veil helper holding a recorded task, verification key and HPKE key,
    its clock at the recording's, its DAP routes called in process."""

    def __init__(self, tmp_path: Path, job: dict[str, Any]) -> None:
        veil = job["veil"]
        self.job = job
        self.task: HelperTask = self._task(tmp_path, "helper", HelperTask)
        self.leader: LeaderTask = self._task(tmp_path, "leader", LeaderTask)
        self.collector: CollectorTask = self._task(tmp_path, "collector", CollectorTask)
        self.vdaf = self.task.vdaf.instantiate()
        self.store = SqliteDatastore(tmp_path / "helper.db")
        spec = veil["dap_ts_input"]
        config = HpkeConfig(spec["helper_config_id"], bytes.fromhex(spec["helper_public_key"]))
        private = bytes.fromhex(veil["helper_hpke_private_key"])
        assert self.store.add_first_hpke_key(
            HpkeKey(HpkeKeypair(config, private), "active", veil["now"])
        )
        self.helper = Helper(
            {self.task.task_id: self.task},
            self.store,
            PrivacyEngine(str(tmp_path / "ledger.db"), [self.task], allow_exact_release=True),
            clock=lambda: veil["now"],
        )
        assert self.helper.privacy.pool.wait_ready(60)
        self.app = dap_helper_app(self.helper.dap, MAX_BODY)

    def _task(self, tmp_path: Path, role: str, kind: type[Any]) -> Any:
        return _load(tmp_path, self.job, role, kind)

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
            CollectionJobReq.decode(bytes.fromhex(self.job["veil"]["collection_job_req"])),
            AggregateShare.decode(body).encrypted_aggregate_share,
        )

    def expected(self) -> Any:
        """The aggregate of the recorded measurements."""
        measurements = self.job["veil"]["measurements"]
        if self.task.vdaf.type in ("count", "sum"):
            return sum(measurements)
        return [measurements.count(i) for i in range(self.task.vdaf.params["length"])]


@pytest.fixture(params=sorted(JOBS))
def recorded(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    helper = RecordedHelper(tmp_path, JOBS[request.param])
    yield helper
    helper.close()


def test_the_fixture_is_what_dap_ts_answered() -> None:
    assert FIXTURE["dap_ts_commit"].startswith("a3412ee")
    assert sorted(JOBS) == ["count", "histogram", "sum"]
    for job in JOBS.values():
        veil, dap_ts = job["veil"], job["dap_ts"]
        # dap-ts built the task's configuration from its parameters: veil's bytes.
        assert dap_ts["task_configuration"] == veil["task_configuration"]
        # Every report veil's leader sent was accepted by dap-ts's helper.
        init = AggregationJobInitReq.decode(
            bytes.fromhex(_exchange(job, "aggregation_jobs")["request"])
        )
        assert len(init.verify_inits) == len(veil["measurements"]) == len(dap_ts["reports"])
        assert all(r["error"] is None for r in dap_ts["reports"])


def test_veils_helper_answers_the_job_as_dap_ts_does(recorded: RecordedHelper) -> None:
    exchange = _exchange(recorded.job, "aggregation_jobs")
    assert exchange["content_type"] == INIT
    status, answer = recorded.post("aggregation_jobs", bytes.fromhex(exchange["request"]), INIT)
    assert status == 200, answer
    # The recorded answer is veil's helper's of the time, and today's is the
    # same: byte for byte what dap-ts's helper answered (nothing in it is
    # drawn at random: Count's verifier message is empty, Histogram's the
    # joint randomness seed both derive).
    assert answer.hex() == exchange["response"] == recorded.job["dap_ts"]["aggregation_job_resp"]
    resps = AggregationJobResp.decode(answer, V19).verify_resps
    assert [r.type for r in resps] == [VerifyRespType.CONTINUE] * len(resps)


def test_dap_ts_leader_builds_veils_job_and_finishes_on_veils_answer(
    recorded: RecordedHelper,
) -> None:
    dap_ts = recorded.job["dap_ts"]
    exchange = _exchange(recorded.job, "aggregation_jobs")
    # dap-ts's leader, given the uploaded reports in the job's order, sends
    # what veil's leader sent: the same verifier shares, the same encoding.
    assert dap_ts["leader_rejected"] == []
    assert dap_ts["leader_request"] == exchange["request"]
    # veil's helper answers dap-ts's leader's request with the answer dap-ts's
    # leader finished on: every report continued, an output share each.
    status, answer = recorded.post(
        "aggregation_jobs", bytes.fromhex(dap_ts["leader_request"]), INIT
    )
    assert status == 200 and answer.hex() == exchange["response"]
    finished = dap_ts["leader_finished"]
    assert [f["error"] for f in finished] == [None] * len(recorded.job["veil"]["measurements"])
    # dap-ts's leader's output shares and veil's helper's aggregate share of
    # the same reports unshard to the measurements' aggregate.
    request = bytes.fromhex(_exchange(recorded.job, "aggregate_shares")["request"])
    status, share = recorded.post("aggregate_shares", request, SHARE_REQ)
    assert status == 200, share
    vdaf = recorded.vdaf
    leader = vdaf.merge(
        None, [vdaf.decode_agg_share(None, bytes.fromhex(f["output_share"])) for f in finished]
    )
    helper = vdaf.decode_agg_share(None, recorded.open_share(share))
    assert vdaf.unshard(None, [leader, helper], len(finished)) == recorded.expected()


def test_dap_ts_takes_veils_aggregate_share_request(recorded: RecordedHelper) -> None:
    dap_ts = recorded.job["dap_ts"]
    exchange = _exchange(recorded.job, "aggregate_shares")
    request = AggregateShareReq.decode(bytes.fromhex(exchange["request"]))
    # dap-ts's bucket: share || report count (8) || checksum (32) || times.
    bucket = bytes.fromhex(dap_ts["bucket"])
    share, count, checksum = bucket[:-56], bucket[-56:-48], bucket[-48:-16]
    assert request.report_count == int.from_bytes(count, "big") == 4
    assert request.checksum == checksum
    # Both helpers seal the same aggregate share: veil's today, from the
    # recorded job, and dap-ts's, opened with veil's collector code.
    init = bytes.fromhex(_exchange(recorded.job, "aggregation_jobs")["request"])
    assert recorded.post("aggregation_jobs", init, INIT)[0] == 200
    status, answer = recorded.post(
        "aggregate_shares", bytes.fromhex(exchange["request"]), SHARE_REQ
    )
    assert status == 200, answer
    veils = recorded.open_share(answer)
    assert veils == recorded.open_share(bytes.fromhex(exchange["response"]))
    assert recorded.open_share(bytes.fromhex(dap_ts["aggregate_share"])) == veils == share


def test_dap_ts_collects_veils_count_collection() -> None:
    veil, dap_ts = JOBS["count"]["veil"], JOBS["count"]["dap_ts"]
    # dap-ts's collector encodes the same query as veil's collector sent,
    # and the leader's and helper's shares of veil's answer open under it.
    assert dap_ts["collection_job_req"] == veil["collection_job_req"]
    resp = CollectionJobResp.decode(bytes.fromhex(veil["collection_job_resp"]))
    assert dap_ts["collected"] == {
        "count": sum(veil["measurements"]),
        "report_count": resp.report_count,
        "start": resp.interval.start,
        "duration": resp.interval.duration,
    }


@pytest.mark.parametrize("recorded", ["count"], indirect=True)
def test_refused_reports_answered_as_dap_ts_does(recorded: RecordedHelper) -> None:
    # A job of veil's leader altered on its way (make_veil_jobs.py's
    # `tampered`): a flipped helper ciphertext, an unknown config id, a
    # flipped leader verifier share, a time a day ahead.
    refused, dap_ts = recorded.job["veil"]["refused_job"], recorded.job["dap_ts"]
    assert [r["error"] for r in dap_ts["refused_reports"]] == [
        "hpke-decrypt-error",
        "hpke-unknown-config-id",
        "vdaf-verify-error",
        "report-too-early",
    ]
    status, answer = recorded.post("aggregation_jobs", bytes.fromhex(refused["request"]), INIT)
    assert status == 200, answer
    # The same refusals with the same codes, byte for byte.
    assert answer.hex() == refused["response"] == dap_ts["refused_job_resp"]
    resps = AggregationJobResp.decode(answer, V19).verify_resps
    assert [r.type for r in resps] == [VerifyRespType.REJECT] * 4


def test_dap_ts_leader_collects_from_veils_helper(tmp_path: Path) -> None:
    veil, dap_ts = JOBS["count"]["veil"], JOBS["count"]["dap_ts"]
    # dap-ts's leader, from its own bucket of the output shares it finished,
    # asks veil's helper for the batch's share with veil's leader's bytes.
    assert (
        dap_ts["leader_aggregate_share_req"]
        == _exchange(JOBS["count"], "aggregate_shares")["request"]
    )
    # Its CollectionJobResp (its own share sealed, veil's helper's beside it)
    # opens with veil's collector code to the count, as with dap-ts's collector.
    resp = CollectionJobResp.decode(bytes.fromhex(dap_ts["leader_collection_job_resp"]))
    assert dap_ts["leader_collected"] == dap_ts["collected"]
    collector: CollectorTask = _load(tmp_path, JOBS["count"], "collector", CollectorTask)
    request = CollectionJobReq.decode(bytes.fromhex(veil["collection_job_req"]))
    vdaf = collector.vdaf.instantiate()
    shares = [
        vdaf.decode_agg_share(
            None,
            open_aggregate_share(
                V19,
                collector.collector_hpke_keypair,
                role,
                collector.task_id,
                collector.dap_configuration(),
                request,
                ct,
            ),
        )
        for role, ct in (
            (Role.LEADER, resp.leader_encrypted_agg_share),
            (Role.HELPER, resp.helper_encrypted_agg_share),
        )
    ]
    assert resp.report_count == 4
    assert vdaf.unshard(None, shares, resp.report_count) == sum(veil["measurements"])
