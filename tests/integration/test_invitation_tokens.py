"""Both aggregators check the invitation token of every report of a task with
invitations, each on its own (real servers on loopback): the leader at upload
(refused with PERMISSION_DENIED, nothing stored), the helper in aggregation
(rejected as INVALID_TOKEN, nothing recorded), also when the leader is
bypassed. A token's challenge commits to its task and its whole report (id,
time, public share, both sealed shares), so a spent token can only come back
with its own report: a duplicate; with other content it is refused as a
token of other content."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.helper_rpc import aggregate, honest_items
from veil.aggregator.core import VerifyInitItem
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import UploadError, prepare_reports
from veil.invite import blindrsa
from veil.invite.token import TOKEN_SIZE, PendingToken, public_key_bytes, report_context
from veil.local.launcher import LocalDeployment
from veil.messages import REPORT_ID_SIZE, Ciphertext, Report
from veil.protocol.v1 import helper_pb2
from veil.task import ClientTask, DpSpec, VdafSpec

TP = 3600


@cache
def keys() -> tuple[blindrsa.Signer, blindrsa.Signer, blindrsa.Signer]:
    return tuple(blindrsa.Signer(blindrsa.generate_key()) for _ in range(3))  # type: ignore[return-value]


def der(i: int) -> bytes:
    return public_key_bytes(keys()[i].public_key)


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    kw = {"time_precision": TP, "min_batch_size": 1}
    d = start_deployment(
        tmp_path_factory.mktemp("tokens"),
        {
            "q1": (VdafSpec("count"), DpSpec("none"), {**kw, "issuer_public_key": der(0)}),
            "q2": (VdafSpec("count"), DpSpec("none"), {**kw, "issuer_public_key": der(1)}),
            "open": (VdafSpec("count"), DpSpec("none"), kw),
        },
    )
    try:
        yield d
    finally:
        d.stop()


def issue(signer: blindrsa.Signer, task_id: bytes, report: Report) -> bytes:
    """A token for `report` of task `task_id` as sealed, signed by `signer`."""
    pending = PendingToken.start(
        public_key_bytes(signer.public_key), report_context(task_id, report)
    )
    return pending.finish(signer.blind_sign(pending.blinded_msg))


def build(dep: Deployment, task: ClientTask, report_id: bytes | None = None) -> Report:
    """A report of `task` sealed as an honest client seals it, without its token."""
    c = dep.client("q1")
    return prepare_reports(
        task,
        [1],
        c.hpke_config(2),
        c.hpke_config(3),
        int(time.time()),
        report_ids=None if report_id is None else [report_id],
        invited=True,
    )[0]


def invited(dep: Deployment, task: ClientTask, signer: blindrsa.Signer) -> Report:
    r = build(dep, task)
    return dataclasses.replace(r, token=issue(signer, task.task_id, r))


def other_helper_share(r: Report) -> Report:
    """`r` with another helper share sealed in its place (same length)."""
    ct = r.helper_ct
    return dataclasses.replace(
        r, helper_ct=Ciphertext(ct.config_id, ct.enc, secrets.token_bytes(len(ct.payload)))
    )


def bad_tokens(dep: Deployment) -> dict[str, tuple[Callable[[Report], bytes], str]]:
    """Each hostile token for a report of task q1, made from the report as
    sealed, with the refusal."""
    q1 = dep.tasks["q1"].client.task_id
    q2 = dep.tasks["q2"].client.task_id

    def good(r: Report) -> bytes:
        return issue(keys()[0], q1, r)

    def other_report(r: Report) -> bytes:
        return good(dataclasses.replace(r, report_id=secrets.token_bytes(REPORT_ID_SIZE)))

    return {
        "no token": (lambda r: b"", "carries no invitation token"),
        "forged signature": (
            lambda r: good(r)[:-256] + secrets.token_bytes(256),
            "does not verify",
        ),
        "another task": (lambda r: issue(keys()[0], q2, r), "another report"),
        "another report": (other_report, "another report or task"),
        "other content": (lambda r: good(other_helper_share(r)), "other content"),
        "another issuer key": (lambda r: issue(keys()[1], q1, r), "another issuer key"),
        "unknown issuer": (lambda r: issue(keys()[2], q1, r), "another issuer key"),
        "truncated": (lambda r: good(r)[:100], f"exactly {TOKEN_SIZE} bytes"),
        "trailing byte": (lambda r: good(r) + b"\x00", f"exactly {TOKEN_SIZE} bytes"),
        "wrong type": (lambda r: b"\x00\x03" + good(r)[2:], "token type"),
    }


def test_the_leader_refuses_reports_without_a_valid_token(dep: Deployment) -> None:
    q1 = dep.tasks["q1"].client
    client = dep.client("q1")
    r = build(dep, q1)
    for name, (token, why) in bad_tokens(dep).items():
        # The helper would refuse them too: only the leader's check is tried here.
        with pytest.raises(UploadError) as e:
            client.upload_reports([dataclasses.replace(r, token=token(r))])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, name
        assert why in e.value.message, (name, e.value.message)
    assert dep.stored_reports("q1") == 0
    # The valid token is accepted once; the same report again is a duplicate,
    # and the token with other content under its report id is refused as a
    # token of other content (its challenge commits to the report's content).
    report = dataclasses.replace(r, token=issue(keys()[0], q1.task_id, r))
    assert client.upload_reports([report]).accepted == 1
    assert client.upload_reports([report]).duplicates == 1
    for other in (build(dep, q1, r.report_id), other_helper_share(r)):
        with pytest.raises(UploadError) as e:
            client.upload_reports([dataclasses.replace(other, token=report.token)])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "other content under this report id" in e.value.message
        assert "fresh report id" not in e.value.message
    assert dep.stored_reports("q1") == 1


def test_a_task_without_invitations_refuses_a_token(dep: Deployment) -> None:
    task = dep.tasks["open"].client
    (report,) = prepare_reports(
        task, [1], *(dep.client("open").hpke_config(r) for r in (2, 3)), int(time.time())
    )
    client = dep.client("open")
    with pytest.raises(UploadError, match="takes no token"):
        client.upload_reports([dataclasses.replace(report, token=b"x" * TOKEN_SIZE)])
    assert client.upload_reports([report]).accepted == 1


def _verify_init(dep: Deployment, token: Callable[[Report], bytes]) -> VerifyInitItem:
    helper_config = dep.client("q1").hpke_config(3)
    (item,) = honest_items(
        dep.tasks["q1"].leader, [1], helper_config, int(time.time()), tokens=token
    )
    return item


def test_the_helper_checks_tokens_with_the_leader_bypassed(dep: Deployment) -> None:
    files = dep.tasks["q1"]
    cases = bad_tokens(dep)
    inits = [_verify_init(dep, token) for token, _ in cases.values()]
    # A leader's word on the helper's own part is not taken: the leader's
    # digest of its share given for another helper share (the token's).
    signer, task_id = keys()[0], files.leader.task_id
    good = _verify_init(dep, lambda r: issue(signer, task_id, r))
    spoiled = _verify_init(dep, lambda r: issue(signer, task_id, other_helper_share(r)))
    lying = spoiled._replace(leader_share_digest=secrets.token_bytes(32))
    inits += [lying, good._replace(leader_share_digest=b"")]

    def job(items: list[VerifyInitItem]) -> list[helper_pb2.VerifyResp]:
        return aggregate(dep.helper.address, files.leader, items)

    for name, resp in zip([*cases, "lying leader", "no digest"], job(inits), strict=True):
        assert resp.WhichOneof("result") == "reject", name
        assert resp.reject == helper_pb2.INVALID_TOKEN, name
    # Nothing of them was recorded: the same id with a valid token is new.
    store = SqliteDatastore(dep.local.root / "helper.db")
    try:
        assert store.seen_reports(files.leader.task_id, [it.report_id for it in inits]) == set()
    finally:
        store.close()
    (ok,) = job([good])
    assert ok.WhichOneof("result") == "verifier_message"
    # The spent token (its report id) again, in another job: a replay.
    (again,) = job([good])
    assert again.reject == helper_pb2.REPORT_REPLAYED


def test_reports_with_valid_tokens_are_aggregated(dep: Deployment) -> None:
    q2 = dep.tasks["q2"].client
    client = dep.client("q2")
    sealed = prepare_reports(
        q2, [1, 1, 0], client.hpke_config(2), client.hpke_config(3), int(time.time()), invited=True
    )
    reports = [dataclasses.replace(r, token=issue(keys()[1], q2.task_id, r)) for r in sealed]
    rids = [r.report_id for r in reports]
    assert client.upload_reports(reports).accepted == 3
    deadline = time.monotonic() + 60
    while dep.rejections("helper", "q2") == {} and time.monotonic() < deadline:
        store = SqliteDatastore(dep.local.root / "helper.db")
        try:
            if len(store.seen_reports(q2.task_id, rids)) == 3:
                break
        finally:
            store.close()
        time.sleep(0.2)
    assert dep.rejections("helper", "q2") == {}
    assert dep.rejections("leader", "q2") == {}


def test_refused_tokens_take_no_admission_capacity(tmp_path: Path) -> None:
    """The leader checks tokens before it reserves anything against
    [admission]: with the task's backlog at its limit (no aggregation runs:
    the leader's driver is off and no worker started), a report with a valid
    token is refused as overloaded, and one without a valid token is refused
    for its token (PERMISSION_DENIED), never as overloaded; on main the
    reservation came first, so a flood of token-less uploads held capacity
    that invited respondents were then refused for."""
    kw = {"time_precision": TP, "min_batch_size": 1, "issuer_public_key": der(0)}
    admission = {"max_pending_per_task": 2, "max_pending_reports": 0, "recount_seconds": 0}
    dep = Deployment(
        LocalDeployment.start(
            tmp_path,
            {
                "q1": (VdafSpec("count"), DpSpec("none"), kw),
                "q2": (VdafSpec("count"), DpSpec("none"), {**kw, "issuer_public_key": der(1)}),
            },
            workers=1,
            start_workers=False,
            extra_config={"admission": admission},
        )
    )
    try:
        q1 = dep.tasks["q1"].client
        client = dep.client("q1")

        def one() -> Report:
            return invited(dep, q1, keys()[0])

        assert client.upload_reports([one(), one()]).accepted == 2
        with pytest.raises(UploadError) as e:
            client.upload_reports([one()])
        assert e.value.code == grpc.StatusCode.UNAVAILABLE  # the limit holds
        r = build(dep, q1)
        for name, (token, why) in bad_tokens(dep).items():
            with pytest.raises(UploadError) as e:
                client.upload_reports([dataclasses.replace(r, token=token(r))])
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, (name, e.value.message)
            assert why in e.value.message, (name, e.value.message)
        # A valid token ahead of a bad one in one upload: refused for the bad one.
        with pytest.raises(UploadError) as e:
            client.upload_reports([one(), r])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "report 1 " in e.value.message
        assert dep.stored_reports("q1") == 2
    finally:
        dep.stop()
