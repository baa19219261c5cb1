"""veil.client: shard, seal and upload measurements (draft-ietf-ppm-dap section 4.4)."""

from veil.client.client import Client, Report, UploadError, UploadResult

__all__ = ["Client", "Report", "UploadError", "UploadResult"]
