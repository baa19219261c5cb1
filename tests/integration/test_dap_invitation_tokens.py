"""Invitations over DAP (issue 43): a report of a task with invitations
carries its token in veil's invitation extension (veil.dap.invitation), and
a `veil leader` and a `veil helper` serving DAP on loopback (SQLite) each
check it on their own with the gRPC path's checks: the leader at upload (a
report refused in UploadErrors, nothing stored), the helper in aggregation
with the leader bypassed (the report rejected, nothing recorded). A valid
token's reports are aggregated by both and collected exactly; a task
without invitations refuses the extension as unsupported."""

from __future__ import annotations

import secrets
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pytest

from tests.support.dap_servers import dap_servers
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import DapClient
from veil.client.dap import InvitedReport
from veil.collector import DapCollector
from veil.dap.invitation import INVITATION_EXTENSION, InvitationExtension
from veil.dap.jobs import (
    AggregationJobInitReq,
    AggregationJobResp,
    ReportShare,
    VerifyInit,
    VerifyRespType,
)
from veil.dap.messages import Extension, Report, UploadErrors, UploadRequest
from veil.dap.pingpong import initialize
from veil.dap.problems import media_type
from veil.dap.report import prepare_report
from veil.dap.versions import DapVersion, ReportError, vdaf_context
from veil.invite import blindrsa
from veil.invite.token import PendingToken, public_key_bytes
from veil.local.launcher import free_port
from veil.task import DapSpec, DpSpec, TaskFiles, VdafSpec, new_task

TP = 3600
VERSION = DapVersion.DAP_19


@cache
def signers() -> tuple[blindrsa.Signer, blindrsa.Signer]:
    return tuple(blindrsa.Signer(blindrsa.generate_key()) for _ in range(2))  # type: ignore[return-value]


@dataclass
class Deployment:
    root: Path
    tasks: dict[str, TaskFiles]
    helper_url: str

    def stored(self, name: str) -> int:
        """The reports the leader holds of task `name` (through its store)."""
        task = self.tasks[name].client
        store = SqliteDatastore(self.root / "leader.db")
        try:
            counts = store.report_counts(task.task_id, task.time_precision)
        finally:
            store.close()
        return sum(n for states in counts.values() for n in states.values())

    def seen_by_helper(self, name: str, ids: list[bytes]) -> set[bytes]:
        store = SqliteDatastore(self.root / "helper.db")
        try:
            return store.seen_reports(self.tasks[name].client.task_id, ids)
        finally:
            store.close()


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("dap-tokens")
    leader_dap, helper_dap = (f"127.0.0.1:{free_port()}" for _ in range(2))
    leader_grpc, helper_grpc = (f"127.0.0.1:{free_port()}" for _ in range(2))
    spec = DapSpec(f"http://{leader_dap}/", f"http://{helper_dap}/", VERSION.value, "veil")

    def task(issuer: int | None, other: str | None = None) -> TaskFiles:
        key = None if issuer is None else public_key_bytes(signers()[issuer].public_key)
        return new_task(
            VdafSpec("count"),
            leader_grpc,
            helper_grpc,
            time_precision=TP,
            min_batch_size=1,
            dp=DpSpec("none"),
            dap=replace(spec, other_implementation=other),
            issuer_public_key=key,
        )

    # q1 and q2: two questions of a survey with invitations, each its own
    # issuer key; open: a task without invitations; beside: a question whose
    # helper is another implementation, which knows nothing of tokens (veil's
    # helper without the issuer key stands in for it).
    tasks = {"q1": task(0), "q2": task(1), "open": task(None), "beside": task(0, "helper")}
    beside = tasks["beside"]
    tasks["beside"] = replace(beside, helper=replace(beside.helper, issuer_public_key=None))
    with dap_servers(root, tasks, (leader_grpc, leader_dap), (helper_grpc, helper_dap)):
        yield Deployment(root, tasks, f"http://{helper_dap}/")


def when() -> int:
    """The previous hour, closed: collectable at once."""
    return (int(time.time()) // TP - 1) * TP


def sign(signer: blindrsa.Signer, context: bytes) -> bytes:
    """A token for the redemption context `context`, as the issuer signs it."""
    pending = PendingToken.start(public_key_bytes(signer.public_key), context)
    return pending.finish(signer.blind_sign(pending.blinded_msg))


def seal(client: DapClient, invited: InvitedReport, extensions: tuple[Extension, ...]) -> Report:
    """`invited` sealed as an honest client seals it, with `extensions`."""
    p = invited.pending
    return prepare_report(
        VERSION,
        client.task.task_id,
        client.configuration,
        client.vdaf,
        p.measurement,
        p.time,
        *invited.configs,
        report_id=p.report_id,
        rand=p.rand,
        public_extensions=extensions,
        ephemerals=invited.ephemerals,
    )


def upload(client: DapClient, reports: list[Report]) -> dict[bytes, ReportError]:
    """POST an UploadRequest: the leader's refusals, by report id."""
    request = urllib.request.Request(
        f"{client.dap.leader_endpoint}tasks/{client.task.id_text}/reports",
        UploadRequest(tuple(reports)).encode(),
        {"Content-Type": media_type("upload-req")},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        body = r.read()
    errors = UploadErrors.decode(body, VERSION) if body else UploadErrors(())
    return {s.report_id: s.error for s in errors.statuses}


def leader_init(files: TaskFiles, client: DapClient, report: Report, rand: bytes) -> bytes:
    """The leader's ping-pong initialize for `report` (measurement 1, sharded
    from `rand` as the client did): its verify_init from its own share,
    computed here from the sharding, the leader's HPKE key being its own."""
    vdaf, rid = client.vdaf, report.metadata.report_id
    context = vdaf_context(VERSION, files.leader.task_id)
    public, shares = vdaf.shard(context, 1, rid, rand)
    _, verifier_share = vdaf.verify_init(
        files.leader.verify_key, context, 0, None, rid, public, shares[0]
    )
    return initialize(vdaf.encode_verifier_share(verifier_share))


def hostile(
    dep: Deployment, client: DapClient
) -> dict[str, tuple[Callable[[InvitedReport], tuple[Extension, ...]], ReportError]]:
    """Each hostile extension for an invited report of q1, with the
    ReportError both aggregators answer it with."""
    q2 = DapClient(dep.tasks["q2"].client)
    invalid, unsupported = ReportError.INVALID_MESSAGE, ReportError.UNSUPPORTED_EXTENSION

    def ext(token: bytes, inv: InvitedReport, digest: bytes | None = None) -> tuple[Extension]:
        leader = inv.leader_key_digest if digest is None else digest
        return (InvitationExtension(token, leader).extension(),)

    def good(inv: InvitedReport) -> bytes:
        return sign(signers()[0], inv.context)

    def other_report(inv: InvitedReport) -> tuple[Extension, ...]:
        return ext(good(client.prepare_invited(1, when())), inv)

    def wrong_survey(inv: InvitedReport) -> tuple[Extension, ...]:
        # A token of another question (its own key and task) on this one's report.
        return ext(sign(signers()[1], q2.prepare_invited(1, when()).context), inv)

    return {
        "missing": (lambda inv: (), invalid),
        "forged signature": (
            lambda inv: ext(good(inv)[:-256] + secrets.token_bytes(256), inv),
            invalid,
        ),
        "another report's": (other_report, invalid),
        "another survey's": (wrong_survey, invalid),
        "another issuer key": (lambda inv: ext(sign(signers()[1], inv.context), inv), invalid),
        "truncated": (
            lambda inv: (
                Extension(INVITATION_EXTENSION, ext(good(inv), inv)[0].extension_data[:-1]),
            ),
            invalid,
        ),
        "a lying leader digest": (
            lambda inv: ext(good(inv), inv, secrets.token_bytes(32)),
            invalid,
        ),
        "twice": (lambda inv: ext(good(inv), inv) * 2, invalid),
        "beside another extension": (
            lambda inv: (*ext(good(inv), inv), Extension(0xFF57, b"")),
            unsupported,
        ),
    }


def test_the_leader_refuses_reports_without_a_valid_token(dep: Deployment) -> None:
    client = DapClient(dep.tasks["q1"].client)
    cases = hostile(dep, client)
    reports = []
    for make, _ in cases.values():
        inv = client.prepare_invited(1, when())
        reports.append(seal(client, inv, make(inv)))
    refused = upload(client, reports)
    for name, report, (_, error) in zip(cases, reports, cases.values(), strict=True):
        assert refused.get(report.metadata.report_id) == error, name
    assert dep.stored("q1") == 0
    # A valid token is taken once; the same report again is acknowledged, and
    # its token (its report id) reused with other content is a replay.
    inv = client.prepare_invited(1, when())
    extension = InvitationExtension(sign(signers()[0], inv.context), inv.leader_key_digest)
    report = seal(client, inv, (extension.extension(),))
    assert upload(client, [report]) == {}
    assert upload(client, [report]) == {}
    other = seal(
        client, replace(inv, pending=replace(inv.pending, measurement=0)), (extension.extension(),)
    )
    assert upload(client, [other]) == {other.metadata.report_id: ReportError.REPORT_REPLAYED}
    assert dep.stored("q1") == 1


def test_a_task_without_invitations_refuses_the_extension(dep: Deployment) -> None:
    q1 = DapClient(dep.tasks["q1"].client)
    inv = q1.prepare_invited(1, when())
    extension = InvitationExtension(sign(signers()[0], inv.context), inv.leader_key_digest)
    open_ = DapClient(dep.tasks["open"].client)
    (report,) = open_._seal([replace(inv.pending, report_id=secrets.token_bytes(16))])
    tokened = replace(
        report, metadata=replace(report.metadata, public_extensions=(extension.extension(),))
    )
    assert upload(open_, [tokened]) == {
        report.metadata.report_id: ReportError.UNSUPPORTED_EXTENSION
    }


def test_the_helper_checks_tokens_with_the_leader_bypassed(dep: Deployment) -> None:
    files = dep.tasks["q1"]
    client = DapClient(files.client)
    cases = hostile(dep, client)
    invs = [client.prepare_invited(1, when()) for _ in range(len(cases) + 1)]
    reports = [
        seal(client, inv, make(inv))
        for inv, (make, _) in zip(invs[:-1], cases.values(), strict=True)
    ]
    good = InvitationExtension(sign(signers()[0], invs[-1].context), invs[-1].leader_key_digest)
    valid = seal(client, invs[-1], (good.extension(),))
    request = AggregationJobInitReq(
        0,
        b"",
        (),
        tuple(
            VerifyInit(
                ReportShare(r.metadata, r.public_share, r.helper_encrypted_input_share),
                leader_init(files, client, r, inv.pending.rand),
            )
            for r, inv in zip([*reports, valid], invs, strict=True)
        ),
    )
    post = urllib.request.Request(
        f"{dep.helper_url}tasks/{files.helper.id_text}/aggregation_jobs",
        request.encode(),
        {
            "Content-Type": media_type("aggregation-job-init-req"),
            "Authorization": f"Bearer {files.leader.aggregator_token}",
        },
        method="POST",
    )
    with urllib.request.urlopen(post, timeout=30) as r:
        resps = AggregationJobResp.decode(r.read(), VERSION).verify_resps
    got = {resp.report_id: (resp.type, resp.error) for resp in resps}
    for name, report, (_, error) in zip(cases, reports, cases.values(), strict=True):
        assert got[report.metadata.report_id] == (VerifyRespType.REJECT, error), name
    assert got[valid.metadata.report_id] == (VerifyRespType.CONTINUE, None)
    # Nothing of the refused ones was recorded: the same ids are new.
    ids = [r.metadata.report_id for r in reports]
    assert dep.seen_by_helper("q1", ids) == set()


def test_reports_with_valid_tokens_are_aggregated_and_collected(dep: Deployment) -> None:
    files = dep.tasks["q2"]
    client = DapClient(files.client)
    t = when()
    for value in (1, 1, 0, 1):
        inv = client.prepare_invited(value, t)
        client.upload_invited(inv, sign(signers()[1], inv.context))
    with DapCollector(files.collector) as collector:
        result = collector.collect(t, TP, wait=120)
    assert (result.report_count, result.estimate) == (4, 3)
    # Neither aggregator rejected any: each found every token valid.
    store = SqliteDatastore(dep.root / "helper.db")
    try:
        assert store.rejections(files.client.task_id) == {}
    finally:
        store.close()


def test_with_another_helper_the_leader_alone_checks_the_token(dep: Deployment) -> None:
    # The token rides in the leader's input share, private to it: a helper
    # of another implementation never sees veil's extension (it would refuse
    # the report), and the leader checks it at upload, opening its share.
    files = dep.tasks["beside"]
    client = DapClient(files.client)
    t = when()
    cases = {
        "missing": lambda inv: b"",
        "forged": lambda inv: sign(signers()[0], inv.context)[:-256] + secrets.token_bytes(256),
        "another survey's": lambda inv: sign(signers()[1], inv.context),
        "another report's": lambda inv: sign(signers()[0], client.prepare_invited(1, t).context),
    }
    for name, token in cases.items():
        inv = client.prepare_invited(1, t)
        extension = InvitationExtension(token(inv), inv.leader_key_digest).extension()
        extensions = () if name == "missing" else (extension,)
        report = client._seal_one(inv.pending, *inv.configs, (), inv.ephemerals, extensions)
        assert upload(client, [report]) == {
            report.metadata.report_id: ReportError.INVALID_MESSAGE
        }, name
    # In the public extensions instead, it is refused as an extension.
    inv = client.prepare_invited(1, t)
    extension = InvitationExtension(sign(signers()[0], inv.context), inv.leader_key_digest)
    public = seal(client, inv, (extension.extension(),))
    assert upload(client, [public]) == {
        public.metadata.report_id: ReportError.UNSUPPORTED_EXTENSION
    }
    assert dep.stored("beside") == 0
    for value in (1, 0, 1):
        inv = client.prepare_invited(value, t)
        client.upload_invited(inv, sign(signers()[0], inv.context))
    with DapCollector(files.collector) as collector:
        result = collector.collect(t, TP, wait=120)
    assert (result.report_count, result.estimate) == (3, 2)
