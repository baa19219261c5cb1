"""The issuer (veil.invite.issuer) on a real SQLite file, and its HTTP
endpoint in a real `veil survey issuer` process on loopback: burning and
signing are one unit of work, a retry gets the same signatures, a second use
is refused, and every hostile request gets a clear 4xx with nothing stored."""

from __future__ import annotations

import base64
import json
import secrets
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from veil.client import SurveyClient
from veil.deploy import deploy_survey
from veil.invite import blindrsa
from veil.invite.client import InvitationError, redeem
from veil.invite.issuer import DB_FILE, USED_MESSAGE, Issuer, IssuerError, mint
from veil.local.launcher import free_port
from veil.survey import parse_survey
from veil.task import ClientTask, load_task
from veil.times import format_time

SURVEY = """
[survey]
name = "Invited"
epsilon = 1
min_batch_size = 1
invitations = true
time_precision = 60
opens = "{opens}"
closes = "{closes}"

[[question]]
id = "a"
text = "A?"
kind = "yes_no"

[[question]]
id = "b"
text = "B?"
kind = "yes_no"
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("issuer") / "dep"
    opens = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(opens), closes=format_time(opens + 3600))
    deploy_survey(parse_survey(text), text, out, "127.0.0.1:1", "127.0.0.1:2", tls=False)
    return out


def tasks(deployment: Path) -> list[ClientTask]:
    return [load_task(deployment / "client" / f"{q}.toml", ClientTask) for q in ("a", "b")]


def blinded(deployment: Path) -> list[bytes]:
    from veil.invite.token import PendingToken

    return [
        PendingToken.start(t.issuer_public_key or b"", secrets.token_bytes(32)).blinded_msg
        for t in tasks(deployment)
    ]


def used(deployment: Path) -> int:
    with sqlite3.connect(deployment / "issuer" / DB_FILE) as db:
        n: int = db.execute("SELECT COUNT(used) FROM invitations").fetchone()[0]
    return n


def test_deploy_puts_one_key_per_question_in_every_task_file(deployment: Path) -> None:
    keys = set()
    for role_dir in ("leader/tasks", "helper/tasks", "collector", "client"):
        for q in ("a", "b"):
            text = (deployment / role_dir / f"{q}.toml").read_text()
            assert "issuer_public_key" in text
            keys.add((q, text.split("issuer_public_key = ")[1].split("\n")[0]))
    assert len(keys) == 2  # the same key in every role's file, one per question
    assert (deployment / "issuer" / "keys.pem").stat().st_mode & 0o077 == 0


def test_redeem_burns_once_and_a_retry_gets_the_same_signatures(deployment: Path) -> None:
    (code,) = mint(deployment / "issuer", 1)
    issuer = Issuer(deployment / "issuer")
    request = blinded(deployment)
    before = used(deployment)
    sigs = issuer.redeem(code, request)
    assert len(sigs) == 2 and used(deployment) == before + 1
    assert issuer.redeem(code, request) == sigs  # the answer was lost: the same again
    with pytest.raises(IssuerError, match=USED_MESSAGE):
        issuer.redeem(code, blinded(deployment))
    assert used(deployment) == before + 1


def test_a_failure_while_signing_burns_nothing(
    deployment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (code,) = mint(deployment / "issuer", 1)
    issuer = Issuer(deployment / "issuer")
    before = used(deployment)

    def crash(blinded_msg: bytes) -> bytes:
        raise RuntimeError("power cut while signing")

    monkeypatch.setattr(issuer.signers[1], "blind_sign", crash)
    with pytest.raises(RuntimeError):
        issuer.redeem(code, blinded(deployment))
    assert used(deployment) == before
    monkeypatch.undo()
    assert len(Issuer(deployment / "issuer").redeem(code, blinded(deployment))) == 2


def race(issuer: Issuer, code: str, requests: list[list[bytes]]) -> list[list[bytes] | str]:
    """Redeems `code` once per request, all at once from as many threads:
    each one's signatures, or the message it was refused with."""
    barrier = threading.Barrier(len(requests))

    def one(request: list[bytes]) -> list[bytes] | str:
        barrier.wait()
        try:
            return issuer.redeem(code, request)
        except IssuerError as e:
            return str(e)

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


def test_concurrent_redemptions_of_one_invitation_get_one_set_of_signatures(
    deployment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    issuer = Issuer(deployment / "issuer")
    # Each redemption signs only once the other has come to sign too, or has
    # been answered. Where both read the invitation as unused, both sign
    # before either's burn decides: the one decided second has its
    # signatures dropped and is refused. The burn is committed while the
    # first signs, so the other may instead read it as used and be refused
    # at once; either way one set of signatures leaves.
    sign = issuer.signers[0].blind_sign
    redeem = issuer.redeem
    turn = threading.Condition()
    signing = answered = 0

    def sign_after_the_other(blinded_msg: bytes) -> bytes:
        nonlocal signing
        with turn:
            signing += 1
            turn.notify_all()
            turn.wait_for(lambda: signing >= 2 or answered >= 1, timeout=60)
        return sign(blinded_msg)

    def redeem_then_say(code: str, request: list[bytes]) -> list[bytes]:
        nonlocal answered
        try:
            return redeem(code, request)
        finally:
            with turn:
                answered += 1
                turn.notify_all()

    monkeypatch.setattr(issuer.signers[0], "blind_sign", sign_after_the_other)
    monkeypatch.setattr(issuer, "redeem", redeem_then_say)
    (code,) = mint(deployment / "issuer", 1)
    before = used(deployment)
    a, b = blinded(deployment), blinded(deployment)
    results = race(issuer, code, [a, b])
    winners = [r for r in results if not isinstance(r, str)]
    assert len(winners) == 1 and results.count(USED_MESSAGE) == 1
    winner = a if results[0] == winners[0] else b
    loser = b if winner is a else a
    monkeypatch.undo()
    assert issuer.redeem(code, winner) == winners[0]  # a retry: the same ones
    with pytest.raises(IssuerError, match=USED_MESSAGE):
        issuer.redeem(code, loser)
    assert used(deployment) == before + 1

    # Many at once, each invitation asked for by two clients with the same
    # blinded messages (a retry) and two with others: per invitation one set
    # of signatures leaves, to the requests with the winner's messages.
    codes = mint(deployment / "issuer", 6)
    for code in codes:
        a, b = blinded(deployment), blinded(deployment)
        results = race(issuer, code, [a, a, b, b])
        answered = [r for r in results if not isinstance(r, str)]
        assert answered and all(r == answered[0] for r in answered)
        assert results.count(USED_MESSAGE) == 4 - len(answered)
        assert len(answered) == 2  # both requests of the winner, neither of the other
        winner = a if results[0] == answered[0] else b
        assert issuer.redeem(code, winner) == answered[0]
    assert used(deployment) == before + 1 + len(codes)


def test_hostile_redemptions_are_refused_and_burn_nothing(deployment: Path) -> None:
    (code,) = mint(deployment / "issuer", 1)
    issuer = Issuer(deployment / "issuer")
    good = blinded(deployment)
    n = blindrsa.K_LEN
    modulus = tasks(deployment)[0]
    from veil.invite.token import load_public_key

    big = load_public_key(modulus.issuer_public_key or b"").public_numbers().n.to_bytes(n, "big")
    before = used(deployment)
    for code_, request, why in (
        ("not-a-code", good, "not valid"),
        ("", good, "not valid"),
        ("x" * 65, good, "not valid"),
        (code, good[:1], "one blinded message per question"),
        (code, [*good, good[0]], "one blinded message per question"),
        (code, [good[0][:-1], good[1]], "must be 256 bytes"),
        (code, [big, good[1]], "below the modulus"),
    ):
        with pytest.raises(IssuerError, match=why):
            issuer.redeem(code_, request)
    assert used(deployment) == before


@pytest.fixture(scope="module")
def issuer_url(deployment: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir",
         str(deployment / "issuer"), "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "issuing on" in proc.stdout.readline()
        yield f"http://127.0.0.1:{port}/invitation"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if proc.stdout is not None:
            proc.stdout.close()


def _post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    request = urllib.request.Request(url, body, {"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def test_the_http_endpoint_refuses_hostile_input(deployment: Path, issuer_url: str) -> None:
    (code,) = mint(deployment / "issuer", 1)
    good = [_b64(b) for b in blinded(deployment)]
    before = used(deployment)
    for body, content_type, status, why in (
        (b"{", "application/json", 400, "not JSON"),
        (b"[]", "application/json", 400, "must be"),
        (json.dumps({"invitation": code}).encode(), "application/json", 400, "must be"),
        (json.dumps({"invitation": 5, "blinded": good}).encode(), "application/json", 400, "text"),
        (json.dumps({"invitation": code, "blinded": ["***", good[1]]}).encode(),
         "application/json", 400, "base64url"),
        (json.dumps({"invitation": code, "blinded": good[:1]}).encode(),
         "application/json", 400, "one blinded message per question"),
        (json.dumps({"invitation": "unknown", "blinded": good}).encode(),
         "application/json", 403, "not valid"),
        (json.dumps({"invitation": code, "blinded": good}).encode(), "text/plain", 415, "json"),
        (b"{" + b" " * 10_000 + b"}", "application/json", 413, "larger than"),
    ):  # fmt: skip
        got, answer = _post(issuer_url, body, content_type)
        assert (got, why in answer["error"]) == (status, True), (body[:60], answer)
    assert used(deployment) == before
    got, answer = _post(issuer_url, json.dumps({"invitation": code, "blinded": good}).encode())
    assert got == 200 and len(answer["blind_signatures"]) == 2


def test_a_respondent_redeems_once(deployment: Path, issuer_url: str) -> None:
    (code,) = mint(deployment / "issuer", 1)
    # Two questions, both left unanswered: the issuer signs a token for each.
    assert redeem(issuer_url, code, tasks(deployment), [None, None]) == [None, None]
    with pytest.raises(InvitationError, match=USED_MESSAGE):
        redeem(issuer_url, code, tasks(deployment), [None, None])
    with pytest.raises(Exception, match="invited respondents only"):
        SurveyClient(deployment / "client")


def test_the_page_refuses_a_survey_with_invitations(deployment: Path) -> None:
    from veil.web import ServeError, SurveySite

    with pytest.raises(ServeError, match="invited respondents only"):
        SurveySite(deployment / "client")


def test_invite_cli_refuses_bad_arguments_and_mints_nothing(
    deployment: Path, tmp_path: Path
) -> None:
    def veil(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "veil.cli", "survey", "invite", *map(str, args)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    Issuer(deployment / "issuer")  # the database, created empty if none yet
    with sqlite3.connect(deployment / "issuer" / DB_FILE) as db:
        before = db.execute("SELECT COUNT(*) FROM invitations").fetchone()[0]
    existing = tmp_path / "exists.txt"
    existing.write_text("keep\n")
    for args, why in (
        ((deployment, "--count", "0", "--out", tmp_path / "a"), "--count must be"),
        ((deployment, "--count", "2000000", "--out", tmp_path / "a"), "--count must be"),
        ((deployment, "--count", "1", "--out", existing), "already exists"),
        ((deployment, "--count", "1", "--out", tmp_path / "a", "--link", "ftp://x/"), "--link"),
        ((deployment, "--count", "1", "--out", tmp_path / "a", "--link", "https://x/#y"), "--link"),
        ((tmp_path, "--count", "1", "--out", tmp_path / "a"), "holds no issuer keys"),
    ):
        done = veil(*args)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr)
    assert existing.read_text() == "keep\n" and not (tmp_path / "a").exists()
    with sqlite3.connect(deployment / "issuer" / DB_FILE) as db:
        assert db.execute("SELECT COUNT(*) FROM invitations").fetchone()[0] == before
    done = veil(deployment, "--count", "3", "--out", tmp_path / "codes")
    assert done.returncode == 0, done.stderr
    codes = (tmp_path / "codes").read_text().split()
    assert len(set(codes)) == 3 and all(len(c) == 22 for c in codes)
    assert (tmp_path / "codes").stat().st_mode & 0o077 == 0


def test_no_code_starts_with_a_dash(tmp_path: Path) -> None:
    # `veil survey respond --invitation -abc...` would read the code as an
    # option; without the rule about 1 code in 64 would start with "-".
    codes = mint(tmp_path, 2000)
    assert len(set(codes)) == 2000
    assert not [c for c in codes if c.startswith("-")]
    assert all(len(c) == 22 for c in codes)
