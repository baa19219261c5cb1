"""What differs between the DAP drafts veil speaks, and what is bound to the
draft's version tag.

draft-ietf-ppm-dap-19 is the default and -18 is selectable per task. The
two share every message's structure; they differ in values bound to the
version (docs/DAP.md lists the readings taken):

- the version tag that starts every domain-separation string: "dap-19" or
  "dap-18" (the VDAF context ``tag || task_id``, the HPKE `info` of input
  and aggregate shares);
- the ReportError registry: -19 deleted task_expired, task_not_started and
  outdated_config and added unknown_verification_key_id, renumbering the
  codes after vdaf_verify_error (so a code is read through its draft's
  table, never cast);
- TaskConfiguration.task_info: at least one byte in -18, possibly empty in
  -19.
"""

from __future__ import annotations

import enum

from veil.dap.codec import DecodeError


class DapVersion(enum.Enum):
    """A draft of draft-ietf-ppm-dap, by its version tag."""

    DAP_18 = "dap-18"
    DAP_19 = "dap-19"

    @property
    def tag(self) -> bytes:
        return self.value.encode("ascii")


#: The draft a task speaks unless it says otherwise.
DEFAULT_VERSION = DapVersion.DAP_19


class Role(enum.IntEnum):
    """DAP's Role (section 4.1), as it enters the HPKE `info` strings."""

    COLLECTOR = 0
    CLIENT = 1
    LEADER = 2
    HELPER = 3


class ReportError(enum.Enum):
    """Why one report was refused (DAP ReportError), by name: its code on
    the wire depends on the draft (`report_error_code`)."""

    RESERVED = "reserved"
    BATCH_COLLECTED = "batch_collected"
    REPORT_REPLAYED = "report_replayed"
    REPORT_DROPPED = "report_dropped"
    HPKE_UNKNOWN_CONFIG_ID = "hpke_unknown_config_id"
    HPKE_DECRYPT_ERROR = "hpke_decrypt_error"
    VDAF_VERIFY_ERROR = "vdaf_verify_error"
    TASK_EXPIRED = "task_expired"  # -18 only
    INVALID_MESSAGE = "invalid_message"
    REPORT_TOO_EARLY = "report_too_early"
    TASK_NOT_STARTED = "task_not_started"  # -18 only
    OUTDATED_CONFIG = "outdated_config"  # -18 only
    UNKNOWN_VERIFICATION_KEY_ID = "unknown_verification_key_id"  # -19 only
    UNSUPPORTED_EXTENSION = "unsupported_extension"  # -19 only


_E = ReportError
_REPORT_ERRORS: dict[DapVersion, dict[ReportError, int]] = {
    # draft-ietf-ppm-dap-18 section 4.1 and its registry (section 9.2.6).
    DapVersion.DAP_18: {
        _E.RESERVED: 0,
        _E.BATCH_COLLECTED: 1,
        _E.REPORT_REPLAYED: 2,
        _E.REPORT_DROPPED: 3,
        _E.HPKE_UNKNOWN_CONFIG_ID: 4,
        _E.HPKE_DECRYPT_ERROR: 5,
        _E.VDAF_VERIFY_ERROR: 6,
        _E.TASK_EXPIRED: 7,
        _E.INVALID_MESSAGE: 8,
        _E.REPORT_TOO_EARLY: 9,
        _E.TASK_NOT_STARTED: 10,
        _E.OUTDATED_CONFIG: 11,
    },
    # -19: three codes deleted, unknown_verification_key_id and
    # unsupported_extension added (docs/DAP.md, "Readings").
    DapVersion.DAP_19: {
        _E.RESERVED: 0,
        _E.BATCH_COLLECTED: 1,
        _E.REPORT_REPLAYED: 2,
        _E.REPORT_DROPPED: 3,
        _E.HPKE_UNKNOWN_CONFIG_ID: 4,
        _E.HPKE_DECRYPT_ERROR: 5,
        _E.VDAF_VERIFY_ERROR: 6,
        _E.INVALID_MESSAGE: 7,
        _E.REPORT_TOO_EARLY: 8,
        _E.UNKNOWN_VERIFICATION_KEY_ID: 9,
        _E.UNSUPPORTED_EXTENSION: 10,
    },
}
_REPORT_ERRORS_BY_CODE = {
    version: {code: error for error, code in table.items()}
    for version, table in _REPORT_ERRORS.items()
}


def report_error_code(version: DapVersion, error: ReportError) -> int:
    """The code of `error` in `version`'s registry; ValueError where that
    draft has none (a -18 error under -19 or the reverse)."""
    try:
        return _REPORT_ERRORS[version][error]
    except KeyError:
        raise ValueError(f"{error.value} has no code in {version.value}") from None


def report_error_of(version: DapVersion, code: int, where: str) -> ReportError:
    """The ReportError that `code` means in `version`; DecodeError for a
    code the draft does not define, and for `reserved`, which no report is
    refused with."""
    error = _REPORT_ERRORS_BY_CODE[version].get(code)
    if error is None or error is ReportError.RESERVED:
        raise DecodeError(f"{where}: {code} is not a ReportError of {version.value}")
    return error


def vdaf_context(version: DapVersion, task_id: bytes) -> bytes:
    """The VDAF application context of a DAP task: ``tag || task_id``,
    passed to shard, verify and unshard (draft section 4.4.2, "Client
    Behavior")."""
    return version.tag + bytes(task_id)


def input_share_info(version: DapVersion, server_role: Role) -> bytes:
    """HPKE `info` of an input share sealed by a client to `server_role`:
    ``tag " input share" || 0x01 || server_role``."""
    if server_role not in (Role.LEADER, Role.HELPER):
        raise ValueError("an input share is sealed to the leader or the helper")
    return version.tag + b" input share" + bytes([Role.CLIENT, server_role])


def aggregate_share_info(version: DapVersion, server_role: Role) -> bytes:
    """HPKE `info` of an aggregate share sealed by `server_role` to the
    collector: ``tag " aggregate share" || server_role || 0x00`` (section
    4.6.7)."""
    if server_role not in (Role.LEADER, Role.HELPER):
        raise ValueError("an aggregate share is sealed by the leader or the helper")
    return version.tag + b" aggregate share" + bytes([server_role, Role.COLLECTOR])
