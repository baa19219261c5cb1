"""The issuer under faults and abuse (issue 40, item 7), each through a real
`veil survey issuer` process or a real SQLite file: refused redemptions are
limited per address (429 with Retry-After, other addresses unaffected), the
invitation client sends its request again on the issuer's transient errors
(and never on a refusal), and an issuer that cannot write its issuer.db
refuses to start, or, if it loses write access while running, answers 503
with nothing used rather than a bare 500."""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.invite.test_issuer import SURVEY, _b64, blinded, tasks, used
from tests.support.modes import unavailable
from veil.deploy import deploy_survey
from veil.invite.client import InvitationError, redeem
from veil.invite.http import FAILURES_BURST
from veil.invite.issuer import (
    DB_FILE,
    UNAVAILABLE_MESSAGE,
    UNKNOWN_MESSAGE,
    InvitationUsed,
    Issuer,
    IssuerError,
    IssuerUnavailable,
    mint,
)
from veil.invite.token import PendingToken
from veil.local.launcher import free_port
from veil.survey import parse_survey
from veil.times import format_time


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    out = tmp_path / "dep"
    opens = int(time.time()) // 60 * 60
    text = SURVEY.format(opens=format_time(opens), closes=format_time(opens + 3600))
    deploy_survey(parse_survey(text), text, out, "127.0.0.1:1", "127.0.0.1:2", tls=False)
    mint(out / "issuer", 1)  # issuer.db exists
    return out


def _start_issuer(issuer_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "veil.cli", "survey", "issuer", "--issuer-dir", str(issuer_dir),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@contextmanager
def running_issuer(issuer_dir: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = free_port()
    proc = _start_issuer(issuer_dir, port)
    try:
        assert proc.stdout is not None
        assert "issuing on" in proc.stdout.readline()
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _post(
    port: int, body: dict[str, Any], source: str = "127.0.0.1"
) -> tuple[int, dict[str, Any], str | None]:
    """POST /invitation from `source` (an address of 127.0.0.0/8)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("POST", "/invitation", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read()), r.getheader("Retry-After")
    finally:
        conn.close()


def test_refused_redemptions_are_limited_per_address(deployment: Path) -> None:
    (code,) = mint(deployment / "issuer", 1)
    good = [_b64(b) for b in blinded(deployment)]
    with running_issuer(deployment / "issuer") as (port, _):
        statuses = []
        for i in range(3 * FAILURES_BURST):
            status, answer, retry = _post(port, {"invitation": f"guess{i}", "blinded": good})
            statuses.append(status)
            if status == 429:
                assert "too many invalid or used invitations" in answer["error"]
                assert retry is not None and int(retry) >= 1
            else:
                assert answer["error"] == UNKNOWN_MESSAGE
        assert statuses == [403] * FAILURES_BURST + [429] * (2 * FAILURES_BURST)
        # The guessing address waits, a code included; another address does not.
        assert _post(port, {"invitation": code, "blinded": good})[0] == 429
        assert used(deployment) == 0
        status, answer, _ = _post(port, {"invitation": code, "blinded": good}, "127.0.0.2")
        assert status == 200 and len(answer["blind_signatures"]) == 2
        # Hostile input from a fresh address is refused as before, and malformed
        # requests (400) take none of its allowance.
        for _ in range(2 * FAILURES_BURST):
            assert _post(port, {"invitation": 5, "blinded": good}, "127.0.0.3")[0] == 400
        assert _post(port, {"invitation": "x", "blinded": good}, "127.0.0.3")[0] == 403


class _Flaky(http.server.ThreadingHTTPServer):
    """A proxy before the real issuer that answers the first `failures`
    requests itself with `status` (a load balancer whose issuer restarts)."""

    def __init__(self, upstream: int, failures: int, status: int, retry_after: str | None):
        self.upstream, self.failures, self.status = upstream, failures, status
        self.retry_after = retry_after
        self.requests = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _FlakyHandler)


class _FlakyHandler(http.server.BaseHTTPRequestHandler):
    server: _Flaky

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests += 1
            fail = self.server.requests <= self.server.failures
        if fail:
            status, data = self.server.status, b'{"error": "the issuer is restarting"}'
        else:
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.server.upstream}/invitation",
                body,
                {"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    status, data = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, data = e.code, e.read()
        self.send_response(status)
        if fail and self.server.retry_after is not None:
            self.send_header("Retry-After", self.server.retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def flaky(upstream: int, failures: int, status: int, retry_after: str | None = None):  # type: ignore[no-untyped-def]
    server = _Flaky(upstream, failures, status, retry_after)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("status", "retry_after"), [(503, None), (502, None), (500, None), (429, "1")]
)
def test_the_client_resends_on_the_issuers_transient_errors(
    deployment: Path, status: int, retry_after: str | None
) -> None:
    (code,) = mint(deployment / "issuer", 1)
    with running_issuer(deployment / "issuer") as (port, _):
        with flaky(port, 2, status, retry_after) as proxy:
            url = f"http://127.0.0.1:{proxy.server_address[1]}/invitation"
            began = time.monotonic()
            tickets = redeem(url, code, tasks(deployment), [None, None], attempts=3, backoff=0.01)
            assert len(tickets) == 2 and proxy.requests == 3
            if retry_after is not None:  # the issuer's advice was followed
                assert time.monotonic() - began >= 2 * float(retry_after)
        # Too many in a row: the issuer's own message, after `attempts` requests.
        (other,) = mint(deployment / "issuer", 1)
        with flaky(port, 5, status) as proxy:
            url = f"http://127.0.0.1:{proxy.server_address[1]}/invitation"
            with pytest.raises(InvitationError, match="the issuer is restarting"):
                redeem(url, other, tasks(deployment), [None, None], attempts=3, backoff=0.01)
            assert proxy.requests == 3
        # A refusal is final: sent once.
        with flaky(port, 0, status) as proxy:
            url = f"http://127.0.0.1:{proxy.server_address[1]}/invitation"
            with pytest.raises(InvitationError, match="This invitation has already been used"):
                redeem(url, code, tasks(deployment), [None, None], attempts=3, backoff=0.01)
            assert proxy.requests == 1


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` unwritable, for root too (immutable) where the tests run as root."""
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        if chattr is None:
            unavailable("chattr not found: needed to make a file read-only for root")
        if subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode:
            unavailable(f"chattr +i is not supported on {path}'s file system")
        try:
            yield
        finally:
            subprocess.run([chattr, "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o444)
        try:
            yield
        finally:
            path.chmod(mode)


def test_an_issuer_that_cannot_write_its_db_refuses_to_start(deployment: Path) -> None:
    issuer_dir = deployment / "issuer"
    with read_only(issuer_dir / DB_FILE):
        proc = _start_issuer(issuer_dir, free_port())
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 2, (out, err)
        assert "issuing on" not in out
        assert "cannot write the invitations" in err and DB_FILE in err, err
        assert "Traceback" not in err
        with pytest.raises(IssuerError, match="cannot write the invitations"):
            Issuer(issuer_dir)
    with running_issuer(issuer_dir):
        pass  # writable again: it starts


def test_an_issuer_that_loses_write_access_answers_503_and_uses_nothing(
    deployment: Path,
) -> None:
    issuer_dir = deployment / "issuer"
    (code,) = mint(issuer_dir, 1)
    issuer = Issuer(issuer_dir)
    request = blinded(deployment)
    result: list[object] = []

    def redeem_in_a_fresh_thread() -> None:  # a connection opened now
        try:
            result.append(issuer.redeem(code, request))
        except IssuerError as e:
            result.append(e)

    with read_only(issuer_dir / DB_FILE):
        thread = threading.Thread(target=redeem_in_a_fresh_thread)
        thread.start()
        thread.join(timeout=60)
    (error,) = result
    assert isinstance(error, IssuerUnavailable) and error.status == 503
    assert str(error) == UNAVAILABLE_MESSAGE
    assert used(deployment) == 0
    assert len(issuer.redeem(code, request)) == 2  # writable again: the same request works
    assert used(deployment) == 1


# An issuer whose last signature of a redemption never finishes: it prints
# once the burn is on disk (read back through a connection of its own) and
# waits there to be killed, the signatures never sent.
KILLED_WHILE_SIGNING = r"""
import base64, json, sqlite3, sys, time
from pathlib import Path
from veil.invite.issuer import DB_FILE, Issuer, code_hash

issuer_dir, code = Path(sys.argv[1]), sys.argv[2]
blinded = [base64.b64decode(b) for b in json.loads(sys.stdin.read())]
issuer = Issuer(issuer_dir)

def sign_until_killed(blinded_msg):
    select = "SELECT used FROM invitations WHERE code_hash = ?"
    deadline = time.monotonic() + 60
    with sqlite3.connect(issuer_dir / DB_FILE) as db:
        while db.execute(select, (code_hash(code),)).fetchone()[0] is None:
            if time.monotonic() > deadline:
                sys.exit("the burn was never committed")
            time.sleep(0.01)
    print("burned, still signing", flush=True)
    time.sleep(3600)

issuer.signers[-1].blind_sign = sign_until_killed
issuer.redeem(code, blinded)
"""


def _pending(deployment: Path) -> list[PendingToken]:
    return [
        PendingToken.start(t.issuer_public_key or b"", secrets.token_bytes(32))
        for t in tasks(deployment)
    ]


def test_an_issuer_killed_while_signing_keeps_the_burn_for_the_same_request(
    deployment: Path,
) -> None:
    # The burn is written while the blinded messages are signed: a process
    # killed after that commit and before its answer leaves the invitation
    # used, and the respondent's client, sending the same request again,
    # gets the signatures it never received; any other request is refused.
    issuer_dir = deployment / "issuer"
    (code,) = mint(issuer_dir, 1)
    pending = _pending(deployment)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WHILE_SIGNING, str(issuer_dir), code],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([base64.b64encode(p.blinded_msg).decode() for p in pending]))
        proc.stdin.close()
        line = proc.stdout.readline()
        assert line == "burned, still signing\n", (line, proc.stderr and proc.stderr.read())
        proc.kill()
        assert proc.wait(timeout=20) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert used(deployment) == 1
    issuer = Issuer(issuer_dir)  # the issuer restarted
    sigs = issuer.redeem(code, [p.blinded_msg for p in pending])
    tokens = [p.finish(s) for p, s in zip(pending, sigs, strict=True)]  # each verifies
    assert len(tokens) == 2
    assert issuer.redeem(code, [p.blinded_msg for p in pending]) == sigs
    with pytest.raises(InvitationUsed):
        issuer.redeem(code, blinded(deployment))
    assert used(deployment) == 1


def test_a_failed_signing_keeps_a_burn_whose_retry_was_answered(
    deployment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A redemption whose signing fails undoes its burn, unless the same
    # request sent again (here through a second issuer on the same file, as
    # another process would) has been answered meanwhile: those signatures
    # left, so the invitation stays used.
    issuer_dir = deployment / "issuer"
    (code,) = mint(issuer_dir, 1)
    first, second = Issuer(issuer_dir), Issuer(issuer_dir)
    request = blinded(deployment)
    answered: list[list[bytes]] = []

    def fail_after_the_retry_answered(blinded_msg: bytes) -> bytes:
        deadline = time.monotonic() + 60
        while used(deployment) == 0:  # the first redemption's burn, committed
            assert time.monotonic() < deadline, "the burn was never committed"
            time.sleep(0.01)
        answered.append(second.redeem(code, request))
        raise RuntimeError("signing failed")

    monkeypatch.setattr(first.signers[-1], "blind_sign", fail_after_the_retry_answered)
    with pytest.raises(RuntimeError, match="signing failed"):
        first.redeem(code, request)
    monkeypatch.undo()
    assert used(deployment) == 1
    (sigs,) = answered
    assert first.redeem(code, request) == sigs
    with pytest.raises(InvitationUsed):
        first.redeem(code, blinded(deployment))
