"""The web server of `veil survey serve` (Starlette, run by uvicorn).

Routes, each a small handler that checks its input and calls one function:

- ``GET /``                   the survey page (`veil.web.page`);
- ``GET /static/...``         the bundled client script and the stylesheet;
- ``GET /survey.json``        the public survey description, each question with
                              the ``vdaf`` of its task file;
- ``GET /hpke-configs.json``  each aggregator's HPKE config per task, fetched
                              over gRPC and kept for its lifetime;
- ``POST /reports``           sealed reports, forwarded to the leader's
                              UploadReports.

The server never receives an answer: a report is a report id, a time, the
public share and two HPKE ciphertexts, exactly what the leader stores. It
checks their sizes against each task's VDAF before forwarding, bounds the body
size, the reports per request and the uploads per client address, and sets a
strict Content-Security-Policy on every response, errors included. Who may
hold a connection, and for how long, is `veil.web.guard`'s part.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import ipaddress
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from veil.client import ClientOptions, DapClient, UploadError, client_for
from veil.dap.codec import DecodeError
from veil.dap.messages import Report as DapReport
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.invite.http import PATH as INVITATION_PATH
from veil.invite.http import endpoint as invitation_endpoint
from veil.invite.http import read_json_body
from veil.invite.issuer import Issuer, IssuerError
from veil.messages import ENC_SIZE, REPORT_ID_SIZE, Ciphertext, Report
from veil.survey import Description, SurveyError, load_description
from veil.task import Task, b64e
from veil.vdaf.spec.xof import XofTurboShake128
from veil.web.dap import ReportRefused, check_report, page_part, share_overhead

log = logging.getLogger("veil.web")

# AES-128-GCM appends a 16-byte tag to the sealed input share.
AEAD_TAG_SIZE = 16

# Every response: nothing but this server's own script, style and JSON; no
# framing, no inline code, no plugins, forms post only here.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"
        " img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}

_REPORT_KEYS = {
    "task_id",
    "report_id",
    "time",
    "public_share",
    "leader_encrypted_input_share",
    "helper_encrypted_input_share",
}
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_CIPHERTEXT_KEYS = {"config_id", "enc", "payload"}


# Kinds whose add_remove encoding is the page's own (an index into a histogram).
_PAGE_ADD_REMOVE = ("yes_no", "choice")


class ServeError(ValueError):
    """The survey directory or an option cannot be served."""


class BadRequest(ValueError):
    """A request to refuse with 400; the message says what is wrong."""


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on what one client may send and hold.

    `max_body` bytes per request; `max_reports` per request (None: one per
    question); `rate` uploads per `per` seconds from one client address, with
    bursts up to `rate`. `header_timeout` seconds from a connection's start
    (or its previous response) to a request's whole headers, `read_timeout`
    to the whole request, headers and body; `max_connections` open at once
    (None: sized from memory, veil.web.guard.connection_cap),
    `max_per_address` of them from one address (an IPv6 /64 counts as
    one). `proxy_header` names the header in which a reverse proxy at one
    of `trusted_proxies` passes the client's address (the last address in
    it is taken: the one the proxy added); None: addresses are the TCP
    peers'.
    """

    max_body: int = 64 * 1024
    max_reports: int | None = None
    rate: int = 20
    per: float = 60.0
    read_timeout: float = 10.0
    header_timeout: float = 3.0
    max_connections: int | None = None
    max_per_address: int = 32
    proxy_header: str | None = None
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")

    @property
    def header_seconds(self) -> float:
        """The headers' deadline: never later than the whole request's."""
        return min(self.header_timeout, self.read_timeout)

    def trusts(self, peer: str) -> bool:
        """Whether `peer` is a proxy whose `proxy_header` names the client."""
        if self.proxy_header is None:
            return False
        return normal_address(peer) in {normal_address(a) for a in self.trusted_proxies}


def normal_address(host: str) -> str:
    """`host` as one spelling (an IPv4-mapped IPv6 address as IPv4); a
    host that is not an IP address is returned as it is."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


@functools.lru_cache(maxsize=4096)  # parsing costs ~10 µs; once per connection
def address_key(host: str) -> str:
    """What one client is, for the limits: its IPv4 address, or the /64 of
    its IPv6 address (one subscriber's allocation: addresses within it cost
    nothing to change)."""
    text = normal_address(host)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return text


class RateLimiter:
    """A token bucket per client address. Memory is bounded: when it tracks
    too many addresses it drops those whose buckets are full again."""

    MAX_TRACKED = 100_000

    def __init__(self, rate: int, per: float, clock: Callable[[], float] = time.monotonic):
        self.capacity = float(rate)
        self.refill = rate / per
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    @property
    def tracked(self) -> int:
        """How many addresses it remembers now (pruned back at MAX_TRACKED)."""
        return len(self._buckets)

    def allow(self, key: str) -> bool:
        now = self.clock()
        tokens, last = self._buckets.get(key, (self.capacity, now))
        tokens = min(self.capacity, tokens + (now - last) * self.refill)
        if len(self._buckets) >= self.MAX_TRACKED:
            self._prune(now)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True

    def retry_after(self, key: str) -> int:
        """Whole seconds until `key` has a request again."""
        tokens, last = self._buckets.get(key, (self.capacity, self.clock()))
        tokens = min(self.capacity, tokens + (self.clock() - last) * self.refill)
        return max(1, math.ceil((1.0 - tokens) / self.refill))

    def _prune(self, now: float) -> None:
        full = [
            k
            for k, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self.refill >= self.capacity
        ]
        for k in full:
            del self._buckets[k]


@dataclass(frozen=True)
class _TaskShape:
    """What a report of one task must look like, from its VDAF."""

    public_share: int
    leader_payload: int
    helper_payload: int


def _shape(task: Task) -> _TaskShape:
    if task.vdaf.is_prefix:
        # A text question: the IDPF's public share and each aggregator's key,
        # correlation seed and correlated randomness (Poplar1's codecs).
        poplar1 = task.vdaf.instantiate_poplar1()
        return _TaskShape(
            public_share=poplar1.public_share_size(),
            leader_payload=poplar1.input_share_size(0) + AEAD_TAG_SIZE,
            helper_payload=poplar1.input_share_size(1) + AEAD_TAG_SIZE,
        )
    vdaf = task.vdaf.instantiate()
    seed = XofTurboShake128.SEED_SIZE
    joint = vdaf.flp.JOINT_RAND_LEN > 0
    blind = seed if joint else 0
    leader = (vdaf.flp.MEAS_LEN + vdaf.flp.PROOF_LEN * vdaf.PROOFS) * vdaf.field.ENCODED_SIZE
    return _TaskShape(
        public_share=vdaf.SHARES * seed if joint else 0,
        leader_payload=leader + blind + AEAD_TAG_SIZE,
        helper_payload=seed + blind + AEAD_TAG_SIZE,
    )


def _static(name: str) -> bytes:
    return (resources.files("veil.web") / "static" / name).read_bytes()


def _integrity(data: bytes) -> str:
    return "sha384-" + base64.b64encode(hashlib.sha384(data).digest()).decode()


def _b64(value: Any, what: str, size: int | None = None) -> bytes:
    if not isinstance(value, str) or len(value) > 100_000:
        raise BadRequest(f"{what} must be base64url text")
    if not _B64URL.fullmatch(value):
        raise BadRequest(f"{what} is not base64url")
    try:
        data = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what} is not base64url") from None
    if size is not None and len(data) != size:
        raise BadRequest(f"{what} must be {size} bytes, got {len(data)}")
    return data


def _known(item: Any, tasks: dict[str, Task]) -> bool:
    """Whether `item` is an object naming a task of `tasks` (checked again later)."""
    return (
        isinstance(item, dict) and isinstance(item.get("task_id"), str) and item["task_id"] in tasks
    )


def _object(value: Any, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be an object")
    if set(value) != keys:
        extra = sorted(set(value) - keys)
        missing = sorted(keys - set(value))
        raise BadRequest(
            f"{what}: " + (f"unexpected field {extra[0]!r}" if extra else f"missing {missing[0]!r}")
        )
    return value


def _ciphertext(value: Any, what: str, payload_size: int) -> Ciphertext:
    d = _object(value, _CIPHERTEXT_KEYS, what)
    config_id = d["config_id"]
    if isinstance(config_id, bool) or not isinstance(config_id, int) or not 0 <= config_id <= 255:
        raise BadRequest(f"{what}.config_id must be an integer in 0..255")
    return Ciphertext(
        config_id,
        _b64(d["enc"], f"{what}.enc", ENC_SIZE),
        _b64(d["payload"], f"{what}.payload", payload_size),
    )


class SurveySite:
    """The survey of one deployment's client/ directory, its aggregators and
    the page's files. Loads and checks everything at start, so that a
    misconfigured directory fails before the server listens."""

    def __init__(
        self,
        survey_dir: Path,
        *,
        leader_root_certificates: bytes | None = None,
        helper_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        limits: ServeLimits | None = None,
        timeout: float = 10.0,
        issuer_dir: Path | None = None,
    ) -> None:
        try:
            self.description: Description = load_description(survey_dir)
        except SurveyError as e:
            raise ServeError(str(e)) from None
        survey = self.description.survey
        # A survey with invitations: the issuer's POST /invitation is served
        # here too (veil.invite.http), and every report carries its token.
        self.issuer: Issuer | None = None
        if survey.invitations:
            if issuer_dir is None:
                raise ServeError(
                    "the survey takes answers from invited respondents only: give --issuer-dir"
                    " (the deployment's issuer/ directory) to redeem their invitations here"
                )
            try:
                self.issuer = Issuer(issuer_dir)
            except IssuerError as e:
                raise ServeError(str(e)) from None
        counted = [
            q.id for q in survey.questions if q.add_remove and q.kind not in _PAGE_ADD_REMOVE
        ]
        if counted:
            # Under add_remove these reports carry a count element the page does not
            # add yet: every respondent would be refused. Say so before serving.
            raise ServeError(
                f"the survey uses neighbouring add_remove, and the page cannot yet answer its"
                f" questions {', '.join(counted)} (numbers, multiple choices and vectors carry"
                " a count element there); collect those with the Python client"
            )
        try:
            by_question = self.description.load_tasks()
        except SurveyError as e:
            raise ServeError(str(e)) from None
        self.tasks: dict[str, Task] = {t.id_text: t for t in by_question.values()}
        self.question_of = {t.id_text: qid for qid, t in by_question.items()}
        questions = []
        raw = self.description.document
        for entry in raw["questions"]:
            task = self.tasks[entry["task_id"]]
            # The page's client needs the VDAF of the task file and, where the
            # question randomizes answers on the device, its local layer.
            question = {**entry, "vdaf": task.vdaf.to_dict()}
            if task.dp.local_epsilon is not None:
                dp = task.dp.to_dict()
                question["dp"] = {
                    k: dp[k] for k in ("local_epsilon", "local_max_choices") if k in dp
                }
            questions.append({**question, **page_part(task)})
        self.public = {**raw, "questions": questions}
        if "breakdowns" in raw:
            # A breakdown is answered on the device from the answers already given.
            self.public["breakdowns"] = [
                {
                    **entry,
                    "vdaf": self.tasks[entry["task_id"]].vdaf.to_dict(),
                    **page_part(self.tasks[entry["task_id"]]),
                }
                for entry in raw["breakdowns"]
            ]
        self.shapes = {tid: _shape(task) for tid, task in self.tasks.items()}
        self.limits = limits or ServeLimits()
        self.max_reports = self.limits.max_reports or len(self.tasks)
        # One veil client per task: its channels, its HPKE config cache (each
        # config kept for its lifetime) and its UploadReports. A respondent
        # retries by hand, so the server's own retries are few, and an
        # overloaded leader's advice to wait is passed on (Retry-After)
        # rather than waited out here.
        options = ClientOptions(
            leader_root_certificates=leader_root_certificates,
            helper_root_certificates=helper_root_certificates,
            private_key=private_key,
            certificate_chain=certificate_chain,
            timeout=timeout,
            retries=1,
            backoff=0.2,
            max_delay=0.5,
        )
        # Over DAP for a task with a [dap] table: the page seals DAP reports
        # (js/src/dap.js) and they are relayed as DAP uploads.
        self.clients = {tid: client_for(task, options) for tid, task in self.tasks.items()}
        self.script = _static("veil-survey.js")
        self.style = _static("survey.css")
        self.icon = _static("favicon.svg")

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def hpke_configs(self) -> dict[str, Any]:
        """Each task's leader and helper HPKE configs (blocking gRPC on a miss)."""

        def as_json(c: HpkeConfig) -> dict[str, Any]:
            return {
                "config_id": c.config_id,
                "kem_id": c.kem_id,
                "kdf_id": c.kdf_id,
                "aead_id": c.aead_id,
                "public_key": b64e(c.public_key),
            }

        return {
            tid: {
                "leader": [as_json(client.hpke_config(ROLE_LEADER))],
                "helper": [as_json(client.hpke_config(ROLE_HELPER))],
            }
            for tid, client in self.clients.items()
        }

    def parse_reports(self, body: bytes) -> dict[str, list[Report | DapReport]]:
        """The reports of a POST body, grouped by task id; BadRequest otherwise."""
        try:
            doc = json.loads(body)
        except RecursionError:
            raise BadRequest("the body nests too deeply") from None
        except ValueError:
            # Not UTF-8, not JSON, or a number of more digits than Python converts.
            raise BadRequest("the body is not JSON") from None
        items = _object(doc, {"reports"}, "the body")["reports"]
        if not isinstance(items, list) or not items:
            raise BadRequest("`reports` must be a non-empty list")
        if len(items) > self.max_reports:
            raise BadRequest(f"at most {self.max_reports} reports per request")
        grouped: dict[str, list[Report | DapReport]] = {}
        for n, item in enumerate(items):
            what = f"report {n + 1}"
            if _known(item, self.tasks) and self.tasks[item["task_id"]].dap is not None:
                tid = item["task_id"]
                if tid in grouped:
                    raise BadRequest(
                        f"{what}: a second report for question {self.question_of[tid]!r}"
                    )
                d = _object(item, {"task_id", "dap_report"}, what)
                grouped[tid] = [self._dap_report(d["dap_report"], tid, what)]
                continue
            token_size = self.tasks[item["task_id"]].token_size if _known(item, self.tasks) else 0
            d = _object(item, _REPORT_KEYS | ({"token"} if token_size else set()), what)
            tid = d["task_id"]
            if not isinstance(tid, str) or tid not in self.tasks:
                raise BadRequest(f"{what}: not a task of this survey")
            if tid in grouped:
                raise BadRequest(f"{what}: a second report for question {self.question_of[tid]!r}")
            shape = self.shapes[tid]
            t = d["time"]
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**63:
                raise BadRequest(f"{what}: time must be a whole number of seconds")
            grouped[tid] = [
                Report(
                    _b64(d["report_id"], f"{what}: report_id", REPORT_ID_SIZE),
                    t,
                    _b64(d["public_share"], f"{what}: public_share", shape.public_share),
                    _ciphertext(
                        d["leader_encrypted_input_share"],
                        f"{what}: leader_encrypted_input_share",
                        shape.leader_payload,
                    ),
                    _ciphertext(
                        d["helper_encrypted_input_share"],
                        f"{what}: helper_encrypted_input_share",
                        shape.helper_payload,
                    ),
                    _b64(d["token"], f"{what}: token") if token_size else b"",
                )
            ]
        return grouped

    def _dap_report(self, value: Any, tid: str, what: str) -> DapReport:
        """A DAP task's report: the draft's Report encoding, in base64url,
        of the sizes the task's VDAF gives (each sealed PlaintextInputShare
        longer than the share: veil.web.dap.share_overhead), with the
        extensions the task takes (veil.web.dap.check_report)."""
        shape = self.shapes[tid]
        try:
            report = DapReport.decode(_b64(value, f"{what}: dap_report"))
        except DecodeError as e:
            raise BadRequest(f"{what}: not a DAP report ({e})") from None
        if len(report.public_share) != shape.public_share:
            raise BadRequest(f"{what}: public_share must be {shape.public_share} bytes")
        overhead = share_overhead(self.tasks[tid])
        for name, ct, size, extra in (
            ("leader", report.leader_encrypted_input_share, shape.leader_payload, overhead[0]),
            ("helper", report.helper_encrypted_input_share, shape.helper_payload, overhead[1]),
        ):
            if len(ct.enc) != ENC_SIZE or len(ct.payload) != size + extra:
                raise BadRequest(f"{what}: the {name}'s share is not of this task's size")
        try:
            check_report(self.tasks[tid], report)
        except ReportRefused as e:
            raise BadRequest(f"{what}: {e}") from None
        return report

    def upload(self, grouped: dict[str, list[Report | DapReport]]) -> tuple[int, int]:
        """Forward to the leader, task by task (blocking). Raises UploadError."""
        accepted = duplicates = 0
        for tid, reports in grouped.items():
            client = self.clients[tid]
            if isinstance(client, DapClient):
                result = client.upload_reports(
                    [r for r in reports if isinstance(r, DapReport)],
                    invited=self.issuer is not None,
                )
            else:
                result = client.upload_reports([r for r in reports if isinstance(r, Report)])
            accepted += result.accepted
            duplicates += result.duplicates
        return accepted, duplicates


# The leader's refusals as HTTP statuses: the respondent's page shows the
# message and lets them try again where that can help.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    # A survey with invitations: the report's token is missing or invalid.
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.OUT_OF_RANGE: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    # A report id already stored with other content: a fresh answer needs a fresh id.
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 503,
}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def client_address(request: Request, limits: ServeLimits) -> str:
    """The address the rate limit keys on: the TCP peer's, or, from a trusted
    proxy, the last address in its header. BadRequest when a trusted proxy
    does not name one: keying on the proxy would let one client lock out all."""
    peer = request.client.host if request.client else ""
    if limits.proxy_header is None or not limits.trusts(peer):
        return address_key(peer)
    values = ",".join(request.headers.getlist(limits.proxy_header)).split(",")
    last = values[-1].strip()
    try:
        ipaddress.ip_address(last)
    except ValueError:
        raise BadRequest(
            f"the proxy's {limits.proxy_header} header does not end with a client address"
        ) from None
    return address_key(last)


def build_app(site: SurveySite) -> Starlette:
    """The Starlette application serving `site`."""
    from veil.web.page import render_page

    page = render_page(
        site.description.survey, _integrity(site.script), _integrity(site.style)
    ).encode()
    public = json.dumps(site.public, ensure_ascii=False).encode()
    limiter = RateLimiter(site.limits.rate, site.limits.per)

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    async def script(request: Request) -> Response:
        return Response(site.script, media_type="text/javascript; charset=utf-8")

    async def style(request: Request) -> Response:
        return Response(site.style, media_type="text/css; charset=utf-8")

    async def icon(request: Request) -> Response:
        # The page names it; a browser asks for an icon anyway, and a 404 in its
        # console reads as a fault.
        return Response(site.icon, media_type="image/svg+xml")

    async def survey_json(request: Request) -> Response:
        return Response(public, media_type="application/json")

    async def hpke_configs(request: Request) -> Response:
        try:
            configs = await run_in_threadpool(site.hpke_configs)
        except UploadError as e:
            return _error(503, f"an aggregator's HPKE config is unavailable: {e.message}")
        return JSONResponse(configs)

    async def reports(request: Request) -> Response:
        # veil.web.guard cuts off a body that does not arrive in time.
        body = await read_json_body(request, site.limits.max_body, "the reports")
        if isinstance(body, Response):
            return body
        try:
            grouped = site.parse_reports(body)
            client = client_address(request, site.limits)
        except BadRequest as e:
            return _error(400, str(e))
        # Charged only now: a malformed request costs its sender nothing, so
        # it cannot use up the allowance of an address it shares with others.
        if not limiter.allow(client):
            return _error(
                429,
                "too many uploads from this address; try again in a minute",
                {"Retry-After": str(limiter.retry_after(client))},
            )
        try:
            accepted, duplicates = await run_in_threadpool(site.upload, grouped)
        except UploadError as e:
            status = _HTTP_STATUS.get(e.code, 502)
            if status == 503 and e.retry_after is not None:
                # The leader's backlog is full: the respondent's page may send
                # the same reports again after the leader's advised wait.
                wait = max(1, math.ceil(e.retry_after))
                response = _error(503, f"the survey is busy; try again in {wait} s")
                response.headers["Retry-After"] = str(wait)
                return response
            if status == 503:
                return _error(503, "the leader is unreachable; try again in a moment")
            if e.code == grpc.StatusCode.ALREADY_EXISTS and site.issuer is not None:
                return _error(
                    409,
                    "this invitation was already used to answer with other content;"
                    " an invitation answers once",
                )
            if e.code == grpc.StatusCode.ALREADY_EXISTS:
                return _error(
                    409,
                    "a report with this id but other content is already stored;"
                    " reload the page to answer again",
                )
            return _error(status, f"the leader refused: {e.message}")
        return JSONResponse({"accepted": accepted, "duplicates": duplicates})

    return _Page(
        routes=[
            Route("/", index),
            Route("/static/veil-survey.js", script),
            Route("/static/survey.css", style),
            Route("/static/favicon.svg", icon),
            Route("/favicon.ico", icon),
            Route("/survey.json", survey_json),
            Route("/hpke-configs.json", hpke_configs),
            Route("/reports", reports, methods=["POST"]),
            *(
                [
                    Route(
                        INVITATION_PATH,
                        invitation_endpoint(
                            site.issuer, lambda request: client_address(request, site.limits)
                        ),
                        methods=["POST"],
                    )
                ]
                if site.issuer is not None
                else []
            ),
        ],
    )


class _Page(Starlette):
    """The Starlette application with the security headers and the error
    containment outside Starlette's own error middleware, so that a 500 it
    sends carries the headers too and no traceback reaches the log."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(Contained(super().build_middleware_stack()))


class Contained:
    """An unexpected error in a handler: one log line (the route and the
    error's type; the traceback at debug level only, as it may quote the
    request), and a 500 if no response has started."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as e:
            log.error(
                "%s %s failed: %s", scope.get("method", ""), scope.get("path"), type(e).__name__
            )
            log.debug("the failure", exc_info=True)
            if not started and scope["type"] == "http":
                await _error(500, "the server failed; try again later")(scope, receive, send)


class SecurityHeaders:
    """Sets SECURITY_HEADERS on every response (errors included), and
    `no-store` on what must not be cached: the page, configs and uploads."""

    NO_STORE = ("/", "/hpke-configs.json", "/reports")

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        no_store = scope["path"] in self.NO_STORE

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if no_store:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
