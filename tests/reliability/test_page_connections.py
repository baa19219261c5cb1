"""Issue 26: idle and half-sent connections cannot take the survey page offline.

The attack, from one address (127.0.0.1): as many connections as the page's
whole --max-connections, a third sending nothing, a third half a request
line and headers, a third whole headers and part of a body, held (and
opened again when the page closes them) for 25 s, past two read timeouts.
Before, the page answered every other client 503 for as long as they were
held: nothing timed a request before it was complete, and the sockets of one
address could fill the page's connections. Now each address holds at most
--max-connections-per-address, the rest are refused at once, and a request
not complete within --read-timeout of its connection's start is cut off:
honest page loads and uploads from another address (127.0.0.2, routed on lo)
succeed throughout.
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.reliability import record
from tests.support.survey_site import (
    SurveyServers,
    sealed_report,
    start_serve,
    stop,
    survey_servers,
)

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]

TP = 3600
MAX_CONNECTIONS = 1000  # the page's fixed cap before issue 40 (now sized from memory)
# Past two read timeouts (10 s); the long mode holds past the 75 s of the report.
HOLD = 80.0 if os.environ.get("VEIL_TEST_LONG") == "1" else 25.0
HONEST = "127.0.0.2"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SurveyServers]:
    now = int(time.time())
    opens = now - now % TP
    root = Path(tmp_path_factory.mktemp("page-connections"))
    with survey_servers(root, "none", opens, opens + 2 * TP, TP) as s:
        yield s


def honest(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, float]:
    """(status, seconds) of one request from HONEST on a fresh connection."""
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(HONEST, 0))
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    finally:
        conn.close()


class Attacker:
    """MAX_CONNECTIONS sockets from 127.0.0.1 that never finish a request."""

    OPENINGS = (
        b"",
        b"POST /reports HTTP/1.1\r\nHost: page\r\nContent-Type: application/json\r\n",
        b"POST /reports HTTP/1.1\r\nHost: page\r\nContent-Type: application/json\r\n"
        b'Content-Length: 5000\r\n\r\n{"reports": [',
    )

    def __init__(self, port: int) -> None:
        self.port = port
        self.selector = selectors.DefaultSelector()
        self.opened = self.closed_by_page = 0

    def fill(self) -> None:
        """Open sockets until MAX_CONNECTIONS are open again."""
        while len(self.selector.get_map()) < MAX_CONNECTIONS:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(5)
            try:
                sock.connect(("127.0.0.1", self.port))
                opening = self.OPENINGS[self.opened % len(self.OPENINGS)]
                if opening:
                    sock.sendall(opening)
            except OSError:
                sock.close()
                return
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.opened += 1

    def reap(self) -> None:
        """Close the sockets the page has answered or closed."""
        for key, _ in self.selector.select(timeout=0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            self.selector.unregister(sock)
            sock.close()
            self.closed_by_page += 1

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            assert isinstance(key.fileobj, socket.socket)
            key.fileobj.close()
        self.selector.close()


def test_one_address_cannot_hold_the_page(site: SurveyServers, tmp_path: Path) -> None:
    # The honest address needs more than the default 20 uploads a minute here;
    # the attack never completes a request, so the rate limit is no defence.
    report = sealed_report(site.deployment.client_dir, "remote", 1)
    body = json.dumps({"reports": [report]}).encode()
    serve, url = start_serve(site.deployment.client_dir, tmp_path / "serve.log", "--rate", "1000")
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    attacker = Attacker(port)
    results: list[tuple[str, int, float]] = []
    try:
        began = time.monotonic()
        attacker.fill()
        while time.monotonic() - began < HOLD:
            for method, path, data in (("GET", "/", None), ("POST", "/reports", body)):
                status, seconds = honest(port, method, path, data)
                results.append((f"{method} {path}", status, seconds))
            attacker.reap()
            attacker.fill()
            time.sleep(0.2)
    finally:
        attacker.close()
        stop(serve)
    log = (tmp_path / "serve.log").read_text()
    failed = [r for r in results if r[1] != 200]
    slowest = max(r[2] for r in results)
    print(
        f"{len(results)} honest requests, {len(failed)} failed, slowest {slowest:.2f} s;"
        f" attacker opened {attacker.opened} sockets, the page closed {attacker.closed_by_page}"
    )
    record(
        "page_connections",
        held_seconds=HOLD,
        honest_requests=len(results),
        honest_failed=len(failed),
        slowest_seconds=round(slowest, 3),
        attacker_sockets=attacker.opened,
        closed_by_page=attacker.closed_by_page,
    )
    assert not failed, (failed[:5], log[-2000:])
    assert len(results) >= 20
    # The page refused or cut off the attacker's sockets rather than keeping them.
    assert attacker.closed_by_page >= MAX_CONNECTIONS - 100
    assert "Traceback" not in log
