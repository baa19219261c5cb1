"""A token is bound to its report's content (issue 40, item 2), through real
processes on loopback: a leader, a helper and `veil survey issuer`.

Whoever sees a respondent's report in the clear on its way to the leader
(the page's server, a TLS-terminating proxy, the leader itself) holds its
token. Before this change the token was bound to the report id only, so
that party could upload an answer of its own under the respondent's report
id and token first: both aggregators took it, and the respondent's real
report was then refused as already uploaded. Now the token's challenge
commits to the report's time, public share and both sealed shares: the
substituted answer is refused by the leader at upload and by the helper on
its own (the leader bypassed, as a leader that let it through would send
it), and the respondent's real report is accepted and aggregated after."""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.support.deployment import Deployment, start_deployment
from tests.support.helper_rpc import aggregate, honest_items
from tests.support.times import past_bucket
from veil.aggregator.store.sqlite import SqliteDatastore
from veil.client import UploadError, prepare_reports
from veil.client.prepare import seal_report
from veil.collector import text_agg_param
from veil.invite import blindrsa
from veil.invite.client import redeem
from veil.invite.issuer import mint, write_keys
from veil.invite.token import PendingToken, public_key_bytes, report_context
from veil.local.launcher import free_port
from veil.messages import Ciphertext, Report, vdaf_ctx
from veil.protocol.v1 import helper_pb2
from veil.task import DpSpec, VdafSpec
from veil.vdaf.batch.prio3 import BatchPrio3

pytestmark = pytest.mark.slow

TP = 3600


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Deployment, str, Path]]:
    """A deployment of one choice question (a histogram: its public share is
    not empty) with invitations, and its issuer's URL."""
    tmp = tmp_path_factory.mktemp("binding")
    key = blindrsa.generate_key()
    dep = start_deployment(
        tmp / "dep",
        {
            "q": (
                VdafSpec("histogram", length=4, chunk_length=2),
                DpSpec("none"),
                {"time_precision": TP, "min_batch_size": 1,
                 "issuer_public_key": public_key_bytes(key.public_key())},
            )
        },
    )  # fmt: skip
    issuer_dir = tmp / "issuer"
    issuer_dir.mkdir()
    write_keys(issuer_dir, [key])
    port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(issuer_dir),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert issuer.stdout is not None and "issuing on" in issuer.stdout.readline()
        yield dep, f"http://127.0.0.1:{port}/invitation", issuer_dir
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
        dep.stop()


def respondent_report(dep: Deployment, url: str, issuer_dir: Path, answer: int) -> Report:
    """What an invited respondent sends: its report sealed, then a token
    redeemed from the real issuer for it."""
    task = dep.tasks["q"].client
    client = dep.client("q")
    (sealed,) = prepare_reports(
        task, [answer], client.hpke_config(2), client.hpke_config(3), int(time.time()),
        invited=True,
    )  # fmt: skip
    (code,) = mint(issuer_dir, 1)
    (report,) = redeem(url, code, [task], [sealed])
    assert report is not None and report.token
    return report


def shares(dep: Deployment, report_id: bytes, answer: int) -> tuple[bytes, bytes, bytes]:
    """(public share, leader share, helper share) of `answer`, sharded as an
    honest client shards it under `report_id` (a valid proof)."""
    task = dep.tasks["q"].client
    batch = BatchPrio3(task.vdaf.instantiate())
    sharded = batch.shard_batch(
        vdaf_ctx(task.task_id), [answer], [report_id], [secrets.token_bytes(batch.vdaf.RAND_SIZE)]
    )
    return sharded.public_shares[0], sharded.input_shares[0][0], sharded.input_shares[1][0]


def substitutes(dep: Deployment, real: Report) -> dict[str, Report]:
    """Answers of the attacker's own under the respondent's report id and
    token: a whole report of its own, and the respondent's report with the
    helper's share (or the public share) replaced."""
    task = dep.tasks["q"].client
    client = dep.client("q")
    leader_cfg, helper_cfg = client.hpke_config(2), client.hpke_config(3)
    public, leader_share, helper_share = shares(dep, real.report_id, 3)
    own = seal_report(
        task.task_id, real.report_id, real.time, public, leader_share, helper_share,
        leader_cfg, helper_cfg, real.token,
    )  # fmt: skip
    other_helper = seal_report(
        task.task_id, real.report_id, real.time, real.public_share, b"", helper_share,
        leader_cfg, helper_cfg, real.token,
    ).helper_ct  # fmt: skip
    ct = real.helper_ct
    return {
        "its own report": own,
        "another helper share": dataclasses.replace(real, helper_ct=other_helper),
        "a spoiled helper share": dataclasses.replace(
            real, helper_ct=Ciphertext(ct.config_id, ct.enc, bytes(len(ct.payload)))
        ),
        "another public share": dataclasses.replace(real, public_share=public),
        "another time": dataclasses.replace(real, time=real.time - TP),
    }


def helper_seen(dep: Deployment, report_id: bytes) -> bool:
    store = SqliteDatastore(dep.local.root / "helper.db")
    try:
        return bool(store.seen_reports(dep.tasks["q"].client.task_id, [report_id]))
    finally:
        store.close()


def test_an_answer_substituted_under_a_captured_token_is_refused_by_both_aggregators(
    site: tuple[Deployment, str, Path],
) -> None:
    dep, url, issuer_dir = site
    client = dep.client("q")
    real = respondent_report(dep, url, issuer_dir, 1)

    # At the leader's front, with the captured token: refused for the token,
    # nothing stored.
    for name, fake in substitutes(dep, real).items():
        with pytest.raises(UploadError) as e:
            client.upload_reports([fake])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, (name, e.value.message)
        assert "invalid invitation token" in e.value.message, (name, e.value.message)
        assert "other content under this report id" in e.value.message, (name, e.value.message)
    assert dep.stored_reports("q") == 0

    # At the helper, the leader bypassed (a leader that took the substitute
    # would send it so): the attacker's shares with the respondent's token,
    # whether the leader's digest is of the attacker's leader share (the
    # truth) or of the respondent's (a lie covering the helper's part).
    leader = dep.tasks["q"].leader
    helper_cfg = client.hpke_config(3)
    own = honest_items(leader, [3], helper_cfg, real.time, tokens=lambda r: real.token)[0]
    lying = own._replace(report_id=real.report_id, leader_share_digest=real.leader_share_digest)
    verdicts = aggregate(dep.helper.address, leader, [own, lying])
    assert [v.reject for v in verdicts] == [helper_pb2.INVALID_TOKEN] * 2
    assert not helper_seen(dep, real.report_id)

    # The respondent's real report: accepted by the leader, aggregated by the helper.
    assert client.upload_reports([real]).accepted == 1
    deadline = time.monotonic() + 120
    while not helper_seen(dep, real.report_id):
        assert time.monotonic() < deadline, "the helper never aggregated the real report"
        time.sleep(0.2)
    # The helper's only rejections are the two substitutes sent to it above.
    assert dep.rejections("helper", "q") == {"invalid_token": 2}
    assert dep.rejections("leader", "q") == {}
    # Its token spent, a substitute sent after it is refused all the same.
    with pytest.raises(UploadError) as e:
        client.upload_reports([substitutes(dep, real)["its own report"]])
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert dep.stored_reports("q") == 1


def test_text_answers_by_invitation_pass_both_rounds_and_a_substitute_is_refused(
    tmp_path: Path,
) -> None:
    """A text question (Poplar1, two rounds a level) with invitations: the
    leader sends each report's token and its share's digest in both rounds,
    the helper checks them in each, and a level is collected from the
    invited reports; a substitute under a captured token is refused at
    upload."""
    key = blindrsa.generate_key()
    signer = blindrsa.Signer(key)
    settings = {"time_precision": TP, "min_batch_size": 2,
                "issuer_public_key": public_key_bytes(key.public_key())}  # fmt: skip
    dep = start_deployment(
        tmp_path / "dep", {"text": (VdafSpec("poplar1", bits=16), DpSpec("none"), settings)}
    )
    try:
        task = dep.tasks["text"].client
        client = dep.client("text")
        t = past_bucket(2)
        sealed = prepare_reports(
            task, [b"hi", b"hi", b"ho"], client.hpke_config(2), client.hpke_config(3), t,
            invited=True,
        )  # fmt: skip

        def token(r: Report) -> bytes:
            pending = PendingToken.start(
                public_key_bytes(key.public_key()), report_context(task.task_id, r)
            )
            return pending.finish(signer.blind_sign(pending.blinded_msg))

        reports = [dataclasses.replace(r, token=token(r)) for r in sealed]
        (other,) = prepare_reports(
            task, [b"xy"], client.hpke_config(2), client.hpke_config(3), t,
            report_ids=[reports[0].report_id], invited=True,
        )  # fmt: skip
        with pytest.raises(UploadError) as e:
            client.upload_reports([dataclasses.replace(other, token=reports[0].token)])
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert "other content under this report id" in e.value.message
        assert client.upload_reports(reports).accepted == 3
        with dep.collector("text") as collector:
            level = collector.collect_prefixes(t, TP, text_agg_param([b"h", b"x"]), wait=120)
        assert (level.noisy_counts, level.report_count) == ([3, 0], 3)
        assert dep.rejections("helper", "text") == {}
        assert dep.rejections("leader", "text") == {}
    finally:
        dep.stop()
