"""The client of a DAP task (draft-ietf-ppm-dap section 4.4, client side):
`Client`'s uploads over DAP's HTTP routes.

Each aggregator's HpkeConfigList is fetched from ``{endpoint}/hpke_config``
(and kept for `config_lifetime` seconds); each measurement is sharded under
the context ``tag || task_id``, its input shares sealed with DAP's `info`
and InputShareAad (`veil.dap.report`), and the reports are POSTed as an
UploadRequest to ``{leader}/tasks/{task-id}/reports``. The leader answers
with UploadErrors naming the reports it refused. A report refused with
``hpke_unknown_config_id`` (``outdated_config`` under -18) is sealed again,
once, to the configs fetched anew (-19's rule), with the same report id and
randomness: the same report under the aggregators' current keys. A retried
request sends the same reports, which the leader acknowledges without
storing twice. No HTTP redirect is followed, of an hpke_config or an
upload: a 3xx is an UploadError naming its Location, nothing fetched from
or sent there (the client carries no token, but a config fetched elsewhere
would seal the reports to another's key).

With an outbox (`ClientOptions.outbox`), each report is sealed and committed
to it before it is sent, as `Client` does (veil.client.outbox, the same
file format and delivery plan, DAP's reports kept as their encoding), and
leaves it once the leader took it: a report the leader names in
UploadErrors is kept there marked refused, except `report_replayed`, which
to a report sent again after a crash means the leader holds it already. The
outbox keeps sealed reports, not measurements: a report the leader refuses
for an unknown HPKE config is refused for good then, not sealed again.
"""

from __future__ import annotations

import logging
import secrets
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import grpc

from veil.client.base import (
    ClientOptions,
    PartlyRefused,
    Sent,
    UploadResult,
    advance,
    delivery_plan,
)
from veil.client.client import Client
from veil.client.outbox import Outbox
from veil.client.prepare import randomize_measurements
from veil.client.retry import RetryPolicy, UploadError
from veil.dap.codec import DecodeError
from veil.dap.invitation import InvitationExtension, dap_redemption_context, sealed_key_digest
from veil.dap.messages import (
    REPORT_ID_SIZE,
    Extension,
    HpkeConfigList,
    Report,
    UploadErrors,
    UploadRequest,
)
from veil.dap.problems import MediaTypeError, Problem, media_type, message_of
from veil.dap.report import prepare_report
from veil.dap.urls import opener
from veil.dap.versions import ReportError, vdaf_context
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig, new_ephemeral
from veil.task import Task
from veil.trust import check_roots

log = logging.getLogger(__name__)

# The largest answer read from an aggregator: an HpkeConfigList or
# UploadErrors is far smaller.
MAX_ANSWER = 1 << 20

# What says the leader does not hold the key a report was sealed to.
UNKNOWN_CONFIG = (ReportError.HPKE_UNKNOWN_CONFIG_ID, ReportError.OUTDATED_CONFIG)

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass(frozen=True)
class DapReports:
    """DAP's reports as an outbox keeps them (veil.client.outbox.ReportCodec):
    their encoding; a report's time counts `time_precision`s."""

    time_precision: int

    def encode(self, report: Report) -> bytes:
        return report.encode()

    def decode(self, blob: bytes) -> Report:
        return Report.decode(blob)  # a DecodeError is a ValueError

    def report_id(self, report: Report) -> bytes:
        return report.metadata.report_id

    def time(self, report: Report) -> int:
        return report.metadata.time * self.time_precision


def _slices(reports: Sequence[Report], size: int) -> Iterator[Sequence[Report]]:
    return (reports[i : i + size] for i in range(0, len(reports), size))


@dataclass(frozen=True)
class _Pending:
    """A measurement and the randomness its report was built from, so that
    it can be sealed again to fresh configs as the same report."""

    measurement: Any
    time: int
    report_id: bytes
    rand: bytes


@dataclass(frozen=True)
class InvitedReport:
    """An invited report between `DapClient.prepare_invited` and
    `upload_invited`: what it is built from, the aggregators' configs and
    the ephemeral keys its shares are sealed with, the leader's key digest
    and the redemption context its token is signed for."""

    pending: _Pending
    configs: tuple[HpkeConfig, HpkeConfig]
    ephemerals: tuple[bytes, bytes]
    leader_key_digest: bytes
    context: bytes


class DapClient:
    """Uploads measurements of one DAP task (a task file with a `[dap]`
    table) to its leader over DAP; `upload`, `upload_batch` and
    `hpke_config` and `flush` as `Client`'s. `options` as `Client`'s (trust,
    timeout, retries, batch size, clock, config lifetime, outbox). Raises
    UploadError when the leader refuses a request or a report, or stays
    unreachable (with an outbox: the reports stay pending instead, and the
    result says so)."""

    def __init__(
        self,
        task: Task,
        options: ClientOptions | None = None,
        **changes: Any,
    ) -> None:
        options = ClientOptions.given(options, changes)
        if task.dap is None:
            raise ValueError(f"task {task.id_text} is not served over DAP (no [dap] table)")
        if task.vdaf.is_prefix:
            raise ValueError("a poplar1 task is not served over DAP")
        if options.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        check_roots(
            options.leader_root_certificates,
            options.helper_root_certificates,
            task.leader_ca_sha256,
            task.helper_ca_sha256,
        )
        self.task = task
        self.dap = task.dap
        self.options = options
        self.vdaf = task.vdaf.instantiate()
        self.configuration = task.dap_configuration()
        self.policy = RetryPolicy(options.retries, options.backoff, options.max_delay)
        # No redirect is followed: a 3xx is the aggregator's answer (_refusal).
        self._openers = {
            ROLE_LEADER: opener(_context(options.leader_root_certificates)),
            ROLE_HELPER: opener(_context(options.helper_root_certificates)),
        }
        self._endpoints = {
            ROLE_LEADER: _base(self.dap.leader_endpoint),
            ROLE_HELPER: _base(self.dap.helper_endpoint),
        }
        self._configs: dict[int, tuple[HpkeConfig, float]] = {}
        self.outbox: Outbox[Report] | None = (
            None
            if options.outbox is None
            else Outbox(
                options.outbox,
                options.outbox_max_reports,
                codec=DapReports(task.time_precision),
            )
        )
        self._flush_lock = threading.Lock()

    def close(self) -> None:
        """Close the outbox, if any (each request is its own connection)."""
        if self.outbox is not None:
            self.outbox.close()

    def __enter__(self) -> DapClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hpke_config(self, role: int) -> HpkeConfig:
        """The aggregator's HPKE config (`role`: veil.hpke.ROLE_LEADER or
        ROLE_HELPER) from its HpkeConfigList, the first one veil can seal to,
        kept for `config_lifetime` seconds."""
        cached = self._configs.get(role)
        if cached is not None and time.monotonic() - cached[1] < self.options.config_lifetime:
            return cached[0]
        if self.outbox is not None:
            # A client restarted while an aggregator is away still seals.
            saved = self.outbox.config(self.task.task_id, role)
            if saved is not None and 0 <= time.time() - saved[1] < self.options.config_lifetime:
                self._configs[role] = (saved[0], time.monotonic() - (time.time() - saved[1]))
                return saved[0]
        url = urljoin(self._endpoints[role], "hpke_config")
        _, headers, body = self._call(urllib.request.Request(url), role)
        config = _config_from(headers, body, role, self._endpoints[role])
        self._configs[role] = (config, time.monotonic())
        if self.outbox is not None:
            self.outbox.save_config(self.task.task_id, role, config, time.time())
        return config

    def report_time(self) -> int:
        """Now, rounded down to the task's time_precision (seconds)."""
        now = int(self.options.clock())
        return now - now % self.task.time_precision

    def upload(self, measurement: Any, report_time: int | None = None) -> UploadResult:
        """Shard, seal and upload one measurement."""
        return self.upload_batch([measurement], report_time)

    def upload_batch(
        self,
        measurements: Iterable[Any],
        report_time: int | None = None,
        *,
        randomized: bool = False,
    ) -> UploadResult:
        """Shard, seal and upload many measurements (one request per
        `batch_size`); `report_time` in seconds, a multiple of the task's
        time_precision (now by default). A task with a local layer
        randomizes each measurement first, as `Client` does, unless
        `randomized` says they went through it already. Raises ValueError on
        an invalid measurement before anything is sent."""
        when = self.report_time() if report_time is None else report_time
        tp = self.task.time_precision
        if when % tp:
            raise ValueError(f"report_time {when} is not a multiple of time_precision {tp}")
        measured: Sequence[Any] = list(measurements)
        if not randomized:
            measured = randomize_measurements(self.task, measured)
        pending = [
            _Pending(
                m,
                when // tp,
                secrets.token_bytes(REPORT_ID_SIZE),
                secrets.token_bytes(self.vdaf.RAND_SIZE),
            )
            for m in measured
        ]
        reports = self._seal(pending)
        if self.outbox is not None:
            self.outbox.add(self.task.task_id, reports)
            return self.flush()
        accepted = 0
        for start in range(0, len(pending), self.options.batch_size):
            chunk = slice(start, start + self.options.batch_size)
            accepted += self._upload(pending[chunk], reports[chunk])
        return UploadResult(accepted, 0)

    def prepare_invited(
        self,
        measurement: Any,
        report_time: int,
        *,
        randomized: bool = False,
        draw: Callable[[int], bytes] | None = None,
    ) -> InvitedReport:
        """The first half of an invited report (a survey with invitations,
        veil.dap.invitation): `measurement` sharded, its shares' HPKE keys
        drawn, and the redemption context its token must be signed for.
        `upload_invited` seals and sends it with that token.

        `draw` is a test hook, never for production: `draw(n)` gives the n
        bytes drawn in place of `secrets`, in this order: the report id, the
        VDAF's randomness, the leader's and the helper's ephemeral private
        keys (32 bytes each), so that a test holds the report's bytes
        against another implementation's (tests/js/test_js_dap.py)."""
        take = secrets.token_bytes if draw is None else draw
        tp = self.task.time_precision
        if report_time % tp:
            raise ValueError(f"report_time {report_time} is not a multiple of time_precision {tp}")
        if self.task.issuer_public_key is None:
            raise ValueError(f"task {self.task.id_text} takes no invitation token")
        (measured,) = (
            [measurement] if randomized else randomize_measurements(self.task, [measurement])
        )
        pending = _Pending(
            measured, report_time // tp, take(REPORT_ID_SIZE), take(self.vdaf.RAND_SIZE)
        )
        leader, helper = self.hpke_config(ROLE_LEADER), self.hpke_config(ROLE_HELPER)
        fixed = (None, None) if draw is None else (draw(32), draw(32))
        (leader_sk, leader_enc), (helper_sk, helper_enc) = map(new_ephemeral, fixed)
        # Sharded here for the public share the context commits to; the
        # report is sharded again, to the same bytes, when it is sealed.
        public_share, _ = self.vdaf.shard(
            vdaf_context(self.dap.dap_version, self.task.task_id),
            measured,
            pending.report_id,
            pending.rand,
        )
        leader_digest = sealed_key_digest(leader.config_id, leader_enc)
        context = dap_redemption_context(
            self.task.task_id,
            pending.report_id,
            report_time,
            self.vdaf.encode_public_share(public_share),
            leader_digest,
            sealed_key_digest(helper.config_id, helper_enc),
        )
        return InvitedReport(
            pending, (leader, helper), (leader_sk, helper_sk), leader_digest, context
        )

    def upload_invited(self, invited: InvitedReport, token: bytes) -> UploadResult:
        """Seal and upload a report from `prepare_invited` with its token in
        the invitation extension (public, or in the leader's input share
        where the helper is another implementation: `Task.invitation_private`).
        A report the leader refuses is an UploadError: it is not sealed again
        to other keys, which its token does not cover."""
        extension = (InvitationExtension(token, invited.leader_key_digest).extension(),)
        # Private to veil's leader where the helper is another implementation.
        private = self.task.invitation_private
        report = self._seal_one(
            invited.pending,
            *invited.configs,
            () if private else extension,
            invited.ephemerals,
            extension if private else (),
        )
        if self.outbox is not None:
            self.outbox.add(self.task.task_id, [report])
            return self.flush()
        refused = self._post([report])
        if refused:
            self._refused([report], refused)
        return UploadResult(1, 0)

    def upload_reports(self, reports: Sequence[Report], *, invited: bool = False) -> UploadResult:
        """Upload reports sealed elsewhere (the survey page's, which `veil
        survey serve` relays) in one UploadRequest. A report the leader holds
        already (report_replayed) counts as a duplicate; UploadError for any
        other refusal, naming the reports (a report sealed to a config the
        leader no longer holds cannot be sealed again here). `invited`:
        reports carrying invitation tokens, which the leader acknowledges
        again when sent again as they were, so that report_replayed is a
        token spent on other content: UploadError ALREADY_EXISTS."""
        refused = self._post(reports)
        replayed = [i for i, e in refused.items() if e is ReportError.REPORT_REPLAYED]
        if invited and replayed:
            raise UploadError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"report {reports[replayed[0]].metadata.report_id.hex()}: its invitation token"
                " was already spent on a report with other content",
                kind="report_refused",
            )
        named: dict[int, ReportError] = {
            i: e for i, e in refused.items() if e is not ReportError.REPORT_REPLAYED
        }
        if named:
            self._refused(reports, named)
        return UploadResult(len(reports) - len(refused), len(refused))

    def flush(self) -> UploadResult:
        """Send what the outbox holds for the task, oldest first, as
        `Client.flush` (the same delivery plan). Raises ValueError if the
        client has no outbox."""
        if self.outbox is None:
            raise ValueError("this client has no outbox (pass outbox=PATH)")
        with self._flush_lock:
            plan = delivery_plan(
                self.outbox, self.task, self.options.clock(), self.options.batch_size, _slices
            )
            step = advance(plan, None)
            while isinstance(step, list):
                try:
                    sent: Sent = self._send(step)
                except UploadError as e:
                    sent = e
                step = advance(plan, sent)
            return step

    def _send(self, reports: Sequence[Report]) -> UploadResult | PartlyRefused:
        """One UploadRequest of the outbox's reports: what the leader took,
        and why it refused the others. `report_replayed` is a report the
        leader holds already (sent before a crash, its answer lost)."""
        refused = self._post(reports)
        replayed = sum(1 for e in refused.values() if e is ReportError.REPORT_REPLAYED)
        named = {
            reports[i].metadata.report_id: e.name.lower()
            for i, e in refused.items()
            if e is not ReportError.REPORT_REPLAYED
        }
        taken = UploadResult(len(reports) - len(refused), replayed)
        return PartlyRefused(taken, named) if named else taken

    def _seal_one(
        self,
        p: _Pending,
        leader: HpkeConfig,
        helper: HpkeConfig,
        extensions: tuple[Extension, ...] = (),
        ephemerals: tuple[bytes, bytes] | None = None,
        leader_private: tuple[Extension, ...] = (),
    ) -> Report:
        return prepare_report(
            self.dap.dap_version,
            self.task.task_id,
            self.configuration,
            self.vdaf,
            p.measurement,
            p.time,
            leader,
            helper,
            report_id=p.report_id,
            rand=p.rand,
            public_extensions=extensions,
            ephemerals=ephemerals,
            leader_private_extensions=leader_private,
        )

    def _seal(self, pending: Sequence[_Pending]) -> list[Report]:
        leader, helper = self.hpke_config(ROLE_LEADER), self.hpke_config(ROLE_HELPER)
        out = []
        for i, p in enumerate(pending):
            try:
                out.append(self._seal_one(p, leader, helper))
            except (ValueError, TypeError) as e:
                raise ValueError(f"measurement {i} ({p.measurement!r}): {e}") from None
        return out

    def _upload(self, pending: Sequence[_Pending], reports: Sequence[Report]) -> int:
        """POST one UploadRequest; how many reports the leader took. A report
        refused for an unknown HPKE config is sealed again once to configs
        fetched anew; UploadError for any other refusal."""
        refused = self._post(reports)
        unknown = [i for i, e in refused.items() if e in UNKNOWN_CONFIG]
        if unknown:
            log.info("the leader holds no key for %d reports: fetching its configs", len(unknown))
            self._configs.clear()
            again = [pending[i] for i in unknown]
            retried = self._post(self._seal(again))
            refused = {i: e for i, e in refused.items() if i not in unknown}
            refused.update({unknown[j]: e for j, e in retried.items()})
        if refused:
            self._refused(reports, refused)
        return len(reports)

    def _refused(self, reports: Sequence[Report], refused: dict[int, ReportError]) -> None:
        named = ", ".join(
            f"{reports[i].metadata.report_id.hex()}: {e.name.lower()}"
            for i, e in sorted(refused.items())[:5]
        )
        raise UploadError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the DAP leader took {len(reports) - len(refused)} of {len(reports)} reports"
            f" and refused {len(refused)} ({named}{', ...' if len(refused) > 5 else ''})",
            kind="report_refused",
        )

    def _post(self, reports: Sequence[Report]) -> dict[int, ReportError]:
        """The reports of one UploadRequest the leader refused, by index."""
        url = urljoin(self._endpoints[ROLE_LEADER], f"tasks/{self.task.id_text}/reports")
        body = UploadRequest(tuple(reports)).encode()
        request = urllib.request.Request(
            url, body, {"Content-Type": media_type("upload-req")}, method="POST"
        )
        _, headers, answer = self._call(request, ROLE_LEADER)
        if not answer:
            return {}
        try:
            if message_of(headers.get("content-type")) != "upload-errors":
                raise MediaTypeError(f"{headers.get('content-type')!r} is not UploadErrors")
            errors = UploadErrors.decode(answer, self.dap.dap_version)
        except (MediaTypeError, DecodeError) as e:
            raise UploadError(
                grpc.StatusCode.INTERNAL,
                f"the DAP leader answered the upload without UploadErrors: {e} (the reports"
                " may or may not be stored: sending them again is safe)",
            ) from None
        index = {r.metadata.report_id: i for i, r in enumerate(reports)}
        unknown = [s.report_id.hex() for s in errors.statuses if s.report_id not in index]
        if unknown:
            raise UploadError(
                grpc.StatusCode.INTERNAL,
                f"the DAP leader's UploadErrors names reports it was not sent: {unknown[:3]}",
            )
        return {index[s.report_id]: s.error for s in errors.statuses}

    def _call(
        self, request: urllib.request.Request, role: int
    ) -> tuple[int, dict[str, str], bytes]:
        """The answer to `request`, sent again as the retry policy says while
        the aggregator is unreachable or busy (503, 429)."""
        attempt = 0
        while True:
            status, headers, body = self._urlopen(request, role)
            if 200 <= status < 300:
                return status, headers, body
            error = _refusal(status, headers, body, role, self._endpoints[role])
            if not self.policy.should_retry(error, attempt):
                raise error
            wait = self.policy.delay(attempt, error.retry_after)
            log.info("retrying in %.1f s after %s (attempt %d)", wait, error.message, attempt + 1)
            time.sleep(wait)
            attempt += 1

    def _urlopen(
        self, request: urllib.request.Request, role: int
    ) -> tuple[int, dict[str, str], bytes]:
        """Sends `request` to the aggregator of `role`: (status, headers with
        lower-case names, body); status 0, with the reason as body, when it
        cannot be reached."""
        try:
            with self._openers[role].open(request, timeout=self.options.timeout) as r:
                return r.status, _lower(r.headers.items()), r.read(MAX_ANSWER)
        except urllib.error.HTTPError as e:
            return e.code, _lower(e.headers.items()), e.read(MAX_ANSWER)
        except (urllib.error.URLError, OSError) as e:
            return 0, {}, str(getattr(e, "reason", e)).encode()


def _base(endpoint: str) -> str:
    return endpoint if endpoint.endswith("/") else endpoint + "/"


def _context(pem: bytes | None) -> ssl.SSLContext | None:
    return None if pem is None else ssl.create_default_context(cadata=pem.decode())


def _lower(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def client_for(
    task: Task, options: ClientOptions | None = None, *, protocol: str | None = None, **changes: Any
) -> Client | DapClient:
    """The client of `task`: over DAP (`DapClient`) for a task with a
    `[dap]` table, else veil's gRPC (`Client`); `protocol` ("grpc" or
    "dap") chooses."""
    chosen = protocol or ("dap" if task.dap is not None else "grpc")
    if chosen == "dap":
        return DapClient(task, options, **changes)
    if chosen == "grpc":
        return Client(task, options, **changes)
    raise ValueError(f"protocol must be 'grpc' or 'dap', not {protocol!r}")


def _config_from(headers: dict[str, str], body: bytes, role: int, endpoint: str) -> HpkeConfig:
    """The first config veil can seal to in an aggregator's HpkeConfigList
    answer; UploadError if it is none or sent none."""
    name = "leader" if role == ROLE_LEADER else "helper"
    try:
        if message_of(headers.get("content-type")) != "hpke-config-list":
            raise MediaTypeError(f"{headers.get('content-type')!r} is not an HpkeConfigList")
        config = HpkeConfigList.decode(body).first_supported()
    except (MediaTypeError, DecodeError) as e:
        raise UploadError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the DAP {name} at {endpoint} answered no HpkeConfigList: {e}",
        ) from None
    if config is None:
        raise UploadError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"the DAP {name} offers no HPKE config with X25519/HKDF-SHA256/AES-128-GCM",
        )
    return config


def _refusal(
    status: int, headers: dict[str, str], body: bytes, role: int, endpoint: str
) -> UploadError:
    """The UploadError for an aggregator's answer `status` (0: unreachable,
    `body` then says why), from its problem document where it sent one."""
    name = "leader" if role == ROLE_LEADER else "helper"
    where = f"the DAP {name} at {endpoint}"
    if status == 0:
        reason = body.decode(errors="replace")
        return UploadError(
            grpc.StatusCode.UNAVAILABLE, f"cannot reach {where}: {reason}", retryable=True
        )
    if status in (429, 503):
        advised = headers.get("retry-after", "")
        return UploadError(
            grpc.StatusCode.UNAVAILABLE,
            f"{where} answered {status}: busy",
            retryable=True,
            retry_after=float(advised) if advised.isdigit() else None,
        )
    location = headers.get("location")
    if 300 <= status < 400 and location is not None:
        # Followed, a redirect would fetch the aggregator's keys from, or
        # send the reports to, wherever its Location points.
        return UploadError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{where} answered {status}, a redirect to {location!r}: veil follows no redirect"
            " from a DAP aggregator (the task's endpoint must be where the aggregator answers)",
        )
    code = _CODES.get(
        status, grpc.StatusCode.INTERNAL if status >= 500 else grpc.StatusCode.UNKNOWN
    )
    try:
        problem = Problem.from_json(body, status)
    except ValueError:
        return UploadError(code, f"{where} answered {status}")
    return UploadError(code, f"{where} refused the request: {problem.type.value}: {problem.detail}")
