"""Issue 40, item 6: slow connections from many addresses cannot take the
survey page offline.

The attack: 40 addresses on 127.0.0.0/8 (127.0.1.1 to 127.0.1.40), each
holding its whole --max-per-address (32), 1,280 connections that send a
request's headers a byte a second and reopen whatever the page closes. The
per-address cap holds each address to 32, but before, the page's 1,000
connections in all were shared: the attack held them, and an honest client
on another address got 503 for most requests (3/14 and 6/14 GETs answered
over 40 s in two runs). Now a newcomer beyond the cap ends the connection
that has waited longest for its request, a request's headers have a much
shorter deadline than its body, and the cap is sized from memory.

Asserted, with the page's cap at the old fixed 1,000 so that the attack
fills it (and, in the long mode, at its memory-sized default): at least 95%
of an honest client's requests (page loads and uploads, one at a time on
fresh connections) are answered 200 within 2 s, on SQLite, with the client
as the TCP peer and behind `--proxy-header` (the honest client through the
trusted proxy's address, the attackers not). The short mode holds the
attack 12 s, past several header deadlines, and allows an honest request 2 s
or three times the slowest it took before the attack, whichever is longer,
stretched by how much slower than the suite alone a process starts just
before the attack (tests/support/slowdown.py: the suite may share the machine
with other work: at load about 20 the unstretched bound failed);
VEIL_TEST_LONG=1 holds it 40 s to the 2 s. Before the change the attack's
harm was refusals (503), not delay, which no stretch of the bound lets
through.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.modes import LONG
from tests.support.reliability import record
from tests.support.slowdown import SUITE_SLOWDOWN, startup_slowdown
from tests.support.survey_site import (
    SurveyServers,
    sealed_report,
    start_serve,
    stop,
    survey_servers,
)

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]

TP = 3600
ADDRESSES = [f"127.0.1.{i}" for i in range(1, 41)]
PER_ADDRESS = 32  # the page's default --max-per-address
OLD_CAP = 1000  # the page's fixed cap before
HOLD = 40.0 if LONG else 12.0
HONEST = "127.0.0.2"
WITHIN = 2.0  # seconds an honest request may take
SHARE = 0.95  # of honest requests answered 200 within WITHIN


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SurveyServers]:
    now = int(time.time())
    opens = now - now % TP
    root = Path(tmp_path_factory.mktemp("page-many-addresses"))
    with survey_servers(root, "none", opens, opens + 2 * TP, TP) as s:
        yield s


class SlowHeaders(threading.Thread):
    """PER_ADDRESS connections from each of ADDRESSES, each sending a request
    line and then its headers a byte a second, never finishing them; any the
    page closes is opened again at once."""

    OPENING = b"GET / HTTP/1.1\r\nHost: page\r\nX-Slow: "

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.selector = selectors.DefaultSelector()
        self.held: dict[str, int] = dict.fromkeys(ADDRESSES, 0)
        self.opened = self.closed_by_page = 0
        self.filled = threading.Event()
        self.stopping = threading.Event()

    def _open(self, address: str) -> bool:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((address, 0))
            sock.settimeout(2)
            sock.connect(("127.0.0.1", self.port))
            sock.sendall(self.OPENING)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return False
        self.selector.register(sock, selectors.EVENT_READ, address)
        self.held[address] += 1
        self.opened += 1
        return True

    def _close(self, key: selectors.SelectorKey) -> None:
        self.selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
        self.held[key.data] -= 1

    def run(self) -> None:
        last_byte = time.monotonic()
        while not self.stopping.is_set():
            for address in ADDRESSES:
                while self.held[address] < PER_ADDRESS and not self.stopping.is_set():
                    if not self._open(address):
                        break
            self.filled.set()
            for key, _ in self.selector.select(timeout=0.1):
                self.closed_by_page += 1
                self._close(key)
            if time.monotonic() - last_byte >= 1.0:
                last_byte = time.monotonic()
                for key in list(self.selector.get_map().values()):
                    try:
                        key.fileobj.send(b"a")  # type: ignore[union-attr]
                    except OSError:
                        self.closed_by_page += 1
                        self._close(key)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


def honest(
    port: int, method: str, path: str, body: bytes | None, source: str, headers: dict[str, str]
) -> tuple[int, float]:
    """(status, seconds) of one request on a fresh connection; 0 for none."""
    began = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        sent = dict(headers)
        if body is not None:
            sent["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - began
    except OSError:
        return 0, time.monotonic() - began
    finally:
        conn.close()


CASES = [
    pytest.param("peer", str(OLD_CAP), id="peer-cap1000"),
    pytest.param("proxy", str(OLD_CAP), id="proxy-header-cap1000"),
    pytest.param(
        "peer",
        None,
        id="peer-memory-cap",
        marks=pytest.mark.skipif(not LONG, reason="long mode only (VEIL_TEST_LONG=1)"),
    ),
]


@pytest.mark.parametrize(("mode", "cap"), CASES)
def test_slow_headers_from_many_addresses_cannot_hold_the_page(
    site: SurveyServers, tmp_path: Path, mode: str, cap: str | None
) -> None:
    args = ["--rate", "100000"]  # the honest client's many uploads: not what is tried
    if cap is not None:
        args += ["--max-connections", cap]
    if mode == "proxy":
        args += ["--proxy-header", "X-Forwarded-For"]
        source, headers = "127.0.0.1", {"X-Forwarded-For": "198.51.100.7"}
    else:
        source, headers = HONEST, {}
    log = tmp_path / "serve.log"
    body = json.dumps({"reports": [sealed_report(site.deployment.client_dir, "remote", 1)]})
    serve, url = start_serve(site.deployment.client_dir, log, *args)
    attack = None
    results: list[tuple[str, int, float]] = []
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        # What an honest request takes on this machine as it is now, with no
        # attack: the long mode holds the page to the 2 s; the suite's
        # short run, on a machine that may be busy with other tests, to 2 s or
        # three times the slowest of these, whichever is longer (an attack that
        # held the page would leave requests unanswered, not a little slower).
        baseline = [
            honest(port, method, path, data, source, headers)[1]
            for _ in range(3)
            for method, path, data in (("GET", "/", None), ("POST", "/reports", body.encode()))
        ]
        stretch = max(1.0, startup_slowdown() / SUITE_SLOWDOWN)
        within = WITHIN if LONG else max(WITHIN, 3 * max(baseline)) * stretch
        attack = SlowHeaders(port)
        attack.start()
        assert attack.filled.wait(timeout=120), "the attack never opened its connections"
        began = time.monotonic()
        while time.monotonic() - began < HOLD:
            for method, path, data in (("GET", "/", None), ("POST", "/reports", body.encode())):
                status, seconds = honest(port, method, path, data, source, headers)
                results.append((f"{method} {path}", status, seconds))
    finally:
        if attack is not None:
            attack.stop()
        stop(serve)
    text = log.read_text()
    good = [r for r in results if r[1] == 200 and r[2] <= within]
    slowest = max(r[2] for r in results)
    share = len(good) / len(results)
    print(
        f"{mode} cap={cap or 'memory'}: {len(good)}/{len(results)} honest requests answered 200"
        f" within {within:.3g} s ({share:.1%}), slowest {slowest:.2f} s; attack opened"
        f" {attack.opened} connections, the page closed {attack.closed_by_page}"
    )
    record(
        "page_many_addresses",
        mode=mode,
        cap=cap or "memory",
        held_seconds=HOLD,
        honest_requests=len(results),
        honest_good=len(good),
        slowest_seconds=round(slowest, 3),
        attack_connections=attack.opened,
        closed_by_page=attack.closed_by_page,
    )
    assert len(results) >= 10
    assert share >= SHARE, ([r for r in results if r not in good][:10], text[-2000:])
    # The attack was real: it held more than the cap allows, and the page ended
    # what it could not keep.
    assert attack.opened >= len(ADDRESSES) * PER_ADDRESS
    if cap is not None:
        assert attack.closed_by_page >= len(ADDRESSES) * PER_ADDRESS - int(cap)
    assert "Traceback" not in text
