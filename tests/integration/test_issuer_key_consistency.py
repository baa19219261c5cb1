"""Key consistency (issue 40, item 4): an issuer that gives one respondent a
key of its own could mark that respondent's tokens, so the respondent's
client checks the issuer keys it is given against the fingerprint the survey
published (`veil survey deploy` and `veil survey invite` print it; links
carry it) before it redeems anything, and the aggregators, which pin the
survey's keys, refuse a token made under another key each on its own.

Real processes on loopback: a deployment's leader and helper, and a
malicious `veil survey issuer` holding a fresh key for one question, whose
operator also hands this respondent client files naming that key."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.invite.test_issuer import SURVEY, used
from tests.support.helper_rpc import aggregate, honest_items
from veil.cli.invite import issuer_keys_fingerprint
from veil.client import Client, SurveyClient, UploadError, prepare_reports
from veil.deploy import deploy_survey
from veil.invite import blindrsa
from veil.invite.client import redeem
from veil.invite.issuer import mint, read_keys, write_keys
from veil.invite.token import keys_fingerprint, public_key_bytes
from veil.local.launcher import ServerProcess, free_port
from veil.messages import Report
from veil.protocol.v1 import helper_pb2
from veil.survey import SurveyError, load_description, parse_survey
from veil.task import LeaderTask, b64e, load_task
from veil.times import format_time

pytestmark = pytest.mark.slow


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    opens = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(opens), closes=format_time(opens + 3600))
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = deploy_survey(parse_survey(text), text, tmp_path / "out", leader, helper, tls=False)
    servers = [
        ServerProcess("helper", dep.helper_config, tmp_path / "helper.log", helper),
        ServerProcess("leader", dep.leader_config, tmp_path / "leader.log", leader),
    ]
    try:
        for s in servers:
            s.start()
        yield dep.out, helper
    finally:
        for s in reversed(servers):
            s.stop()


def test_a_fresh_issuer_key_for_one_respondent_is_refused(
    deployment: tuple[Path, str], tmp_path: Path
) -> None:
    out, helper_address = deployment
    published = issuer_keys_fingerprint(out / "issuer")
    genuine = read_keys(out / "issuer")
    fresh = blindrsa.generate_key()
    # The malicious issuer: question a's key is its own.
    evil = tmp_path / "evil" / "issuer"
    evil.mkdir(parents=True)
    write_keys(evil, [fresh, genuine[1]])
    (code,) = mint(evil, 1)
    # The client files its operator hands this respondent name that key.
    respondent = tmp_path / "respondent"
    shutil.copytree(out / "client", respondent)
    task_file = respondent / "a.toml"
    fresh_der = public_key_bytes(fresh.public_key())
    text, n = re.subn(
        r'(?m)^issuer_public_key = ".*"$',
        f'issuer_public_key = "{b64e(fresh_der)}"',
        task_file.read_text(),
    )
    assert n == 1
    task_file.write_text(text)
    marked = keys_fingerprint([fresh_der, public_key_bytes(genuine[1].public_key())])

    port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(evil),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/invitation"
    try:
        assert issuer.stdout is not None and "issuing on" in issuer.stdout.readline()
        # The client refuses before redeeming: the invitation stays unused.
        with pytest.raises(SurveyError) as refused:
            SurveyClient(respondent, invitation=code, issuer=url, issuer_keys=published)
        message = str(refused.value)
        assert f"fingerprint {marked}, not the survey's published {published}" in message
        assert "Nothing was sent and the invitation is unused" in message
        assert used(evil.parent) == 0
        # The command line says the same, exit 2.
        cli = subprocess.run(
            [sys.executable, "-m", "veil.cli", "survey", "respond", "--survey-dir",
             str(respondent), "--invitation", code, "--issuer", url, "--issuer-keys",
             published.upper()],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cli.returncode == 2 and marked in cli.stderr, cli.stderr
        assert used(evil.parent) == 0
        # The genuine files pass, in any common spelling of the fingerprint.
        spelled = ":".join(published[i : i + 2] for i in range(0, 64, 2)).upper()
        SurveyClient(out / "client", invitation=code, issuer=url, issuer_keys=spelled).close()
        # Hostile fingerprints are refused as such.
        for bad in ("", "zz" * 32, published[:-1], published + "0"):
            with pytest.raises(SurveyError, match="not an issuer keys fingerprint"):
                SurveyClient(out / "client", invitation=code, issuer=url, issuer_keys=bad)

        # A token made anyway, by a client that does not check: both
        # aggregators refuse it, the helper with the leader bypassed.
        tasks = load_description(respondent).load_tasks()
        leader_task = load_task(out / "leader" / "tasks" / "a.toml", LeaderTask)
        with Client(tasks["a"]) as client:
            leader_config, helper_config = client.hpke_config(2), client.hpke_config(3)
            now = int(time.time())

            # The helper's item carries a token redeemed for its own report.
            def token_for(r: Report) -> bytes:
                (got, _) = redeem(url, codes.pop(), [tasks["a"], tasks["b"]], [r, None])
                assert got is not None
                return got.token

            codes = [code]
            (item,) = honest_items(leader_task, [1], helper_config, now, tokens=token_for)
            (verdict,) = aggregate(helper_address, leader_task, [item])
            assert verdict.WhichOneof("result") == "reject"
            assert verdict.reject == helper_pb2.INVALID_TOKEN
            (sealed,) = prepare_reports(
                tasks["a"], [1], leader_config, helper_config, now, invited=True
            )
            codes = mint(evil, 1)
            (report, _) = redeem(url, codes.pop(), [tasks["a"], tasks["b"]], [sealed, None])
            assert report is not None
            with pytest.raises(UploadError) as e:
                client.upload_reports([report])
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "another issuer key" in e.value.message
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
