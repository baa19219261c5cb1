"""veil.client: shard, seal and upload measurements (draft-ietf-ppm-dap section 4.4).

`Client` blocks; `AsyncClient` is the same for asyncio; both take their
settings (trust, retries, outbox) as one `ClientOptions`. Both can keep every
report in a durable `Outbox` until the leader acknowledged it.
`prepare_report` builds a report from known HPKE configs without the network.
`SurveyClient` answers a deployed survey (veil.survey) by label.
`DapClient` uploads to a DAP task's leader over DAP's HTTP (a task with a
`[dap]` table); `client_for` picks it or `Client` by task.
"""

from veil.client.aio import AsyncClient
from veil.client.base import CONFIG_LIFETIME, ClientOptions, UploadResult
from veil.client.client import Client
from veil.client.dap import DapClient, client_for
from veil.client.outbox import Outbox, OutboxError, OutboxFull, TaskStatus
from veil.client.prepare import prepare_report, prepare_reports, seal_report
from veil.client.retry import RetryPolicy, UploadError
from veil.client.survey import SurveyClient
from veil.messages import Report

__all__ = [
    "CONFIG_LIFETIME",
    "AsyncClient",
    "Client",
    "ClientOptions",
    "DapClient",
    "Outbox",
    "OutboxError",
    "OutboxFull",
    "Report",
    "RetryPolicy",
    "SurveyClient",
    "TaskStatus",
    "UploadError",
    "UploadResult",
    "client_for",
    "prepare_report",
    "prepare_reports",
    "seal_report",
]
