"""The client: shard a measurement with Prio3, seal each input share to its
aggregator with HPKE and upload the report to the leader.

Each report gets a fresh random 16-byte report id (also the VDAF nonce). A
retried upload resends the same reports with the same ids, and the leader
stores a report id once, so a retry never counts twice.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from veil.client.prepare import prepare_reports
from veil.grpc_util import RpcRefused, is_retryable, open_channel
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.messages import MessageError, Report
from veil.messages.wire import hpke_configs_from_pb, upload_request
from veil.protocol.v1 import helper_pb2_grpc, leader_pb2_grpc, messages_pb2
from veil.task import Task
from veil.trust import check_roots
from veil.vdaf.batch import BatchPrio3

log = logging.getLogger(__name__)


# How long a fetched HPKE config is used before it is fetched again. An
# aggregator that rotates its key keeps opening reports sealed to the old
# one for its grace period ([keys] grace_seconds), which must be longer.
CONFIG_LIFETIME = 3600.0


class UploadError(RpcRefused):
    """The leader refused an upload (or stayed unreachable); `code` is the gRPC status."""


@dataclass(frozen=True)
class UploadResult:
    accepted: int
    duplicates: int


# The leader refuses an upload of more than 10,000 reports or more than its
# max_message_bytes (16 MiB by default); the client's requests stay well
# under both, whatever the size of a task's reports.
MAX_UPLOAD_REPORTS = 10_000
MAX_UPLOAD_BYTES = 4 << 20


def _report_bytes(r: Report) -> int:
    # Bytes on the wire, with a generous allowance for protobuf framing.
    cts = len(r.leader_ct.enc) + len(r.leader_ct.payload) + len(r.helper_ct.enc)
    return len(r.report_id) + len(r.public_share) + cts + len(r.helper_ct.payload) + 64


def upload_batches(reports: Sequence[Report], batch_size: int) -> Iterator[Sequence[Report]]:
    """Consecutive slices of `reports`, each of at most `batch_size` (and
    MAX_UPLOAD_REPORTS) reports and MAX_UPLOAD_BYTES bytes (or one report)."""
    limit = min(batch_size, MAX_UPLOAD_REPORTS)
    start = size = 0
    for i, r in enumerate(reports):
        n = _report_bytes(r)
        if i > start and (i - start >= limit or size + n > MAX_UPLOAD_BYTES):
            yield reports[start:i]
            start, size = i, 0
        size += n
    if start < len(reports):
        yield reports[start:]


class Client:
    """Uploads measurements for one task.

    `task` is the client's task file (`veil task new` writes it). TLS is used
    unless an aggregator is on loopback with no certificates given. Each
    aggregator is trusted separately (veil.trust): `leader_root_certificates`
    and `helper_root_certificates` (PEM) are the private CAs of the leader
    and of the helper (None: the system roots); one certificate in both is
    refused, since either aggregator could then pose as the other and open
    both input shares. A CA the task pins must be the one given. Pass
    `private_key`/`certificate_chain` (PEM) where an aggregator requires
    client certificates (mTLS).

    Raises veil.trust.TrustError when the certificates cannot keep the two
    aggregators apart.
    """

    def __init__(
        self,
        task: Task,
        *,
        leader_root_certificates: bytes | None = None,
        helper_root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.5,
        batch_size: int = 1000,
        clock: Callable[[], float] = time.time,
        config_lifetime: float = CONFIG_LIFETIME,
    ) -> None:
        self.task = task
        self.vdaf = task.vdaf.instantiate()
        self._batch = BatchPrio3(self.vdaf)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.batch_size = batch_size
        self.clock = clock
        check_roots(
            leader_root_certificates,
            helper_root_certificates,
            task.leader_ca_sha256,
            task.helper_ca_sha256,
        )
        client_cert = (private_key, certificate_chain)
        self._leader_channel = open_channel(
            task.leader_address, leader_root_certificates, *client_cert
        )
        self._helper_channel = open_channel(
            task.helper_address, helper_root_certificates, *client_cert
        )
        self._leader = leader_pb2_grpc.LeaderStub(self._leader_channel)  # type: ignore[no-untyped-call]
        self._helper = helper_pb2_grpc.HelperStub(self._helper_channel)  # type: ignore[no-untyped-call]
        self.config_lifetime = config_lifetime
        self._configs: dict[int, tuple[HpkeConfig, float]] = {}

    def close(self) -> None:
        self._leader_channel.close()
        self._helper_channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                return method(request, timeout=self.timeout)
            except grpc.RpcError as e:
                # Whatever the server says may succeed later (its database
                # restarting, say) is sent again, unchanged: the same report ids.
                if is_retryable(e) and attempt < self.retries:
                    log.info("retrying after %s (attempt %d)", e.code().name, attempt + 1)
                    time.sleep(delay * (0.5 + secrets.randbelow(1000) / 1000))
                    delay = min(delay * 2, 30.0)
                    continue
                error = UploadError.from_rpc(e)
                raise error from None
        raise AssertionError("unreachable")

    def hpke_config(self, role: int) -> HpkeConfig:
        """The aggregator's HPKE config (cached for `config_lifetime` seconds)."""
        cached = self._configs.get(role)
        if cached is not None and time.monotonic() - cached[1] < self.config_lifetime:
            return cached[0]
        stub = self._leader if role == ROLE_LEADER else self._helper
        reply = self._call(
            stub.GetHpkeConfig, messages_pb2.HpkeConfigRequest(task_id=self.task.task_id)
        )
        try:
            usable = hpke_configs_from_pb(reply)
        except MessageError as e:
            raise UploadError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None
        if not usable:
            raise UploadError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the aggregator offers no HPKE config with X25519/HKDF-SHA256/AES-128-GCM",
            )
        self._configs[role] = (usable[0], time.monotonic())
        return usable[0]

    def report_time(self) -> int:
        now = int(self.clock())
        return now - now % self.task.time_precision

    def build_report(self, measurement: Any, report_time: int | None = None) -> Report:
        """Shard and seal one measurement. Raises ValueError on an invalid measurement."""
        return self.build_reports([measurement], report_time)[0]

    def build_reports(
        self, measurements: Sequence[Any], report_time: int | None = None
    ) -> list[Report]:
        """Shard (on the batched path) and seal many measurements, each with a
        fresh report id. Raises ValueError, naming the report, on an invalid one."""
        return prepare_reports(
            self.task,
            measurements,
            self.hpke_config(ROLE_LEADER),
            self.hpke_config(ROLE_HELPER),
            self.report_time() if report_time is None else report_time,
            batch=self._batch,
        )

    def upload_reports(self, reports: Sequence[Report]) -> UploadResult:
        """Upload prepared reports in batches; retried batches keep their report ids."""
        accepted = duplicates = 0
        for batch in upload_batches(reports, self.batch_size):
            request = upload_request(self.task.task_id, batch)
            reply = self._call(self._leader.UploadReports, request)
            accepted += reply.accepted
            duplicates += reply.duplicates
        return UploadResult(accepted, duplicates)

    def upload(self, measurement: Any, report_time: int | None = None) -> UploadResult:
        return self.upload_reports([self.build_report(measurement, report_time)])

    def upload_batch(
        self, measurements: Iterable[Any], report_time: int | None = None
    ) -> UploadResult:
        return self.upload_reports(self.build_reports(list(measurements), report_time))
