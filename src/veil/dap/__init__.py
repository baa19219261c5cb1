"""DAP, the IETF Distributed Aggregation Protocol (draft-ietf-ppm-dap-19,
with -18 selectable), as bytes: its messages and their TLS-syntax
encodings (`messages`, over `codec`), what is bound to the draft's version
tag (`versions`: domain-separation strings, the ReportError registries),
its media type and problem documents (`problems`), and the sealing of
input and aggregate shares with the draft's HPKE context (`shares`).

No transport and no storage: DAP over HTTP is a second transport onto
veil's engine, and this package is what both its ends read and write
(docs/DAP.md says what is implemented and which readings of the drafts it
takes).
"""

from veil.dap.codec import DecodeError
from veil.dap.versions import DEFAULT_VERSION, DapVersion, ReportError, Role

__all__ = ["DEFAULT_VERSION", "DapVersion", "DecodeError", "ReportError", "Role"]
