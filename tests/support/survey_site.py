"""A deployed survey for the web tests: `veil survey deploy` output, a real
leader and helper, and `veil survey serve` as its own process."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from tests.support.survey_toml import commute, remote, team
from veil.client import Client
from veil.deploy import Deployment, deploy_survey
from veil.local.launcher import ServerProcess, free_port
from veil.messages import Ciphertext, Report
from veil.survey import parse_survey
from veil.task import ClientTask, b64e, load_task
from veil.times import format_time

SURVEY = (
    """\
[survey]
name = "Team survey"
epsilon = {epsilon}
mechanism = "{mechanism}"
min_batch_size = 1
max_respondents = 1000
time_precision = {tp}
opens = "{opens}"
closes = "{closes}"

"""
    + remote(required=True)
    + "\n"
    + commute()
    + "\n"
    + team()
    + """
[[question]]
id = "tools"
text = "Which tools do you use daily (up to 2)?"
kind = "multi_choice"
options = ["email", "chat", "wiki", "video"]
max_choices = 2
required = true

[[question]]
id = "ratings"
text = "Rate workload and tooling from 0 to 10."
kind = "vector"
length = 2
max = 10
labels = ["workload", "tooling"]
"""
)


@dataclass
class SurveyServers:
    deployment: Deployment
    leader: ServerProcess
    helper: ServerProcess
    url: str
    opens: int
    closes: int
    serve: subprocess.Popen[bytes] | None = None


def report_json(task_id: str, r: Report) -> dict[str, Any]:
    """A report as the page posts it to /reports."""

    def ct(c: Ciphertext) -> dict[str, Any]:
        return {"config_id": c.config_id, "enc": b64e(c.enc), "payload": b64e(c.payload)}

    return {
        "task_id": task_id,
        "report_id": b64e(r.report_id),
        "time": r.time,
        "public_share": b64e(r.public_share),
        "leader_encrypted_input_share": ct(r.leader_ct),
        "helper_encrypted_input_share": ct(r.helper_ct),
    }


def sealed_report(client_dir: Path, question: str, measurement: Any) -> dict[str, Any]:
    """One report for `question`, built and sealed by the Python client, as the
    page posts it (fresh report id each call)."""
    task = load_task(client_dir / f"{question}.toml", ClientTask)
    with Client(task) as client:
        (r,) = client.build_reports([measurement], int(time.time()))
    return report_json(task.id_text, r)


def write_survey(
    root: Path, mechanism: str, opens: int, closes: int, tp: int
) -> tuple[Deployment, str, str]:
    text = SURVEY.format(
        epsilon="1",
        mechanism=mechanism,
        tp=tp,
        opens=format_time(opens),
        closes=format_time(closes),
    )
    leader = f"127.0.0.1:{free_port()}"
    helper = f"127.0.0.1:{free_port()}"
    dep = deploy_survey(parse_survey(text), text, root / "out", leader, helper, tls=False)
    if mechanism == "none":
        # Exact release is an explicit opt-in at each aggregator.
        for config in (dep.leader_config, dep.helper_config):
            config.write_text("allow_exact_release = true\n" + config.read_text())
    return dep, leader, helper


def http(
    url: str,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def post_json(url: str, doc: Any) -> tuple[int, Any]:
    status, _, body = http(
        url, json.dumps(doc).encode(), {"Content-Type": "application/json"}, "POST"
    )
    return status, json.loads(body)


def start_serve(
    client_dir: Path, log: Path, *extra: str, context: ssl.SSLContext | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `veil survey serve` on a free port and wait for its page; with
    `context` (trusting its certificate) it serves HTTPS."""
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "veil.cli",
                "survey",
                "serve",
                "--survey-dir",
                str(client_dir),
                "--listen",
                f"127.0.0.1:{port}",
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    url = f"{'https' if context else 'http'}://127.0.0.1:{port}/"
    # Whatever ends the wait (a page not up in time, an answer that is no
    # HTTP, an interrupt), the process is stopped and reaped: one left
    # running is reported ("subprocess ... is still running") when it is
    # garbage-collected, in whichever later test that happens.
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"veil survey serve exited: {log.read_text()[-2000:]}")
            try:
                if http(url, context=context)[0] == 200:
                    return proc, url
            except (OSError, HTTPException):  # not listening yet, or cut off starting
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"veil survey serve did not answer; see {log}")
            time.sleep(0.1)
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """Stop `veil survey serve` (SIGTERM, then SIGKILL after 15 s) and reap it."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def survey_servers(
    root: Path, mechanism: str, opens: int, closes: int, tp: int, *serve_args: str
) -> Iterator[SurveyServers]:
    root.mkdir(parents=True, exist_ok=True)
    dep, leader_addr, helper_addr = write_survey(root, mechanism, opens, closes, tp)
    helper = ServerProcess("helper", dep.helper_config, root / "helper.log", helper_addr)
    leader = ServerProcess("leader", dep.leader_config, root / "leader.log", leader_addr)
    serve = None
    try:
        helper.start()
        leader.start()
        serve, url = start_serve(dep.client_dir, root / "serve.log", *serve_args)
        yield SurveyServers(dep, leader, helper, url, opens, closes, serve)
    finally:
        stop(serve)
        leader.stop()
        helper.stop()
