"""A survey with invitations run as its parties run it, each step a real
`veil` process: deploy (`invitations = true`), the two servers, `veil survey
invite`, `veil survey issuer`, respondents answering with their invitations,
a second answer with a used invitation refused, uploads without a token
refused by the leader and by the helper, collection, and the report stating
the per-respondent guarantee. Neither aggregator's database holds a code. The
survey has a breakdown, which takes its own token from the same invitation."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from tests.support.cli import veil
from tests.support.helper_rpc import aggregate, honest_items
from tests.support.survey_toml import remote, team
from tests.support.window import LONG_WINDOW, close_survey
from veil.client import Client, UploadError, prepare_reports
from veil.local.launcher import ServerProcess, free_port
from veil.protocol.v1 import helper_pb2
from veil.task import ClientTask, LeaderTask, load_task
from veil.times import format_time

pytestmark = pytest.mark.slow

TP = 2
N = 3
SURVEY = (
    """
[survey]
name = "Invited"
epsilon = 2
min_batch_size = {n}
invitations = true
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

"""
    + remote()
    + "\n"
    + team(("engineering", "design"))
    + """
[[breakdown]]
id = "remote_by_team"
question = "remote"
by = "team"
"""
)


def test_survey_with_invitations_through_the_cli(tmp_path: Path) -> None:
    # Open for an hour, and closed once the respondents are done
    # (tests/support/window.py): the deployment, two mintings, three servers'
    # starts and six respondents' processes run inside the window, and
    # outlasted a window sized to fit them when the suite ran beside two
    # CPU-bound processes.
    opens = int(time.time()) // TP * TP
    closes = opens + LONG_WINDOW
    survey = tmp_path / "survey.toml"
    survey.write_text(
        SURVEY.format(n=N, tp=TP, opens=format_time(opens), closes=format_time(closes))
    )
    leader, helper = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    dep = tmp_path / "dep"
    out = veil(
        "survey", "deploy", "--survey", survey, "--out", dep,
        "--leader", leader, "--helper", helper, "--no-tls",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "one respondent: one invitation" in out.stdout
    assert "veil survey invite" in out.stdout
    description = json.loads((dep / "client" / "survey.json").read_text())
    assert description["invitations"] is True
    assert all("issuer_public_key" in q for q in description["questions"])
    # One token per breakdown too, under its own issuer key.
    assert all("issuer_public_key" in b for b in description["breakdowns"])

    codes_file = tmp_path / "codes.txt"
    minted = veil("survey", "invite", dep, "--count", str(N + 1), "--out", codes_file)
    assert minted.returncode == 0, minted.stderr
    codes = codes_file.read_text().split()
    assert len(codes) == N + 1 and len(set(codes)) == N + 1
    links = veil(
        "survey", "invite", dep, "--count", "1", "--out", tmp_path / "links.txt",
        "--link", "https://survey.example/",
    )  # fmt: skip
    assert links.returncode == 0, links.stderr
    assert (tmp_path / "links.txt").read_text().startswith("https://survey.example/#invitation=")

    servers = [
        ServerProcess(role, dep / role / f"{role}.toml", tmp_path / f"{role}.log", address)
        for role, address in (("helper", helper), ("leader", leader))
    ]
    issuer_port = free_port()
    issuer = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(dep),
         "--listen", f"127.0.0.1:{issuer_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        for s in servers:
            s.start()
        assert issuer.stdout is not None
        assert "issuing on" in issuer.stdout.readline()
        url = f"http://127.0.0.1:{issuer_port}/invitation"

        def respond(answers: dict[str, object], *extra: str) -> subprocess.CompletedProcess[str]:
            f = tmp_path / f"answers-{secrets.token_hex(4)}.json"
            f.write_text(json.dumps(answers))
            cmd = ["survey", "respond", "--survey-dir", dep / "client", "--answers", f]
            result: subprocess.CompletedProcess[str] = veil(*cmd, *extra)
            return result

        for i, code in enumerate(codes[:N]):
            team = "design" if i == 0 else "engineering"
            done = respond(
                {"remote": i % 2 == 0, "team": team}, "--invitation", code, "--issuer", url
            )
            assert done.returncode == 0, done.stderr
            assert "remote: 1, team: 1, remote_by_team: 1" in done.stdout
        # A second answer with a used invitation, an unknown one, none at all.
        again = respond({"remote": True, "team": "design"}, "--invitation", codes[0],
                        "--issuer", url)  # fmt: skip
        assert again.returncode == 1
        assert "This invitation has already been used." in again.stderr
        unknown = respond({"remote": True}, "--invitation", "not-a-code", "--issuer", url)
        assert unknown.returncode == 1 and "This invitation is not valid" in unknown.stderr
        none = respond({"remote": True})
        assert none.returncode == 2 and "invited respondents only" in none.stderr

        # Uploads without a token: refused by the leader...
        task = load_task(dep / "client" / "remote.toml", ClientTask)
        with Client(task) as client:
            # The client itself refuses to build one; a hand-made report...
            with pytest.raises(ValueError, match="invited respondents only"):
                client.upload(1)
            configs = (client.hpke_config(2), client.hpke_config(3))
            bare = prepare_reports(task, [1], *configs, int(time.time()), invited=True)
            with pytest.raises(UploadError) as e:
                client.upload_reports(bare)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert "no invitation token" in e.value.message
        # ...and by the helper, with the leader bypassed.
        leader_task = load_task(dep / "leader" / "tasks" / "remote.toml", LeaderTask)
        items = honest_items(leader_task, [1], configs[1], int(time.time()), tokens=lambda r: b"")
        (resp,) = aggregate(helper, leader_task, items)
        assert resp.reject == helper_pb2.INVALID_TOKEN

        close_survey(dep, servers)
        results = tmp_path / "results"
        collected = veil(
            "survey", "collect", "--survey-dir", dep / "collector", "--out", results, timeout=180
        )
        assert collected.returncode == 0, collected.stderr
        for q in json.loads((results / "results.json").read_text()):
            assert q["n"] == N, q
        report = (results / "report.html").read_text()
        assert "one respondent: one invitation, at most one report per question" in report
        assert issuer.poll() is None
    finally:
        issuer.terminate()
        issuer.wait(timeout=20)
        if issuer.stdout is not None:
            issuer.stdout.close()
        for s in servers:
            s.stop()
    # No invitation code in either aggregator's database, nor in clear at the issuer.
    for db in (
        (dep / "leader").glob("leader.db*"),
        (dep / "helper").glob("helper.db*"),
        (dep / "issuer").glob("issuer.db*"),
    ):
        for path in db:
            data = path.read_bytes()
            for code in codes:
                assert code.encode() not in data, path
