"""veil.web.guard in front of a real `veil survey serve`: the read deadline runs
from a connection's start and is not restarted by trickling bytes; one address
holds at most --max-per-address connections; refusals carry the page's
security headers. The page needs no aggregator for what is tried here."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.survey_site import SURVEY, start_serve, stop
from tests.support.survey_site import http as get
from veil.deploy import deploy_survey
from veil.survey import parse_survey
from veil.web import guard as guard_module
from veil.web.app import ServeLimits, address_key
from veil.web.guard import ConnectionGuard, connection_cap, raw_response

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    text = SURVEY.format(
        epsilon="1",
        mechanism="geometric",
        tp=3600,
        opens="2026-05-01T00:00:00Z",
        closes="2026-05-02T00:00:00Z",
    )
    root = Path(tmp_path_factory.mktemp("guard"))
    dep = deploy_survey(
        parse_survey(text), text, root / "out", "127.0.0.1:1", "127.0.0.1:2", tls=False
    )
    return dep.client_dir


@pytest.fixture
def page(client_dir: Path, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    log = tmp_path / "serve.log"
    serve, url = start_serve(
        client_dir, log, "--read-timeout", "2", "--max-per-address", "3", "--rate", "5"
    )
    try:
        yield int(url.rstrip("/").rsplit(":", 1)[1]), log
    finally:
        stop(serve)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.settimeout(15)
    sock.connect(("127.0.0.1", port))
    return sock


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_trickled_request_is_cut_off_at_the_deadline(page: tuple[int, Path]) -> None:
    port, _ = page
    request = b"GET / HTTP/1.1\r\nHost: page\r\nX-Slow: " + b"a" * 40
    with connect(port) as sock:
        began = time.monotonic()
        sent = 0
        try:
            # A byte every 0.2 s: 8 s of trickle if the page let it.
            for byte in request:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.2)
        except OSError:
            pass  # the page closed it
        reply = read_all(sock)
        took = time.monotonic() - began
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:80]
    assert b"content-security-policy: default-src 'none'" in reply
    assert 1.5 < took < 6, took
    assert sent < len(request)


def test_idle_connection_is_closed_without_an_answer(page: tuple[int, Path]) -> None:
    port, _ = page
    with connect(port) as sock:
        began = time.monotonic()
        assert read_all(sock) == b""
        assert 1.5 < time.monotonic() - began < 6


def test_keep_alive_gets_a_fresh_deadline_per_request(page: tuple[int, Path]) -> None:
    port, _ = page
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        first = None
        for _ in range(3):
            conn.request("GET", "/survey.json")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            first = first or conn.sock
            assert conn.sock is first  # one connection throughout
            time.sleep(1.2)  # 3.6 s in all on one connection, more than one deadline
    finally:
        conn.close()


def test_one_address_holds_at_most_its_share(page: tuple[int, Path]) -> None:
    port, log = page
    held = [connect(port) for _ in range(3)]
    try:
        time.sleep(0.3)
        with connect(port) as refused:
            reply = read_all(refused)
        assert reply.startswith(b"HTTP/1.1 503 "), reply[:80]
        assert b"retry-after: 5" in reply
        assert b"content-security-policy: default-src 'none'" in reply
        # Another address is served meanwhile.
        with connect(port, "127.0.0.2") as other:
            other.sendall(b"GET / HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n")
            assert read_all(other).startswith(b"HTTP/1.1 200 ")
        # A slot freed is a slot for the same address again.
        held.pop().close()
        time.sleep(0.3)
        with connect(port) as again:
            again.sendall(b"GET / HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n")
            assert read_all(again).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in held:
            sock.close()
    assert "refused 1 connections over 3 from one address" in log.read_text()


def test_page_loads_are_not_rate_limited(page: tuple[int, Path]) -> None:
    port, _ = page
    url = f"http://127.0.0.1:{port}/"
    assert [get(url)[0] for _ in range(8)] == [200] * 8


def test_address_keys() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert (
        address_key("2001:db8:1:2:3:4:5:6")
        == address_key("2001:db8:1:2::9")
        == ("2001:db8:1:2::/64")
    )
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")


def test_raw_response_is_whole_http() -> None:
    data = raw_response(503, "busy", {"retry-after": "5"})
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert f"content-length: {len(body)}".encode() in head
    assert b"connection: close" in head and body == b'{"error": "busy"}'


def test_guard_counts_per_address_and_in_all() -> None:
    limits = ServeLimits(max_connections=5, max_per_address=2, proxy_header="X-Forwarded-For")
    guard = ConnectionGuard(limits)
    a = [guard.admit("192.0.2.1") for _ in range(3)]
    assert a == ["192.0.2.1", "192.0.2.1", None]
    # One IPv6 /64 is one client; the trusted proxy (loopback by default) has no cap.
    assert guard.admit("2001:db8::1") == guard.admit("2001:db8::2") == "2001:db8::/64"
    assert guard.admit("2001:db8::3") is None
    assert guard.admit("127.0.0.1") == ""
    assert guard.admit("127.0.0.1") is None  # 5 open: the total cap holds for the proxy too
    guard.release("192.0.2.1")
    assert guard.admit("192.0.2.1") == "192.0.2.1"
    for key in ("192.0.2.1", "192.0.2.1", "2001:db8::/64", "2001:db8::/64", ""):
        guard.release(key)
    assert guard.open == 0 and guard.per_address == {}
    # Without --proxy-header no address is trusted.
    plain = ConnectionGuard(ServeLimits(max_per_address=1))
    assert plain.admit("127.0.0.1") == "127.0.0.1" and plain.admit("127.0.0.1") is None


def test_a_newcomer_ends_the_connection_waiting_longest(client_dir: Path, tmp_path: Path) -> None:
    """At the total cap a newcomer takes the slot of the connection whose
    request has waited longest (503 if it had begun), where it was refused."""
    serve, url = start_serve(
        client_dir, tmp_path / "serve.log", "--max-connections", "3", "--max-per-address", "3"
    )
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    held = []
    try:
        for i in range(3):
            sock = connect(port)
            if i == 0:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: page\r\n")  # begun, never finished
            held.append(sock)
            time.sleep(0.1)  # in order: the first has waited longest
        with connect(port, "127.0.0.2") as newcomer:
            newcomer.sendall(b"GET / HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n")
            assert read_all(newcomer).startswith(b"HTTP/1.1 200 ")
        oldest = read_all(held[0])
        assert oldest.startswith(b"HTTP/1.1 503 "), oldest[:80]
        assert b"retry-after: 5" in oldest
        # The next newcomer ends the next oldest, which had sent nothing: closed unanswered.
        with connect(port, "127.0.0.2") as again:
            again.sendall(b"GET / HTTP/1.1\r\nHost: page\r\nConnection: close\r\n\r\n")
            assert read_all(again).startswith(b"HTTP/1.1 200 ")
        assert read_all(held[1]) == b""
    finally:
        for sock in held:
            sock.close()
        stop(serve)
    assert "ended 1 that had waited longest for newcomers" in (tmp_path / "serve.log").read_text()


def test_headers_have_a_shorter_deadline_than_the_body(client_dir: Path, tmp_path: Path) -> None:
    serve, url = start_serve(
        client_dir, tmp_path / "serve.log", "--header-timeout", "1", "--read-timeout", "4"
    )
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    try:
        with connect(port) as slow_headers:
            began = time.monotonic()
            slow_headers.sendall(b"GET / HTTP/1.1\r\nHost: page\r\n")
            reply = read_all(slow_headers)
            took = time.monotonic() - began
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:80]
        assert b"headers did not arrive within 1 s" in reply
        assert 0.5 < took < 3.5, took
        # Whole headers in time: the body has the whole request's deadline.
        with connect(port) as slow_body:
            began = time.monotonic()
            slow_body.sendall(
                b"POST /reports HTTP/1.1\r\nHost: page\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n{"
            )
            reply = read_all(slow_body)
            took = time.monotonic() - began
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:80]
        assert b"the request did not arrive within 4 s" in reply
        assert 3.5 < took < 8, took
    finally:
        stop(serve)


def test_connection_cap_is_sized_from_memory_and_file_descriptors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gib = 1 << 30
    # An eighth of 8 GiB at 64 KiB + 64 KiB a connection.
    assert connection_cap(64 * 1024, memory=8 * gib, fds=1 << 20) == 8192
    assert connection_cap(64 * 1024, memory=16 * gib, fds=1 << 20) == 16384
    # The open-file limit, less what the rest of the server needs.
    assert connection_cap(64 * 1024, memory=64 * gib, fds=4096) == 4096 - 256
    # Never below the floor, however little is free.
    assert connection_cap(64 * 1024, memory=0, fds=0) == 64
    assert ConnectionGuard(ServeLimits(max_connections=7)).max_connections == 7
    # By default, from what this machine has free (read once here: it moves
    # between two reads).
    monkeypatch.setattr(guard_module, "available_memory", lambda: 8 * gib)
    assert ConnectionGuard(ServeLimits()).max_connections == connection_cap(64 * 1024)
    assert connection_cap(64 * 1024) == connection_cap(64 * 1024, memory=8 * gib)
