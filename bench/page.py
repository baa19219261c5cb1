"""What the survey page's connection guard (veil.web.guard) costs an honest client.

Two `veil survey serve` processes on one deployment, each on a listener bound
as the command binds it: one through the guard (the page as served), one
through uvicorn's own h11 protocol with the configuration the page had before
(a global connection cap, nothing timed before a request is whole). Rounds
alternate between them; each round times `GET /survey.json` over one
keep-alive connection and over a new connection per request: requests a
second (medians over the rounds, the first kind alternating) and the server
process's CPU time per request (over all rounds, from /proc: less disturbed
by other load on the machine than the rates). guard/plain is the ratio.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from veil.deploy import deploy_survey
from veil.survey import parse_survey

_SURVEY = """\
[survey]
name = "bench"
epsilon = 1
mechanism = "geometric"
min_batch_size = 1
opens = 2026-05-01T00:00:00Z
closes = 2026-05-02T00:00:00Z

[[question]]
id = "q"
text = "Yes or no?"
kind = "yes_no"
"""

KINDS = ("plain", "guard")


@dataclass(frozen=True)
class Row:
    kind: str
    keepalive_per_s: float
    new_connection_per_s: float
    # The server process's CPU time (user + system) per request, over all rounds.
    keepalive_cpu_us: float
    new_connection_cpu_us: float


def _cpu_seconds(pid: int | None) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(kind: str, port: int, client_dir: str) -> None:
    import logging

    import uvicorn

    from veil.grpc_util import bind_socket
    from veil.web import ServeLimits, SurveySite, build_app
    from veil.web.guard import serve

    logging.disable(logging.WARNING)
    app = build_app(SurveySite(Path(client_dir)))
    listener = bind_socket(f"127.0.0.1:{port}")
    if kind == "guard":
        serve(app, listener, ServeLimits(), log_level="error")
        return
    config = uvicorn.Config(
        app,
        http="h11",
        log_level="error",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        limit_concurrency=1000,
        timeout_keep_alive=5,
    )
    uvicorn.Server(config).run(sockets=[listener])


def _get(conn: http.client.HTTPConnection) -> None:
    conn.request("GET", "/survey.json")
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"GET /survey.json answered {response.status}")


def _keepalive(port: int, n: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    began = time.perf_counter()
    try:
        for _ in range(n):
            _get(conn)
    finally:
        conn.close()
    return n / (time.perf_counter() - began)


def _new_connections(port: int, n: int) -> float:
    began = time.perf_counter()
    for _ in range(n):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            _get(conn)
        finally:
            conn.close()
    return n / (time.perf_counter() - began)


def _wait(port: int, proc: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            _keepalive(port, 1)
            return
        except OSError:
            if not proc.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the page did not start") from None
            time.sleep(0.1)


def measure(rounds: int = 5, keepalive: int = 1000, fresh: int = 500) -> list[Row]:
    """One row per kind (KINDS order): medians over `rounds` alternating rounds."""
    from veil.local.launcher import free_port

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        dep = deploy_survey(
            parse_survey(_SURVEY), _SURVEY, Path(tmp) / "d", "127.0.0.1:1", "127.0.0.1:2", tls=False
        )
        ports = {kind: free_port() for kind in KINDS}
        procs = {
            kind: context.Process(target=_serve, args=(kind, ports[kind], str(dep.client_dir)))
            for kind in KINDS
        }
        try:
            for kind in KINDS:
                procs[kind].start()
                _wait(ports[kind], procs[kind])
            figures: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in KINDS}
            cpu = {k: [0.0, 0.0] for k in KINDS}
            for i in range(rounds):
                # Each kind first in every other round: neither always meets
                # the other's leftovers (sockets in TIME_WAIT, warm caches).
                for kind in KINDS if i % 2 == 0 else KINDS[::-1]:
                    pid = procs[kind].pid
                    before = _cpu_seconds(pid)
                    figures[kind][0].append(_keepalive(ports[kind], keepalive))
                    middle = _cpu_seconds(pid)
                    figures[kind][1].append(_new_connections(ports[kind], fresh))
                    cpu[kind][0] += middle - before
                    cpu[kind][1] += _cpu_seconds(pid) - middle
        finally:
            for proc in procs.values():
                if proc.is_alive():
                    proc.terminate()
                proc.join(15)
    return [
        Row(
            kind,
            statistics.median(figures[kind][0]),
            statistics.median(figures[kind][1]),
            cpu[kind][0] / (rounds * keepalive) * 1e6,
            cpu[kind][1] / (rounds * fresh) * 1e6,
        )
        for kind in KINDS
    ]


def format_table(rows: list[Row]) -> str:
    by = {r.kind: r for r in rows}
    lines = [
        "| server | keep-alive requests/s | server CPU µs/request | new-connection requests/s"
        " | server CPU µs/request |",
        "|---|---|---|---|---|",
        *(
            f"| {r.kind} | {r.keepalive_per_s:,.0f} | {r.keepalive_cpu_us:,.0f}"
            f" | {r.new_connection_per_s:,.0f} | {r.new_connection_cpu_us:,.0f} |"
            for r in rows
        ),
    ]
    if "plain" in by and "guard" in by:
        g, p = by["guard"], by["plain"]

        def ratio(a: float, b: float) -> str:
            return f"{a / b:.2f}" if b else "-"

        lines.append(
            f"| guard/plain | {ratio(g.keepalive_per_s, p.keepalive_per_s)}"
            f" | {ratio(g.keepalive_cpu_us, p.keepalive_cpu_us)}"
            f" | {ratio(g.new_connection_per_s, p.new_connection_per_s)}"
            f" | {ratio(g.new_connection_cpu_us, p.new_connection_cpu_us)} |"
        )
    return "\n".join(lines)
