"""Both aggregators check the invitation token of every report of a task with
invitations, each on its own (real servers on loopback): the leader at upload
(refused with PERMISSION_DENIED, nothing stored), the helper in aggregation
(rejected as INVALID_TOKEN, nothing recorded), also when the leader is
bypassed. A token is bound to (task id, report id), so a spent token can only
come back with its own report id: a duplicate, or a conflict if the report
differs."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Iterator
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
from veil.invite.token import TOKEN_SIZE, PendingToken, public_key_bytes, redemption_context
from veil.local.launcher import LocalDeployment
from veil.messages import REPORT_ID_SIZE, Report
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


def issue(signer: blindrsa.Signer, task_id: bytes, report_id: bytes) -> bytes:
    pending = PendingToken.start(
        public_key_bytes(signer.public_key), redemption_context(task_id, report_id)
    )
    return pending.finish(signer.blind_sign(pending.blinded_msg))


def build(dep: Deployment, task: ClientTask, token: bytes | None, report_id: bytes) -> Report:
    c = dep.client("q1")
    return prepare_reports(
        task,
        [1],
        c.hpke_config(2),
        c.hpke_config(3),
        int(time.time()),
        report_ids=[report_id],
        tokens=[token if token is not None else b""],
    )[0]


def bad_tokens(dep: Deployment) -> dict[str, tuple[bytes, str]]:
    """A report id and each hostile token for it in task q1, with the refusal."""
    q1 = dep.tasks["q1"].client
    rid = secrets.token_bytes(REPORT_ID_SIZE)
    good = issue(keys()[0], q1.task_id, rid)
    other_report = issue(keys()[0], q1.task_id, secrets.token_bytes(REPORT_ID_SIZE))
    return {
        "no token": (b"", "carries no invitation token"),
        "forged signature": (good[:-256] + secrets.token_bytes(256), "does not verify"),
        "another task": (issue(keys()[0], dep.tasks["q2"].client.task_id, rid), "another report"),
        "another report": (other_report, "another report or task"),
        "another issuer key": (issue(keys()[1], q1.task_id, rid), "another issuer key"),
        "unknown issuer": (issue(keys()[2], q1.task_id, rid), "another issuer key"),
        "truncated": (good[:100], f"exactly {TOKEN_SIZE} bytes"),
        "trailing byte": (good + b"\x00", f"exactly {TOKEN_SIZE} bytes"),
        "wrong type": (b"\x00\x03" + good[2:], "token type"),
    }, rid  # type: ignore[return-value]


def test_the_leader_refuses_reports_without_a_valid_token(dep: Deployment) -> None:
    q1 = dep.tasks["q1"].client
    cases, rid = bad_tokens(dep)  # type: ignore[misc]
    client = dep.client("q1")
    for name, (token, why) in cases.items():
        # The helper's copy is honest: only the leader's check can refuse it.
        report = build(dep, q1, token, rid)
        with pytest.raises(UploadError) as e:
            client.upload_reports([report])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, name
        assert why in e.value.message, (name, e.value.message)
    assert dep.stored_reports("q1") == 0
    # The valid token is accepted once; the same report again is a duplicate,
    # and the token with another report under its id is refused.
    token = issue(keys()[0], q1.task_id, rid)
    report = build(dep, q1, token, rid)
    assert client.upload_reports([report]).accepted == 1
    assert client.upload_reports([report]).duplicates == 1
    with pytest.raises(UploadError) as e:
        client.upload_reports([build(dep, q1, token, rid)])
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS
    # The refusal names the token, not a report id to change.
    assert "invitation token was already spent on a report with other content" in (e.value.message)
    assert "fresh report id" not in e.value.message
    assert dep.stored_reports("q1") == 1


def test_a_task_without_invitations_refuses_a_token(dep: Deployment) -> None:
    task = dep.tasks["open"].client
    rid = secrets.token_bytes(REPORT_ID_SIZE)
    report = build(dep, task, b"", rid)
    client = dep.client("open")
    with pytest.raises(UploadError, match="takes no token"):
        client.upload_reports([dataclasses.replace(report, token=b"x" * TOKEN_SIZE)])
    assert client.upload_reports([report]).accepted == 1


def _verify_init(dep: Deployment, helper_token: bytes, rid: bytes) -> VerifyInitItem:
    helper_config = dep.client("q1").hpke_config(3)
    (item,) = honest_items(
        dep.tasks["q1"].leader,
        [1],
        helper_config,
        int(time.time()),
        report_ids=[rid],
        tokens=[helper_token],
    )
    return item


def test_the_helper_checks_tokens_with_the_leader_bypassed(dep: Deployment) -> None:
    files = dep.tasks["q1"]
    cases, rid = bad_tokens(dep)  # type: ignore[misc]
    inits = [_verify_init(dep, token, rid) for token, _ in cases.values()]
    good_rid = secrets.token_bytes(REPORT_ID_SIZE)
    good = _verify_init(dep, issue(keys()[0], files.leader.task_id, good_rid), good_rid)

    def job(items: list[VerifyInitItem]) -> list[helper_pb2.VerifyResp]:
        return aggregate(dep.helper.address, files.leader, items)

    for name, resp in zip(cases, job(inits), strict=True):
        assert resp.WhichOneof("result") == "reject", name
        assert resp.reject == helper_pb2.INVALID_TOKEN, name
    # Nothing of them was recorded: the same id with a valid token is new.
    store = SqliteDatastore(dep.local.root / "helper.db")
    try:
        assert store.seen_reports(files.leader.task_id, [rid]) == set()
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
    rids = [secrets.token_bytes(REPORT_ID_SIZE) for _ in range(3)]
    tokens = [issue(keys()[1], q2.task_id, r) for r in rids]
    reports = prepare_reports(
        q2,
        [1, 1, 0],
        client.hpke_config(2),
        client.hpke_config(3),
        int(time.time()),
        report_ids=rids,
        tokens=tokens,
    )
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

        def invited() -> Report:
            rid = secrets.token_bytes(REPORT_ID_SIZE)
            return build(dep, q1, issue(keys()[0], q1.task_id, rid), rid)

        assert client.upload_reports([invited(), invited()]).accepted == 2
        with pytest.raises(UploadError) as e:
            client.upload_reports([invited()])
        assert e.value.code == grpc.StatusCode.UNAVAILABLE  # the limit holds
        cases, rid = bad_tokens(dep)  # type: ignore[misc]
        for name, (token, why) in cases.items():
            with pytest.raises(UploadError) as e:
                client.upload_reports([build(dep, q1, token, rid)])
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, (name, e.value.message)
            assert why in e.value.message, (name, e.value.message)
        # A valid token ahead of a bad one in one upload: refused for the bad one.
        with pytest.raises(UploadError) as e:
            client.upload_reports([invited(), build(dep, q1, b"", rid)])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "report 1 " in e.value.message
        assert dep.stored_reports("q1") == 2
    finally:
        dep.stop()
