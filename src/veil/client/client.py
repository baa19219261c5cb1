"""The client: shard a measurement with Prio3, seal each input share to its
aggregator with HPKE and upload the report to the leader
(draft-ietf-ppm-dap section 4.4).

Each report gets a fresh random 16-byte report id (also the VDAF nonce). A
retried upload resends the same reports with the same ids, and the leader
stores a report id once, so a retry never counts twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc

from veil.client.base import CONFIG_LIFETIME, ClientBase, ClientOptions, UploadResult, advance
from veil.client.retry import UploadError
from veil.grpc_util import open_channel
from veil.hpke import ROLE_HELPER, ROLE_LEADER, HpkeConfig
from veil.messages import Report
from veil.messages.wire import upload_request
from veil.protocol.v1 import helper_pb2_grpc, leader_pb2_grpc
from veil.task import Task

log = logging.getLogger(__name__)

__all__ = ["CONFIG_LIFETIME", "Client", "ClientOptions", "UploadError", "UploadResult"]


class Client:
    """Uploads measurements for one task, blocking until the leader answers.

    `task` is the client's task file (`veil task new` writes it); `options`
    (`ClientOptions`: trust, mTLS, timeout, retries, batch size, clock,
    outbox) how it reaches the aggregators, each setting also accepted as a
    keyword (``Client(task, retries=0)``). Each aggregator is trusted
    separately (veil.trust). A retried call resends the same report ids.

    With an outbox, an upload while the leader is unreachable returns with
    the reports pending (`UploadResult.pending`), and `flush()` delivers them
    later, also from another process after a restart.

    A `Client` is thread-safe: threads may share one (the gRPC channels, the
    config cache and the outbox are safe to use concurrently, and each call
    draws its own report ids).

    Raises veil.trust.TrustError when the certificates cannot keep the two
    aggregators apart, veil.client.OutboxError when `outbox` is not an
    outbox file.

    Example::

        from veil.client import Client
        from veil.task import load_task

        with Client(load_task("client/task.toml")) as client:
            client.upload(1)
            client.upload_batch([0, 1, 1])
    """

    def __init__(self, task: Task, options: ClientOptions | None = None, **changes: Any) -> None:
        options = ClientOptions.given(options, changes)
        self._base = ClientBase(task, options)
        self.task = task
        self.vdaf = self._base.vdaf
        client_cert = (options.private_key, options.certificate_chain)
        self._leader_channel = open_channel(
            task.leader_address, options.leader_root_certificates, *client_cert
        )
        self._helper_channel = open_channel(
            task.helper_address, options.helper_root_certificates, *client_cert
        )
        self._leader = leader_pb2_grpc.LeaderStub(self._leader_channel)  # type: ignore[no-untyped-call]
        self._helper = helper_pb2_grpc.HelperStub(self._helper_channel)  # type: ignore[no-untyped-call]
        self._flush_lock = threading.Lock()

    def close(self) -> None:
        """Close the channels and the outbox (pending reports stay in its file)."""
        self._leader_channel.close()
        self._helper_channel.close()
        self._base._close_outbox()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, role: int = ROLE_LEADER) -> Any:
        policy = self._base.policy
        attempt = 0
        while True:
            try:
                return method(request, timeout=self._base.timeout)
            except grpc.RpcError as e:
                error = UploadError.from_rpc(e)
                if not policy.should_retry(error, attempt):
                    error = self._base.unreachable(error, role == ROLE_LEADER, attempt + 1)
                    raise error from None
                wait = policy.delay(attempt, error.retry_after)
                log.info(
                    "retrying in %.1f s after %s (attempt %d)", wait, error.code.name, attempt + 1
                )
                time.sleep(wait)
                attempt += 1

    def hpke_config(self, role: int) -> HpkeConfig:
        """The aggregator's HPKE config (`role`: veil.hpke.ROLE_LEADER or
        ROLE_HELPER), cached for `config_lifetime` seconds."""
        known = self._base._known_config(role)
        if known is not None:
            return known
        stub = self._leader if role == ROLE_LEADER else self._helper
        reply = self._call(stub.GetHpkeConfig, self._base._config_request(), role)
        return self._base._remember_config(role, reply)

    def report_time(self) -> int:
        """Now, rounded down to the task's time_precision."""
        return self._base.report_time()

    def build_report(self, measurement: Any, report_time: int | None = None) -> Report:
        """Shard and seal one measurement. Raises ValueError on an invalid measurement."""
        return self.build_reports([measurement], report_time)[0]

    def build_reports(
        self,
        measurements: Sequence[Any],
        report_time: int | None = None,
        *,
        randomized: bool = False,
    ) -> list[Report]:
        """Shard (on the batched path) and seal many measurements, each with a
        fresh report id. Raises ValueError, naming the report, on an invalid one.
        `randomized`: the measurements went through the task's local layer
        already (`prepare_reports`)."""
        return self._base._prepare(
            measurements,
            self.hpke_config(ROLE_LEADER),
            self.hpke_config(ROLE_HELPER),
            report_time,
            randomized,
        )

    def _send(self, reports: Sequence[Report]) -> UploadResult:
        reply = self._call(self._leader.UploadReports, upload_request(self.task.task_id, reports))
        return UploadResult(reply.accepted, reply.duplicates)

    def upload_reports(self, reports: Sequence[Report]) -> UploadResult:
        """Upload prepared reports in batches of `batch_size`; retried batches
        keep their report ids. Raises UploadError if the leader refuses or
        stays unreachable.

        With an outbox, the reports are stored there first and then
        everything the outbox holds for the task is sent (see `flush`);
        nothing is raised for a leader that stays unreachable: the reports
        stay pending."""
        if self._base.outbox is not None:
            self._base.outbox.add(self.task.task_id, reports)
            return self.flush()
        accepted = duplicates = 0
        for chunk in self._base._chunks(reports):
            result = self._send(chunk)
            accepted += result.accepted
            duplicates += result.duplicates
        return UploadResult(accepted, duplicates)

    def upload(self, measurement: Any, report_time: int | None = None) -> UploadResult:
        """Shard, seal and upload one measurement."""
        return self.upload_reports([self.build_report(measurement, report_time)])

    def upload_batch(
        self,
        measurements: Iterable[Any],
        report_time: int | None = None,
        *,
        randomized: bool = False,
    ) -> UploadResult:
        """Shard, seal and upload many measurements (one request per
        `batch_size`); `randomized` as for `build_reports`."""
        return self.upload_reports(
            self.build_reports(list(measurements), report_time, randomized=randomized)
        )

    def flush(self) -> UploadResult:
        """Send what the outbox holds for the task, oldest first; see
        `UploadResult` for what the counts mean. Reports past the task's
        report_expiry_age are dropped (counted in `expired`). Raises
        ValueError if the client has no outbox."""
        if self._base.outbox is None:
            raise ValueError("this client has no outbox (pass outbox=PATH)")
        with self._flush_lock:
            plan = self._base._delivery_plan()
            step = advance(plan, None)
            while isinstance(step, list):
                try:
                    sent: UploadResult | UploadError = self._send(step)
                except UploadError as e:
                    sent = e
                step = advance(plan, sent)
            return step
