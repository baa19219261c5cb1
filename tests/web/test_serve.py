"""`veil survey serve` against a real leader and helper: the page, the
public files, reports built by the JavaScript client forwarded to the leader,
and hostile requests refused with nothing stored and nothing stalled."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.node import js_reports, require_node_client
from tests.support.survey_site import (
    SURVEY,
    SurveyServers,
    http,
    post_json,
    report_json,
    sealed_report,
    start_serve,
    stop,
    survey_servers,
)
from veil.cli import main as veil_main
from veil.dap.invitation import INVITATION_DATA_SIZE, INVITATION_EXTENSION
from veil.dap.messages import Extension
from veil.dap.report import prepare_report
from veil.dap.versions import DapVersion
from veil.deploy import deploy_survey
from veil.hpke import HpkeConfig, generate_keypair
from veil.local.launcher import free_port
from veil.messages import Report
from veil.survey import parse_survey
from veil.task import ClientTask, DapSpec, b64d, b64e, load_task
from veil.web import SurveySite
from veil.web.app import BadRequest, ServeError
from veil.web.page import render_page

pytestmark = pytest.mark.slow

TP = 3600
ANSWERS = {
    "remote": 1,
    "commute": 25,
    "team": 2,
    "tools": [True, False, True, False],
    "ratings": [7, 3],
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SurveyServers]:
    now = int(time.time())
    opens = now - now % TP
    root = Path(tmp_path_factory.mktemp("serve"))
    # Every request here comes from 127.0.0.1: a rate limit no test reaches
    # (test_rate_limit_per_client starts a server with a low one).
    with survey_servers(root, "none", opens, opens + 2 * TP, TP, "--rate", "10000") as s:
        yield s


def stored(s: SurveyServers) -> int:
    import sqlite3

    db = s.deployment.leader_config.parent / "leader.db"
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0])


def configs(s: SurveyServers) -> dict[str, Any]:
    status, _, body = http(s.url + "hpke-configs.json")
    assert status == 200
    return json.loads(body)


def _config(d: dict[str, Any]) -> HpkeConfig:
    return HpkeConfig(d["config_id"], b64d(d["public_key"]), d["kem_id"], d["kdf_id"], d["aead_id"])


def js_survey_reports(s: SurveyServers, answers: dict[str, Any]) -> list[dict[str, Any]]:
    """One respondent's reports, built by the JavaScript client from the
    configs the server hands out."""
    hpke = configs(s)
    out = []
    for qid, measurement in answers.items():
        task = load_task(s.deployment.client_dir / f"{qid}.toml", ClientTask)
        c = hpke[task.id_text]
        (r,) = js_reports(
            task, _config(c["leader"][0]), _config(c["helper"][0]), [measurement], int(time.time())
        )
        assert isinstance(r, Report), r
        out.append(report_json(task.id_text, r))
    return out


def test_page_is_accessible_and_pinned(site: SurveyServers) -> None:
    status, headers, body = http(site.url)
    assert status == 200
    page = body.decode()
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"
    for text in ("Do you work remotely most days?", "Which team are you in?", "workload"):
        assert text in page
    # Every control has a label that names it; no inline script or style; no external URL.
    ids = re.findall(r'<input[^>]* id="([^"]+)"', page)
    assert len(ids) == 2 + 1 + 3 + 4 + 2
    for i in ids:
        assert f'for="{i}"' in page
    assert "<script>" not in page and "style=" not in page and "http" not in page.lower()
    # The script and the stylesheet are served as the page's integrity values say.
    for path in ("static/veil-survey.js", "static/survey.css"):
        m = re.search(rf'"{path}" integrity="sha384-([^"]+)"', page)
        assert m is not None, path
        status, _, served = http(site.url + path)
        assert status == 200
        assert base64.b64decode(m.group(1)) == hashlib.sha384(served).digest()
    # The icon the page names, and the one a browser asks for anyway: no 404.
    assert '<link rel="icon" href="static/favicon.svg"' in page
    for path in ("static/favicon.svg", "favicon.ico"):
        status, headers, served = http(site.url + path)
        assert (status, headers["content-type"]) == (200, "image/svg+xml"), path
        assert served.startswith(b"<svg")


def test_public_description_and_configs(site: SurveyServers) -> None:
    status, _, body = http(site.url + "survey.json")
    assert status == 200
    doc = json.loads(body)
    assert [q["id"] for q in doc["questions"]] == list(ANSWERS)
    assert doc["questions"][0]["vdaf"] == {"type": "count"}
    hpke = configs(site)
    assert set(hpke) == {q["task_id"] for q in doc["questions"]}
    for c in hpke.values():
        assert len(b64d(c["leader"][0]["public_key"])) == 32
        assert c["leader"][0]["public_key"] != c["helper"][0]["public_key"]


def test_js_reports_are_forwarded_to_the_leader(site: SurveyServers) -> None:
    require_node_client()
    before = stored(site)
    reports = js_survey_reports(site, ANSWERS)
    assert post_json(site.url + "reports", {"reports": reports}) == (
        200,
        {"accepted": 5, "duplicates": 0},
    )
    # A respondent's retry sends the same reports: acknowledged, stored once.
    assert post_json(site.url + "reports", {"reports": reports}) == (
        200,
        {"accepted": 0, "duplicates": 5},
    )
    assert stored(site) == before + 5


def _one_report(site: SurveyServers) -> dict[str, Any]:
    require_node_client()
    return js_survey_reports(site, {"remote": 0})[0]


def _with(report: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(report))
    node = out
    *head, last = path.split(".")
    for key in head:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return out


def test_hostile_reports_are_refused_and_nothing_is_stored(site: SurveyServers) -> None:
    good = _one_report(site)
    before = stored(site)
    url = site.url + "reports"
    short = b64e(bytes(31))
    cases: list[tuple[Any, str]] = [
        ({"reports": []}, "non-empty list"),
        ({"reports": [good], "answers": {"remote": "yes"}}, "unexpected field 'answers'"),
        ({"answers": {"remote": "yes"}}, "unexpected field 'answers'"),
        ([good], "must be an object"),
        ({"reports": [good] * 6}, "at most 5 reports"),
        ({"reports": [good, good]}, "a second report for question 'remote'"),
        ({"reports": [_with(good, "task_id", b64e(bytes(32)))]}, "not a task of this survey"),
        ({"reports": [_with(good, "report_id", short)]}, "report_id must be 16 bytes"),
        ({"reports": [_with(good, "report_id", "!!")]}, "not base64url"),
        ({"reports": [_with(good, "time", "soon")]}, "time must be a whole number"),
        ({"reports": [_with(good, "time", -5)]}, "time must be a whole number"),
        ({"reports": [_with(good, "public_share", b64e(bytes(64)))]}, "public_share must be 0"),
        ({"reports": [_with(good, "leader_encrypted_input_share.enc", short)]}, "enc must be 32"),
        (
            {"reports": [_with(good, "helper_encrypted_input_share.payload", b64e(bytes(5000)))]},
            "payload must be",
        ),
        ({"reports": [_with(good, "helper_encrypted_input_share.config_id", 256)]}, "0..255"),
        ({"reports": [_with(good, "leader_encrypted_input_share.config_id", True)]}, "0..255"),
        ({"reports": [_with(good, "public_share", KeyError)]}, "missing 'public_share'"),
        ({"reports": [{**good, "answer": 1}]}, "unexpected field 'answer'"),
    ]
    for doc, message in cases:
        status, body = post_json(url, doc)
        assert status == 400, (doc, body)
        assert message in body["error"], (message, body)
    for data, ctype, status_expected in [
        (b"{not json", "application/json", 400),
        (b"\xff\xfe", "application/json", 400),
        (json.dumps({"reports": [good]}).encode(), "text/plain", 415),
        (b"x" * (64 * 1024 + 1), "application/json", 413),
    ]:
        status, _, _ = http(url, data, {"Content-Type": ctype}, "POST")
        assert status == status_expected, (data[:20], status)
    # A tampered ciphertext of the right size reaches the leader, which
    # stores it (it cannot open the helper's share): the leader's own checks,
    # not this server's, reject it in aggregation. Only forged structure is
    # refused here.
    assert stored(site) == before
    # GET on the upload route, and unknown paths, answer without a page.
    assert http(url)[0] == 405
    assert http(site.url + "../../etc/passwd")[0] == 404
    # Still serving.
    assert http(site.url)[0] == 200


def _post(url: str, doc: Any, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    status, response_headers, _ = http(
        url,
        json.dumps(doc).encode(),
        {"Content-Type": "application/json", **(headers or {})},
        "POST",
    )
    return status, response_headers


def test_rate_limit_counts_well_formed_uploads_only(tmp_path: Path, site: SurveyServers) -> None:
    good = {"reports": [sealed_report(site.deployment.client_dir, "remote", 1)]}
    serve, url = start_serve(site.deployment.client_dir, tmp_path / "serve.log", "--rate", "3")
    try:
        # Malformed requests, however many, use up nothing: before, 20 one-byte
        # requests of the wrong type locked an address out.
        for _ in range(6):
            assert http(url + "reports", b"x", {"Content-Type": "text/plain"}, "POST")[0] == 415
            assert post_json(url + "reports", {"reports": []})[0] == 400
        assert [_post(url + "reports", good)[0] for _ in range(3)] == [200, 200, 200]
        status, headers = _post(url + "reports", good)
        assert status == 429
        assert 1 <= int(headers["retry-after"]) <= 20  # 3 a minute: one back in 20 s
        assert "default-src 'none'" in headers["content-security-policy"]
        # The page itself is not limited.
        assert http(url)[0] == 200
    finally:
        stop(serve)


def test_rate_limit_behind_a_trusted_proxy(tmp_path: Path, site: SurveyServers) -> None:
    def upload(xff: str | None) -> int:
        doc = {"reports": [sealed_report(site.deployment.client_dir, "remote", 0)]}
        return _post(url + "reports", doc, {"X-Forwarded-For": xff} if xff else None)[0]

    args = ("--rate", "2", "--proxy-header", "X-Forwarded-For")
    serve, url = start_serve(site.deployment.client_dir, tmp_path / "serve.log", *args)
    try:
        # One client behind the proxy is limited; another is not locked out
        # with it. An address a client puts before the proxy's is ignored.
        assert [upload("203.0.113.5") for _ in range(2)] == [200, 200]
        assert upload("198.51.100.1, 203.0.113.5") == 429
        assert upload("203.0.113.5, 198.51.100.7") == 200
        assert upload("2001:db8::1") == 200
        assert upload("2001:db8::2") == 200
        assert upload("2001:db8::3") == 429  # one /64: one client
        # A trusted proxy must name the client.
        for bad in (None, "unknown", "203.0.113.5:443"):
            assert upload(bad) == 400
    finally:
        stop(serve)
    # Without --proxy-header (the default) the header is no one's to choose:
    # the limit keys on the TCP peer, here 127.0.0.1 for every request.
    serve, url = start_serve(site.deployment.client_dir, tmp_path / "serve2.log", "--rate", "2")
    try:
        assert [upload(f"203.0.113.{i}") for i in range(3)] == [200, 200, 429]
    finally:
        stop(serve)
    # A proxy header from an address not named trusted is ignored too.
    args = ("--rate", "2", "--proxy-header", "X-Forwarded-For", "--trusted-proxy", "192.0.2.1")
    serve, url = start_serve(site.deployment.client_dir, tmp_path / "serve3.log", *args)
    try:
        assert [upload(f"203.0.113.{i}") for i in range(3)] == [200, 200, 429]
    finally:
        stop(serve)


def test_cli_refuses_bad_directories_and_listen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], site: SurveyServers
) -> None:
    def run(*args: str) -> str:
        assert veil_main(["survey", "serve", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("veil survey serve: ") and err.count("\n") == 1
        return err

    assert "cannot read the survey description" in run(
        "--survey-dir", str(tmp_path), "--listen", "127.0.0.1:8000"
    )
    assert "refusing plaintext HTTP" in run(
        "--survey-dir", str(site.deployment.client_dir), "--listen", "0.0.0.0:8000"
    )
    assert "is not HOST:PORT" in run(
        "--survey-dir", str(site.deployment.client_dir), "--listen", "8000"
    )
    (tmp_path / "survey.json").write_text('{"format": "veil-survey/1"')
    assert "not a survey description" in run(
        "--survey-dir", str(tmp_path), "--listen", "127.0.0.1:8000"
    )
    # A task file that does not match the description's task id.
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in site.deployment.client_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "remote.toml").write_bytes((bad / "commute.toml").read_bytes())
    assert "survey description names" in run("--survey-dir", str(bad), "--listen", "127.0.0.1:8000")


def test_https_listener(tmp_path: Path, site: SurveyServers) -> None:
    from tests.support.tls import name, write_ca, write_server_cert

    ca_key, _ = write_ca(tmp_path / "ca.pem", "web CA")
    write_server_cert(
        tmp_path / "web.pem", tmp_path / "web.key", "localhost", ca_key, name("web CA")
    )
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    serve, url = start_serve(
        site.deployment.client_dir,
        tmp_path / "serve.log",
        "--tls-cert",
        str(tmp_path / "web.pem"),
        "--tls-key",
        str(tmp_path / "web.key"),
        "--read-timeout",
        "3",
        context=context,
    )
    try:
        assert url.startswith("https://")
        # A connection that never starts its TLS handshake is closed at the
        # read deadline like any other, not held for asyncio's 60 s.
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
            began = time.monotonic()
            assert idle.recv(100) == b""
            assert 2 < time.monotonic() - began < 10
        status, headers, body = http(url, context=context)
        assert status == 200 and b"Team survey" in body
        assert "default-src 'none'" in headers["content-security-policy"]
        # Plain HTTP to the TLS port gets no page.
        with pytest.raises(OSError):
            http(url.replace("https://", "http://"))
    finally:
        stop(serve)


def test_unreachable_aggregators_answer_503_without_stalling(
    tmp_path: Path, site: SurveyServers
) -> None:
    # The same survey, its task files pointing at ports where nobody listens.
    dead = f"127.0.0.1:{free_port()}"
    copy = tmp_path / "client"
    copy.mkdir()
    for f in site.deployment.client_dir.iterdir():
        text = f.read_text()
        if f.suffix == ".toml":
            text = re.sub(r'(leader|helper)_address = "[^"]+"', rf'\1_address = "{dead}"', text)
        (copy / f.name).write_text(text)
    good = _one_report(site)
    serve, url = start_serve(copy, tmp_path / "serve.log")
    try:
        began = time.monotonic()
        status, _, body = http(url + "hpke-configs.json")
        assert status == 503 and "HPKE config is unavailable" in json.loads(body)["error"]
        status, doc = post_json(url + "reports", {"reports": [good]})
        assert status == 503 and doc["error"].startswith("the leader is unreachable")
        assert time.monotonic() - began < 30
        assert http(url)[0] == 200  # the page is still served
    finally:
        stop(serve)


def test_slow_body_is_cut_off(tmp_path: Path, site: SurveyServers) -> None:
    serve, url = start_serve(
        site.deployment.client_dir, tmp_path / "serve.log", "--body-timeout", "1"
    )
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"reports": ['
            )
            began = time.monotonic()
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:40]
            assert time.monotonic() - began < 5
        assert http(url)[0] == 200
    finally:
        stop(serve)


def test_local_layer_reaches_the_page(tmp_path: Path) -> None:
    # No servers needed: what the site hands the page for a question whose
    # answers are randomized on the device.
    text = SURVEY.format(
        epsilon="1",
        mechanism="geometric",
        tp=3600,
        opens="2026-05-01T00:00:00Z",
        closes="2026-05-02T00:00:00Z",
    )
    text = text.replace('kind = "yes_no"\n', 'kind = "yes_no"\nlocal_epsilon = 2\n', 1)
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "out", "127.0.0.1:1", "127.0.0.1:2", tls=False
    )
    site = SurveySite(dep.client_dir)
    try:
        remote, commute = site.public["questions"][:2]
        assert remote["dp"]["local_epsilon"] == "2"
        assert "dp" not in commute
        page = render_page(site.description.survey, "sha384-x", "sha384-y")
        assert page.count("randomizes the answer") == 1
    finally:
        site.close()


def test_add_remove_survey_the_page_cannot_answer_is_refused(tmp_path: Path) -> None:
    # Under add_remove a number, an option list or a vector carries a count element
    # the page does not add: serving it would refuse every respondent.
    text = SURVEY.format(
        epsilon="1",
        mechanism="geometric",
        tp=3600,
        opens="2026-05-01T00:00:00Z",
        closes="2026-05-02T00:00:00Z",
    ).replace("[survey]\n", '[survey]\nneighbouring = "add_remove"\n', 1)
    dep = deploy_survey(
        parse_survey(text), text, tmp_path / "out", "127.0.0.1:1", "127.0.0.1:2", tls=False
    )
    with pytest.raises(ServeError, match="commute, tools, ratings"):
        SurveySite(dep.client_dir)


def test_a_survey_over_dap_gives_the_page_what_it_seals_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each question's draft and encoded TaskConfiguration, which every share
    # binds; with invitations, where its invitation extension goes: public,
    # or in the leader's share where the helper is another implementation
    # (whose reports the relay takes with that share the extension's size
    # larger, and no public extension). The page answering it:
    # tests/web/test_browser_dap.py.
    text = (
        '[survey]\nname = "over dap"\nepsilon = 1\nmin_batch_size = 5\n'
        "opens = 2026-05-01T00:00:00Z\ncloses = 2026-05-02T00:00:00Z\n{extra}\n"
        '[[question]]\nid = "remote"\nkind = "yes_no"\n\n'
        '[[question]]\nid = "team"\nkind = "choice"\noptions = ["red", "blue"]\n'
    )
    dap = DapSpec("http://127.0.0.1:8001/", "http://127.0.0.1:8002/", "dap-18", "page")
    invited = text.format(extra="invitations = true\n")
    for name, survey, spec, place in (
        ("plain", text.format(extra=""), dap, None),
        ("invited", invited, dap, "public"),
        ("private", invited, replace(dap, other_implementation="helper"), "leader"),
    ):
        dep = deploy_survey(
            parse_survey(survey), survey, tmp_path / name, "127.0.0.1:1", "127.0.0.1:2",
            tls=False, dap=spec,
        )  # fmt: skip
        issuer = {"issuer_dir": dep.out / "issuer"} if place else {}
        site = SurveySite(dep.client_dir, **issuer)
        try:
            for q in site.public["questions"]:
                task = site.tasks[q["task_id"]]
                encoded = task.dap_configuration().encode(DapVersion.DAP_18)
                want = {"version": "dap-18", "configuration": b64e(encoded)}
                assert q["dap"] == want | ({"invitation": place} if place else {})
            if name == "private":
                _private_invitation_reports(site)
        finally:
            site.close()


def _private_invitation_reports(site: SurveySite) -> None:
    """Where the invitation extension rides in the leader's share, the
    relay takes a report whose leader share holds it (it cannot read the
    token: the leader checks it) and refuses one without it, or with a
    public one too."""
    task = next(iter(site.tasks.values()))
    assert task.dap is not None and task.invitation_private
    leader, helper = generate_keypair(1).config, generate_keypair(2).config
    extension = (Extension(INVITATION_EXTENSION, bytes(INVITATION_DATA_SIZE)),)

    def posted(**where: tuple[Extension, ...]) -> bytes:
        report = prepare_report(
            task.dap.dap_version if task.dap else DapVersion.DAP_19, task.task_id,
            task.dap_configuration(), task.vdaf.instantiate(), 1, 1000, leader, helper, **where,
        )  # fmt: skip
        item = {"task_id": task.id_text, "dap_report": b64e(report.encode())}
        return json.dumps({"reports": [item]}).encode()

    assert list(site.parse_reports(posted(leader_private_extensions=extension))) == [task.id_text]
    for body, words in (
        (posted(), "the leader's share is not of this task's size"),
        (
            posted(leader_private_extensions=extension, public_extensions=extension),
            "carry no extension",
        ),
    ):
        with pytest.raises(BadRequest, match=words):
            site.parse_reports(body)


def test_a_port_in_use_is_said_before_serving(
    capsys: pytest.CaptureFixture[str], site: SurveyServers
) -> None:
    # uvicorn printed "serving the survey on ..." and then failed to bind.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        code = veil_main(
            [
                "survey",
                "serve",
                "--survey-dir",
                str(site.deployment.client_dir),
                "--listen",
                address,
            ]
        )
    said = capsys.readouterr()
    assert code == 2 and "serving" not in said.out
    assert said.err.endswith(
        f"veil survey serve: cannot listen on {address}: the address is in use by another process\n"
    )


def raw_http(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as it is on a fresh connection; the status, the headers
    (names in lower case) and the body of the answer, read until it closes."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not _whole(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def _whole(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _post_raw(body: bytes, headers: bytes = b"Content-Type: application/json\r\n") -> bytes:
    return (
        b"POST /reports HTTP/1.1\r\nHost: page\r\n"
        + headers
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def test_malformed_requests_get_4xx_with_security_headers(site: SurveyServers) -> None:
    good = sealed_report(site.deployment.client_dir, "remote", 1)
    before = stored(site)
    digits = "7" * 5000

    def with_raw(field: str, text: str) -> bytes:
        # A report whose `field` is `text` verbatim (JSON that json.dumps would not write).
        marker = "__veil_marker__"
        doc = json.dumps({"reports": [_with(good, field, marker)]})
        return doc.replace(f'"{marker}"', text).encode()

    bodies: list[tuple[str, bytes, int]] = [
        ("60,000 [", b"[" * 60_000, 400),
        ("10,000 { in a report", b'{"reports": [' + b'{"a": ' * 10_000, 400),
        ("deep nesting in a field", with_raw("time", "[" * 20_000 + "]" * 20_000), 400),
        ("5,000-digit time", with_raw("time", digits), 400),
        ("5,000-digit task_id", with_raw("task_id", digits), 400),
        ("5,000-digit config_id", with_raw("leader_encrypted_input_share.config_id", digits), 400),
        ("4,000-digit time", with_raw("time", "9" * 4000), 400),
        ("NaN time", with_raw("time", "NaN"), 400),
        ("infinite time", with_raw("time", "1e999"), 400),
        ("fractional time", with_raw("time", "1.5"), 400),
        ("empty", b"", 400),
        ("not UTF-8", b"\xff\xfe\xfd", 400),
        ("lone surrogate", b'{"reports": ["\\ud800"]}', 400),
        ("null", b"null", 400),
        ("a string", b'"reports"', 400),
        ("trailing data", json.dumps({"reports": [good]}).encode() + b" []", 400),
    ]
    requests: list[tuple[str, bytes, int]] = [
        (what, _post_raw(body), status) for what, body, status in bodies
    ]
    requests += [
        ("wrong type", _post_raw(b"x", b"Content-Type: text/plain\r\n"), 415),
        ("no type", _post_raw(b"{}", b""), 415),
        (
            "declared too large",
            b"POST /reports HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            b"Content-Length: 70000\r\n\r\n",
            413,
        ),
        (
            "chunked too large",
            b"POST /reports HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + (b"4000\r\n" + b"[" * 0x4000 + b"\r\n") * 5,
            413,
        ),
        (
            "bad chunk size",
            b"POST /reports HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
            400,
        ),
        ("bad length", _post_raw(b"{}").replace(b"Content-Length: 2", b"Content-Length: x"), 400),
        (
            "two lengths",
            _post_raw(b"{}").replace(
                b"Content-Length: 2", b"Content-Length: 2\r\nContent-Length: 3"
            ),
            400,
        ),
        ("garbage", b"\x00\x01\x02 nonsense\r\n\r\n", 400),
        # Headers that never end, past what h11 buffers (16 KiB).
        ("endless headers", b"GET / HTTP/1.1\r\nHost: p\r\nX-Pad: " + b"a" * 20_000, 400),
        (
            "unknown coding",
            b"POST /reports HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: gzip\r\n\r\n",
            400,
        ),
    ]
    for what, request, expected in requests:
        status, headers, body = raw_http(site.url, request)
        assert status == expected, (what, status, body[:200])
        assert "default-src 'none'" in headers.get("content-security-policy", ""), (what, headers)
        assert headers.get("x-content-type-options") == "nosniff", what
        assert "error" in json.loads(body), what
    assert stored(site) == before
    assert http(site.url)[0] == 200
    log = (site.deployment.out.parent / "serve.log").read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log
    # The requests h11 cannot parse are counted, not a log line each.
    assert "Invalid HTTP request" not in log
    assert 1 <= log.count("that were not HTTP/1.1") <= 2


def test_a_reused_report_id_with_other_content_is_409(site: SurveyServers) -> None:
    first = sealed_report(site.deployment.client_dir, "remote", 1)
    assert post_json(site.url + "reports", {"reports": [first]})[0] == 200
    other = {**sealed_report(site.deployment.client_dir, "remote", 0)}
    other["report_id"] = first["report_id"]
    status, doc = post_json(site.url + "reports", {"reports": [other]})
    assert status == 409, doc
    assert "reload the page" in doc["error"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--max-per-address", "0"), "--max-per-address must be at least 1"),
        (("--max-connections", "-5"), "--max-connections must be at least 1"),
        (("--read-timeout", "0"), "--read-timeout must be more than 0"),
        (("--read-timeout", "nan"), "--read-timeout must be more than 0"),
        (("--read-timeout", "inf"), "--read-timeout must be more than 0"),
        (("--header-timeout", "0"), "--header-timeout must be more than 0"),
        (("--header-timeout", "nan"), "--header-timeout must be more than 0"),
        (("--header-timeout", "-1"), "--header-timeout must be more than 0"),
        (("--header-timeout", "inf"), "--header-timeout must be more than 0"),
        (("--proxy-header", "X Forwarded: 1"), "is not a header name"),
        (("--proxy-header", ""), "is not a header name"),
        (("--trusted-proxy", "127.0.0.1"), "give --proxy-header"),
        (("--proxy-header", "X-Real-IP", "--trusted-proxy", "proxy.local"), "not an IP address"),
    ],
)
def test_cli_refuses_bad_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    # No survey directory is read before the options are checked.
    code = veil_main(
        ["survey", "serve", "--survey-dir", str(tmp_path), "--listen", "127.0.0.1:8000", *args]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("veil survey serve: ") and err.count("\n") == 1
    assert message in err, err
