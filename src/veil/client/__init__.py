"""veil.client: shard, seal and upload measurements (draft-ietf-ppm-dap section 4.4)."""

from veil.client.client import Client, UploadError, UploadResult
from veil.client.prepare import prepare_report, prepare_reports, seal_report
from veil.messages import Report

__all__ = [
    "Client",
    "Report",
    "UploadError",
    "UploadResult",
    "prepare_report",
    "prepare_reports",
    "seal_report",
]
