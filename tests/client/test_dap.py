"""veil.client.dap: the client's upload over DAP against an aggregator on
loopback that answers what each test tells it to (a real HTTP server): the
requests are the draft's, a report refused for an unknown HPKE config is
sealed again once to the configs fetched anew (-19) as the same report, and
every answer parsed from the network can be hostile (a problem document, a
wrong media type, a malformed HpkeConfigList or UploadErrors, UploadErrors
naming a report not sent), each a clear UploadError; a redirect is not
followed, to another real server on loopback; an invalid measurement sends
nothing; a task's local layer randomizes what the shares
carry; reports sealed elsewhere (the survey page's) are relayed as they are."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.dap.scripted_server import Answer, ScriptedServer
from tests.support.dap_reports import dap_aggregate
from veil.client import Client, DapClient, Outbox, OutboxError, UploadError, client_for
from veil.client.dap import DapReports
from veil.dap.messages import HpkeConfig, HpkeConfigList, UploadErrors, UploadRequest
from veil.dap.messages import ReportUploadStatus as Status
from veil.dap.problems import PROBLEM_MEDIA_TYPE, Problem, ProblemType, media_type
from veil.dap.report import prepare_report
from veil.dap.shares import open_input_share
from veil.dap.versions import DapVersion, ReportError, Role
from veil.hpke import ROLE_LEADER, HpkeKeypair, generate_keypair
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task

TP = 3600
WHEN = 480_000 * TP
VERSION = DapVersion.DAP_19


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def files(server: ScriptedServer) -> TaskFiles:
    # The leader at the server's root, the helper under /helper/.
    dap = DapSpec(server.url, server.url + "helper/", VERSION.value, "veil")
    addresses = ("127.0.0.1:1", "127.0.0.1:2")
    return new_task(VdafSpec("count"), *addresses, min_batch_size=2, dp=DpSpec("none"), dap=dap)


KEYS = {name: generate_keypair(i) for i, name in enumerate(("leader", "helper", "new"))}


def _configs(keypair: HpkeKeypair) -> Answer:
    body = HpkeConfigList((HpkeConfig.of(keypair.config),)).encode()
    return Answer(200, body, {"Content-Type": media_type("hpke-config-list")})


def _errors(*statuses: Status) -> Answer:
    body = UploadErrors(statuses).encode(VERSION)
    return Answer(200, body, {"Content-Type": media_type("upload-errors")})


def _client(files: TaskFiles) -> DapClient:
    return DapClient(files.client, retries=2, backoff=0.01)


def _upload(
    server: ScriptedServer, files: TaskFiles, *answers: Answer | Callable[[bytes], Answer]
) -> int:
    """Three reports uploaded by a fresh client, the server answering `answers`."""
    server.answers = list(answers)
    server.seen.clear()
    return _client(files).upload_batch([1, 0, 1], report_time=WHEN).accepted


def _uploads(server: ScriptedServer) -> list[UploadRequest]:
    return [UploadRequest.decode(body) for m, _, _, body in server.seen if m == "POST"]


def _opens(files: TaskFiles, request: UploadRequest, leader: HpkeKeypair) -> None:
    """Each report's shares open with the leader's key given and the helper's."""
    task = files.client
    for report in request.reports:
        for keypair, role, ct in (
            (leader, Role.LEADER, report.leader_encrypted_input_share),
            (KEYS["helper"], Role.HELPER, report.helper_encrypted_input_share),
        ):
            open_input_share(
                VERSION, keypair, role, task.task_id, task.dap_configuration(),
                report.metadata, report.public_share, ct,
            )  # fmt: skip


def test_reports_are_uploaded_as_the_draft_says(server: ScriptedServer, files: TaskFiles) -> None:
    ok = Answer(200)
    assert _upload(server, files, _configs(KEYS["leader"]), _configs(KEYS["helper"]), ok) == 3
    (m1, p1, _, _), (m2, p2, _, _), (m3, p3, headers, _) = server.seen
    assert [(m1, p1), (m2, p2)] == [("GET", "/hpke_config"), ("GET", "/helper/hpke_config")]
    assert (m3, p3) == ("POST", f"/tasks/{files.client.id_text}/reports")
    assert headers["content-type"] == media_type("upload-req")
    (request,) = _uploads(server)
    assert len(request.reports) == 3
    assert {r.metadata.time for r in request.reports} == {WHEN // TP}
    assert len({r.metadata.report_id for r in request.reports}) == 3
    _opens(files, request, KEYS["leader"])


def _refusing(error: ReportError, first: int) -> Callable[[bytes], Answer]:
    """UploadErrors refusing the first `first` reports of the request with `error`."""

    def answer(body: bytes) -> Answer:
        reports = UploadRequest.decode(body).reports[:first]
        return _errors(*(Status(r.metadata.report_id, error) for r in reports))

    return answer


def test_an_unknown_config_is_fetched_again_once(server: ScriptedServer, files: TaskFiles) -> None:
    # The leader refuses two of three reports for their key, then takes
    # them sealed to its new key: the same reports (ids, times), sealed anew.
    unknown = _refusing(ReportError.HPKE_UNKNOWN_CONFIG_ID, 2)
    configs = (_configs(KEYS["leader"]), _configs(KEYS["helper"]))
    fresh = (_configs(KEYS["new"]), _configs(KEYS["helper"]))
    assert _upload(server, files, *configs, unknown, *fresh, Answer(200)) == 3
    first, again = _uploads(server)
    assert [r.metadata for r in again.reports] == [r.metadata for r in first.reports[:2]]
    assert {r.leader_encrypted_input_share.config_id for r in again.reports} == {
        KEYS["new"].config.config_id
    }
    _opens(files, again, KEYS["new"])


def test_a_config_still_unknown_is_an_error(server: ScriptedServer, files: TaskFiles) -> None:
    unknown = _refusing(ReportError.HPKE_UNKNOWN_CONFIG_ID, 2)
    configs = (_configs(KEYS["leader"]), _configs(KEYS["helper"]))
    with pytest.raises(UploadError, match="took 1 of 3 reports and refused 2") as refused:
        _upload(server, files, *configs, unknown, *configs, unknown)
    assert "hpke_unknown_config_id" in refused.value.message
    assert len(_uploads(server)) == 2  # refetched once, not again


def test_a_refused_report_is_named(server: ScriptedServer, files: TaskFiles) -> None:
    replayed = _refusing(ReportError.REPORT_REPLAYED, 1)
    configs = (_configs(KEYS["leader"]), _configs(KEYS["helper"]))
    with pytest.raises(
        UploadError, match=r"took 2 of 3 reports and refused 1 \(\w{32}: report_replayed\)"
    ):
        _upload(server, files, *configs, replayed)
    assert len(_uploads(server)) == 1  # not sent again


def test_a_busy_leader_is_asked_again(server: ScriptedServer, files: TaskFiles) -> None:
    busy = Answer(503, b"backlog full", {"Retry-After": "0"})
    configs = (_configs(KEYS["leader"]), _configs(KEYS["helper"]))
    assert _upload(server, files, busy, *configs, busy, Answer(200)) == 3
    first, again = _uploads(server)
    assert first == again  # the same reports, byte for byte


def _problem(kind: ProblemType, detail: str, status: int) -> Answer:
    return Answer(
        status, Problem(kind, detail, status).to_json(), {"Content-Type": PROBLEM_MEDIA_TYPE}
    )


CONFIGS = "configs"
# A list of one config veil does not speak (DHKEM(P-256)).
P256_ONLY = HpkeConfigList((HpkeConfig(1, 0x0010, 1, 1, b"\4" + bytes(64)),)).encode()
HOSTILE: dict[str, tuple[list[Answer | str], grpc.StatusCode, str]] = {
    "configs of another media type": (
        [Answer(200, b"\0" * 10, {"Content-Type": "application/octet-stream"})],
        grpc.StatusCode.FAILED_PRECONDITION,
        "answered no HpkeConfigList",
    ),
    "a malformed HpkeConfigList": (
        [Answer(200, b"\0\x05\x01", {"Content-Type": media_type("hpke-config-list")})],
        grpc.StatusCode.FAILED_PRECONDITION,
        "answered no HpkeConfigList",
    ),
    "no config veil seals to": (
        [Answer(200, P256_ONLY, {"Content-Type": media_type("hpke-config-list")})],
        grpc.StatusCode.FAILED_PRECONDITION,
        "offers no HPKE config",
    ),
    "a problem document": (
        [CONFIGS, _problem(ProblemType.UNRECOGNIZED_TASK, "no such task", 404)],
        grpc.StatusCode.NOT_FOUND,
        "unrecognizedTask: no such task",
    ),
    "a refusal without a problem": (
        [CONFIGS, Answer(400, b"<html>")],
        grpc.StatusCode.INVALID_ARGUMENT,
        "answered 400",
    ),
    "UploadErrors of another media type": (
        [CONFIGS, Answer(200, b"\0" * 17, {"Content-Type": "text/plain"})],
        grpc.StatusCode.INTERNAL,
        "without UploadErrors",
    ),
    "truncated UploadErrors": (
        [CONFIGS, Answer(200, b"\0" * 16, {"Content-Type": media_type("upload-errors")})],
        grpc.StatusCode.INTERNAL,
        "without UploadErrors",
    ),
    "an unknown ReportError": (
        [CONFIGS, Answer(200, b"\1" * 16 + b"\xff", {"Content-Type": media_type("upload-errors")})],
        grpc.StatusCode.INTERNAL,
        "without UploadErrors",
    ),
    "UploadErrors naming another report": (
        [CONFIGS, _errors(Status(b"\7" * 16, ReportError.REPORT_REPLAYED))],
        grpc.StatusCode.INTERNAL,
        "names reports it was not sent",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_answer_is_a_clear_error(
    server: ScriptedServer, files: TaskFiles, case: str
) -> None:
    script, code, says = HOSTILE[case]
    answers: list[Answer] = []
    for a in script:
        answers += [_configs(KEYS["leader"]), _configs(KEYS["helper"])] if a == CONFIGS else [a]
    with pytest.raises(UploadError) as refused:
        _upload(server, files, *answers)
    assert refused.value.code is code
    assert says in refused.value.message
    # The honest answers are taken after it.
    configs = (_configs(KEYS["leader"]), _configs(KEYS["helper"]))
    assert _upload(server, files, *configs, Answer(200)) == 3


def test_no_redirect_is_followed(server: ScriptedServer, files: TaskFiles) -> None:
    """An aggregator answering GET hpke_config with a redirect to another
    real server on loopback, which would serve a valid config, is refused,
    the error naming the status and the Location, and the other server is
    never asked (urllib followed it, and the reports were sealed to the
    config found there); so is the leader redirecting an upload (urllib
    sent a 301, 302 or 303 on there as a GET, whose empty 200 read as
    every report taken)."""
    other = ScriptedServer()
    leader, helper = _configs(KEYS["leader"]), _configs(KEYS["helper"])
    try:
        there = f"{other.url}hpke_config"
        for status in (301, 302, 303, 307, 308):
            redirect = Answer(status, headers={"Location": there})
            for answers, name, endpoint in (
                ([redirect], "leader", server.url),
                ([leader, redirect], "helper", f"{server.url}helper/"),
                ([leader, helper, redirect], "leader", server.url),  # the upload
            ):
                other.answers = [_configs(KEYS["new"]), Answer(200)]
                with pytest.raises(UploadError) as refused:
                    _upload(server, files, *answers)
                assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
                assert refused.value.message == (
                    f"the DAP {name} at {endpoint} answered {status}, a redirect to {there!r}:"
                    " veil follows no redirect from a DAP aggregator (the task's endpoint must"
                    " be where the aggregator answers)"
                )
                assert len(server.seen) == len(answers)
        assert other.seen == []
        # Control: where a task names the other server as its leader, it
        # serves the config the redirects pointed to.
        dap = DapSpec(other.url, server.url + "helper/", VERSION.value, "veil")
        addresses = ("127.0.0.1:1", "127.0.0.1:2")
        elsewhere = new_task(
            VdafSpec("count"), *addresses, min_batch_size=2, dp=DpSpec("none"), dap=dap
        )
        other.answers = [_configs(KEYS["new"])]
        assert DapClient(elsewhere.client).hpke_config(ROLE_LEADER) == KEYS["new"].config
        assert [(m, p) for m, p, _, _ in other.seen] == [("GET", "/hpke_config")]
    finally:
        other.close()
    # The honest answers are taken after it.
    assert _upload(server, files, leader, helper, Answer(200)) == 3


def test_an_invalid_measurement_sends_nothing(server: ScriptedServer, files: TaskFiles) -> None:
    server.answers = [_configs(KEYS["leader"]), _configs(KEYS["helper"])]
    server.seen.clear()
    with pytest.raises(ValueError, match="measurement 1"):
        _client(files).upload_batch([1, 7], report_time=WHEN)
    assert _uploads(server) == []
    with pytest.raises(ValueError, match="not a multiple of time_precision"):
        _client(files).upload(1, report_time=WHEN + 1)


def test_an_unreachable_leader_is_named(files: TaskFiles) -> None:
    dap = DapSpec("http://127.0.0.1:9/", "http://127.0.0.1:9/", VERSION.value, "veil")
    addresses = ("127.0.0.1:1", "127.0.0.1:2")
    task = new_task(VdafSpec("count"), *addresses, min_batch_size=2, dp=DpSpec("none"), dap=dap)
    with pytest.raises(UploadError) as refused:
        DapClient(task.client, retries=0).upload(1)
    assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    assert "cannot reach the DAP leader at http://127.0.0.1:9/" in refused.value.message


def test_the_protocol_is_chosen_by_task_or_by_name(files: TaskFiles) -> None:
    assert isinstance(client_for(files.client), DapClient)
    addresses = ("127.0.0.1:1", "127.0.0.1:2")
    grpc_task = new_task(VdafSpec("count"), *addresses, min_batch_size=2, dp=DpSpec("none"))
    with client_for(grpc_task.client) as chosen:
        assert isinstance(chosen, Client)
    with pytest.raises(ValueError, match="not served over DAP"):
        client_for(grpc_task.client, protocol="dap")
    with pytest.raises(ValueError, match="'grpc' or 'dap'"):
        client_for(files.client, protocol="http")


def test_the_outbox_keeps_what_the_leader_did_not_take(
    server: ScriptedServer, files: TaskFiles, tmp_path: Path
) -> None:
    """With an outbox, each report is stored before it is sent: a leader
    that stays busy leaves all pending (the result says so, nothing
    raised), a client opened again seals with the configs the outbox
    remembered, and a flush sends the stored reports byte for byte. Of the
    leader's UploadErrors, report_replayed is a report it holds already
    (acknowledged) and any other keeps the report apart, refused; a refusal
    of the whole request not about the reports keeps them pending."""
    box = tmp_path / "dap.outbox"
    server.seen.clear()
    busy = Answer(503, b"busy", {"Retry-After": "0"})
    server.answers = [_configs(KEYS["leader"]), _configs(KEYS["helper"]), busy, busy]
    with DapClient(files.client, retries=1, backoff=0.01, outbox=box) as client:
        result = client.upload_batch([1, 0, 1], report_time=WHEN)
    assert (result.accepted, result.pending) == (0, 3) and "busy" in (result.error or "")
    first, again = _uploads(server)
    assert first == again

    # Opened again: no config fetched, a fourth report stored, and the
    # leader refuses the whole request for a reason not about the reports.
    server.seen.clear()
    unauthorized = Answer(404, Problem(ProblemType.UNRECOGNIZED_TASK, "no", 404).to_json())
    server.answers = [unauthorized]
    with DapClient(files.client, retries=0, outbox=box) as client:
        result = client.upload(1, report_time=WHEN)
    assert (result.accepted, result.pending) == (0, 4)
    assert [m for m, _, _, _ in server.seen] == ["POST"]
    (sent,) = _uploads(server)
    assert sent.reports[:3] == first.reports

    # The first replayed (held already), the second invalid: kept apart.
    def answer(body: bytes) -> Answer:
        reports = UploadRequest.decode(body).reports
        return _errors(
            Status(reports[0].metadata.report_id, ReportError.REPORT_REPLAYED),
            Status(reports[1].metadata.report_id, ReportError.INVALID_MESSAGE),
        )

    server.seen.clear()
    server.answers = [answer]
    with DapClient(files.client, retries=0, outbox=box) as client:
        result = client.flush()
        assert (result.accepted, result.duplicates, result.refused, result.pending) == (2, 1, 1, 0)
        assert client.flush().accepted == 0
    assert len(_uploads(server)) == 1
    with Outbox(box, codec=DapReports(TP)) as outbox:
        (status,) = outbox.status()
    assert (status.delivered, status.refused, status.pending) == (3, 1, 0)


def test_a_dap_report_stored_damaged_is_named(files: TaskFiles, tmp_path: Path) -> None:
    box = tmp_path / "dap.outbox"
    with Outbox(box, codec=DapReports(TP)) as outbox:
        outbox.add(files.client.task_id, [])
    with sqlite3.connect(box) as db:
        db.execute(
            "INSERT INTO reports (task_id, report_id, time, report, stored) VALUES (?, ?, 0, ?, 0)",
            (files.client.task_id, bytes(16), b"\x00" * 5),
        )
    with (
        Outbox(box, codec=DapReports(TP)) as outbox,
        pytest.raises(OutboxError, match="report 1 is damaged"),
    ):
        outbox.pending(files.client.task_id, 10)


def test_a_local_layer_randomizes_before_the_upload(server: ScriptedServer) -> None:
    # Every respondent answers yes at ε_L = 1: each report carries yes with
    # probability keep = e/(1+e) ≈ 0.73, so of 200 reports the yes count falls
    # outside [100, 190] with probability about 1e-12, and all 200 yes (what a
    # client that sends the true answer sends) has probability 0.73^200 < 1e-27.
    dap = DapSpec(server.url, server.url + "helper/", VERSION.value, "veil")
    local = new_task(
        VdafSpec("count"), "127.0.0.1:1", "127.0.0.1:2", min_batch_size=2,
        dp=DpSpec("none", local_epsilon="1"), dap=dap,
    )  # fmt: skip
    task = local.client
    channel = task.dp.local(task.vdaf)
    assert channel is not None and 0.73 < float(channel.keep) < 0.74
    server.answers = [_configs(KEYS["leader"]), _configs(KEYS["helper"]), Answer(200)]
    server.seen.clear()
    client = DapClient(task, retries=2, backoff=0.01, batch_size=200)
    assert client.upload_batch([1] * 200, report_time=WHEN).accepted == 200
    (request,) = _uploads(server)
    yes = dap_aggregate(task, VERSION, KEYS["leader"], KEYS["helper"], request.reports)
    assert yes < 200, "every report carries the true answer: the local layer was skipped"
    assert 100 <= yes <= 190


def test_reports_sealed_elsewhere_are_relayed_as_they_are(
    server: ScriptedServer, files: TaskFiles
) -> None:
    # What `veil survey serve` does with the page's DAP reports: one
    # UploadRequest of the very bytes, a replayed report a duplicate, any
    # other refusal named, nothing sealed again.
    task = files.client
    vdaf, config = task.vdaf.instantiate(), task.dap_configuration()
    leader, helper = KEYS["leader"].config, KEYS["helper"].config
    sealed = [
        prepare_report(VERSION, task.task_id, config, vdaf, m, WHEN // TP, leader, helper)
        for m in (1, 0, 1)
    ]
    server.answers = [_refusing(ReportError.REPORT_REPLAYED, 1)]
    server.seen.clear()
    result = _client(files).upload_reports(sealed)
    assert (result.accepted, result.duplicates) == (2, 1)
    (request,) = _uploads(server)
    assert request.reports == tuple(sealed)
    server.answers = [_refusing(ReportError.HPKE_UNKNOWN_CONFIG_ID, 2)]
    with pytest.raises(UploadError, match=r"took 1 of 3 reports and refused 2 .*hpke_unknown"):
        _client(files).upload_reports(sealed)
    assert len(_uploads(server)) == 2  # not sealed again, not fetched
    # Reports with invitation tokens: the leader acknowledges one sent again
    # as it was, so a replayed one is a token spent on other content.
    server.answers = [_refusing(ReportError.REPORT_REPLAYED, 1)]
    with pytest.raises(UploadError, match="invitation token was already spent") as refused:
        _client(files).upload_reports(sealed, invited=True)
    assert refused.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert sealed[0].metadata.report_id.hex() in refused.value.message
