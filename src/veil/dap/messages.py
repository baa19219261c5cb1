"""DAP's messages and their encodings (draft-ietf-ppm-dap-18 and -19, in the
TLS presentation language of `veil.dap.codec`).

Each message is a frozen value with `encode()` and a `decode(data)` class
method that reads the whole of `data` and refuses anything else with a
`DecodeError` naming the message and field. The names are the draft's
(-17 renamed "prepare" to "verify": PrepareInit is VerifyInit, PrepareResp
VerifyResp, PrepareContinue VerifyContinue). A message whose encoding
depends on the draft (a ReportError's code, the bounds of task_info) takes
the `DapVersion`. The VDAF's messages travel as opaque bytes; the messages
know nothing of fields. An HPKE ciphertext is veil's `Ciphertext`.

Decoding checks structure: lengths, bounds, enum values, trailing bytes,
a batch mode's config. What a role checks of a well-formed message (the
order of extensions, distinct report ids, a query's interval against the
task) is the role's, with `extensions_in_order` for the first.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha256
from itertools import pairwise

from veil.dap.codec import DecodeError, Reader, put_fixed, put_opaque, put_uint
from veil.dap.versions import DapVersion, ReportError, report_error_code, report_error_of
from veil.messages import PUBLIC_KEY_SIZE, SUITE_IDS, Ciphertext
from veil.messages import HpkeConfig as VeilHpkeConfig

TASK_ID_SIZE = 32
REPORT_ID_SIZE = 16
BATCH_ID_SIZE = 32
CHECKSUM_SIZE = 32


class BatchMode(enum.IntEnum):
    """DAP's BatchMode (section 5); 0 is reserved and refused."""

    TIME_INTERVAL = 1
    LEADER_SELECTED = 2


def read_batch_mode(r: Reader, field: str) -> BatchMode:
    code = r.uint(1, field)
    try:
        return BatchMode(code)
    except ValueError:
        raise DecodeError(f"{r.what}.{field}: {code} is not a BatchMode") from None


# -- extensions (report, task, aggregation job and collection job alike) ------

#: Task extension codepoint of the task interval (section 4.2.3).
TASK_INTERVAL_EXTENSION = 1
#: Aggregation job extension codepoint of the leader-selected batch id (5.2.2).
LEADER_SELECTED_BATCH_ID_EXTENSION = 1


@dataclass(frozen=True)
class Extension:
    """``struct { uint16 extension_type; opaque extension_data<0..2^16-1>; }``:
    the shape of DAP's report, task, aggregation job and collection job
    extensions."""

    extension_type: int
    extension_data: bytes = b""

    def encode(self) -> bytes:
        return put_uint(self.extension_type, 2, "extension_type") + put_opaque(
            self.extension_data, 2, "extension_data"
        )


def put_extensions(extensions: Sequence[Extension], field: str) -> bytes:
    if not extensions:
        return b"\x00\x00"
    return put_opaque(b"".join(e.encode() for e in extensions), 2, field)


def read_extensions(r: Reader, field: str) -> tuple[Extension, ...]:
    if r.empty_vector(2):
        return ()
    inner = r.vector(2, field, f"{r.what}.{field}")
    found = []
    while inner.remaining:
        found.append(Extension(inner.uint(2, "extension_type"), inner.opaque(2, "extension_data")))
    return tuple(found)


def extensions_in_order(extensions: Sequence[Extension]) -> bool:
    """Whether each extension_type is greater than the one before it, as
    the draft asks of every extension list (and so no type twice)."""
    types = [e.extension_type for e in extensions]
    return all(a < b for a, b in pairwise(types))


# -- basic types ---------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """``struct { Time start; Duration duration; }``, both counted in the
    task's time precision (section 4.1.1)."""

    start: int
    duration: int

    def encode(self) -> bytes:
        return put_uint(self.start, 8, "start") + put_uint(self.duration, 8, "duration")

    @classmethod
    def read(cls, r: Reader) -> Interval:
        return cls(r.uint(8, "start"), r.uint(8, "duration"))

    @classmethod
    def decode(cls, data: bytes) -> Interval:
        r = Reader(data, "Interval")
        out = cls.read(r)
        r.end()
        return out


def put_ciphertext(ct: Ciphertext, field: str) -> bytes:
    """HpkeCiphertext: ``config_id, opaque enc<1..2^16-1>, opaque
    payload<1..2^32-1>``."""
    return (
        put_uint(ct.config_id, 1, f"{field}.config_id")
        + put_opaque(ct.enc, 2, f"{field}.enc", 1)
        + put_opaque(ct.payload, 4, f"{field}.payload", 1)
    )


def read_ciphertext(r: Reader, field: str) -> Ciphertext:
    config_id, enc, payload = _ciphertext_fields(field)
    return Ciphertext(r.uint(1, config_id), r.opaque(2, enc, 1), r.opaque(4, payload, 1))


@functools.cache
def _ciphertext_fields(field: str) -> tuple[str, str, str]:
    """The names of an HpkeCiphertext's fields in errors, made once per
    field (a job reads one ciphertext for each of its reports)."""
    return f"{field}.config_id", f"{field}.enc", f"{field}.payload"


def batch_checksum(report_ids: Sequence[bytes]) -> bytes:
    """A batch bucket's checksum (section 4.5.4.3): the XOR of the SHA-256 of
    each report id it holds, 32 zero bytes for none."""
    acc = 0
    for report_id in report_ids:
        acc ^= int.from_bytes(sha256(report_id).digest(), "big")
    return acc.to_bytes(CHECKSUM_SIZE, "big")


# -- HPKE configurations (section 4.4.1) ---------------------------------------


@dataclass(frozen=True)
class HpkeConfig:
    """An aggregator's HPKE configuration as DAP lists it: any suite, any
    key length (a list may offer suites veil does not speak, which a client
    skips). `veil_config` is the one veil can seal to."""

    id: int
    kem_id: int
    kdf_id: int
    aead_id: int
    public_key: bytes

    def encode(self) -> bytes:
        return (
            put_uint(self.id, 1, "id")
            + put_uint(self.kem_id, 2, "kem_id")
            + put_uint(self.kdf_id, 2, "kdf_id")
            + put_uint(self.aead_id, 2, "aead_id")
            + put_opaque(self.public_key, 2, "public_key", 1)
        )

    @classmethod
    def read(cls, r: Reader) -> HpkeConfig:
        return cls(
            r.uint(1, "id"),
            r.uint(2, "kem_id"),
            r.uint(2, "kdf_id"),
            r.uint(2, "aead_id"),
            r.opaque(2, "public_key", 1),
        )

    @classmethod
    def of(cls, config: VeilHpkeConfig) -> HpkeConfig:
        return cls(
            config.config_id, config.kem_id, config.kdf_id, config.aead_id, config.public_key
        )

    def veil_config(self) -> VeilHpkeConfig | None:
        """This config as veil's, if it is veil's one suite with a key of
        its size; None otherwise."""
        suite = (self.kem_id, self.kdf_id, self.aead_id)
        if suite != SUITE_IDS or len(self.public_key) != PUBLIC_KEY_SIZE:
            return None
        return VeilHpkeConfig(self.id, self.public_key, *suite)


@dataclass(frozen=True)
class HpkeConfigList:
    """``HpkeConfig HpkeConfigList<10..2^16-1>``, most preferred first,
    each id once."""

    configs: tuple[HpkeConfig, ...]

    def encode(self) -> bytes:
        ids = [c.id for c in self.configs]
        if len(set(ids)) != len(ids):
            raise ValueError("HpkeConfigList: an id appears twice")
        return put_opaque(b"".join(c.encode() for c in self.configs), 2, "configs", 10)

    @classmethod
    def decode(cls, data: bytes) -> HpkeConfigList:
        outer = Reader(data, "HpkeConfigList")
        r = outer.vector(2, "configs", "HpkeConfig", 10)
        outer.end()
        configs: list[HpkeConfig] = []
        while r.remaining:
            config = HpkeConfig.read(r)
            if any(c.id == config.id for c in configs):
                raise DecodeError(f"HpkeConfigList: config id {config.id} appears twice")
            configs.append(config)
        return cls(tuple(configs))

    def first_supported(self) -> VeilHpkeConfig | None:
        """The most preferred config veil can seal to."""
        for config in self.configs:
            found = config.veil_config()
            if found is not None:
                return found
        return None


# -- uploads (section 4.4.2) ----------------------------------------------------


@dataclass(frozen=True)
class ReportMetadata:
    report_id: bytes
    time: int
    public_extensions: tuple[Extension, ...] = ()

    def encode(self) -> bytes:
        return (
            put_fixed(self.report_id, REPORT_ID_SIZE, "report_id")
            + put_uint(self.time, 8, "time")
            + put_extensions(self.public_extensions, "public_extensions")
        )

    @classmethod
    def read(cls, r: Reader) -> ReportMetadata:
        return cls(
            r.take(REPORT_ID_SIZE, "report_id"),
            r.uint(8, "time"),
            read_extensions(r, "public_extensions"),
        )


@dataclass(frozen=True)
class Report:
    metadata: ReportMetadata
    public_share: bytes
    leader_encrypted_input_share: Ciphertext
    helper_encrypted_input_share: Ciphertext

    def encode(self) -> bytes:
        return (
            self.metadata.encode()
            + put_opaque(self.public_share, 4, "public_share")
            + put_ciphertext(self.leader_encrypted_input_share, "leader_encrypted_input_share")
            + put_ciphertext(self.helper_encrypted_input_share, "helper_encrypted_input_share")
        )

    @classmethod
    def read(cls, r: Reader) -> Report:
        return cls(
            ReportMetadata.read(r),
            r.opaque(4, "public_share"),
            read_ciphertext(r, "leader_encrypted_input_share"),
            read_ciphertext(r, "helper_encrypted_input_share"),
        )

    @classmethod
    def decode(cls, data: bytes) -> Report:
        r = Reader(data, "Report")
        out = cls.read(r)
        r.end()
        return out


@dataclass(frozen=True)
class UploadRequest:
    """``Report reports[message_length]``: reports back to back, as many as
    the body holds."""

    reports: tuple[Report, ...]

    def encode(self) -> bytes:
        return b"".join(report.encode() for report in self.reports)

    @classmethod
    def decode(cls, data: bytes) -> UploadRequest:
        r = Reader(data, "UploadRequest.Report")
        reports = []
        while r.remaining:
            reports.append(Report.read(r))
        return cls(tuple(reports))


@dataclass(frozen=True)
class ReportUploadStatus:
    report_id: bytes
    error: ReportError


@dataclass(frozen=True)
class UploadErrors:
    """The leader's answer naming the reports it refused, in the request's
    order."""

    statuses: tuple[ReportUploadStatus, ...]

    def encode(self, version: DapVersion) -> bytes:
        return b"".join(
            put_fixed(s.report_id, REPORT_ID_SIZE, "id")
            + put_uint(report_error_code(version, s.error), 1, "error")
            for s in self.statuses
        )

    @classmethod
    def decode(cls, data: bytes, version: DapVersion) -> UploadErrors:
        r = Reader(data, "UploadErrors.ReportUploadStatus")
        statuses = []
        while r.remaining:
            report_id = r.take(REPORT_ID_SIZE, "id")
            statuses.append(
                ReportUploadStatus(report_id, report_error_of(version, r.uint(1, "error"), r.what))
            )
        return cls(tuple(statuses))


@dataclass(frozen=True)
class PlaintextInputShare:
    """What a client seals to one aggregator: its private extensions and
    its VDAF input share."""

    private_extensions: tuple[Extension, ...]
    payload: bytes

    def encode(self) -> bytes:
        return put_extensions(self.private_extensions, "private_extensions") + put_opaque(
            self.payload, 4, "payload", 1
        )

    @classmethod
    def decode(cls, data: bytes) -> PlaintextInputShare:
        if data[:2] == b"\x00\x00" and len(data) > 6 and int.from_bytes(data[2:6]) == len(data) - 6:
            # No private extension (every veil report's): read without a Reader.
            return cls((), data[6:])
        r = Reader(data, "PlaintextInputShare")
        out = cls(read_extensions(r, "private_extensions"), r.opaque(4, "payload", 1))
        r.end()
        return out


# -- task configuration (section 4.2) ------------------------------------------


@dataclass(frozen=True)
class TaskConfiguration:
    """The task as DAP binds it into every input and aggregate share's
    associated data. Endpoints are the URLs' ASCII bytes exactly as agreed
    (never re-encoded). `vdaf_configuration` is a `VdafConfig`'s encoding."""

    task_info: bytes
    leader_aggregator_endpoint: bytes
    helper_aggregator_endpoint: bytes
    time_precision: int
    min_batch_size: int
    batch_mode: BatchMode
    vdaf_type: int
    vdaf_configuration: bytes
    batch_config: bytes = b""
    extensions: tuple[Extension, ...] = ()

    def encode(self, version: DapVersion) -> bytes:
        return (
            put_opaque(self.task_info, 1, "task_info", _task_info_minimum(version))
            + put_opaque(self.leader_aggregator_endpoint, 2, "leader_aggregator_endpoint", 1)
            + put_opaque(self.helper_aggregator_endpoint, 2, "helper_aggregator_endpoint", 1)
            + put_uint(self.time_precision, 8, "time_precision")
            + put_uint(self.min_batch_size, 8, "min_batch_size")
            + put_uint(self.batch_mode, 1, "batch_mode")
            + put_opaque(self.batch_config, 2, "batch_config")
            + put_uint(self.vdaf_type, 4, "vdaf_type")
            + put_opaque(self.vdaf_configuration, 2, "vdaf_configuration")
            + put_extensions(self.extensions, "extensions")
        )

    @classmethod
    def read(cls, r: Reader, version: DapVersion) -> TaskConfiguration:
        return cls(
            task_info=r.opaque(1, "task_info", _task_info_minimum(version)),
            leader_aggregator_endpoint=r.opaque(2, "leader_aggregator_endpoint", 1),
            helper_aggregator_endpoint=r.opaque(2, "helper_aggregator_endpoint", 1),
            time_precision=r.uint(8, "time_precision"),
            min_batch_size=r.uint(8, "min_batch_size"),
            batch_mode=read_batch_mode(r, "batch_mode"),
            batch_config=r.opaque(2, "batch_config"),
            vdaf_type=r.uint(4, "vdaf_type"),
            vdaf_configuration=r.opaque(2, "vdaf_configuration"),
            extensions=read_extensions(r, "extensions"),
        )

    @classmethod
    def decode(cls, data: bytes, version: DapVersion) -> TaskConfiguration:
        r = Reader(data, "TaskConfiguration")
        out = cls.read(r, version)
        r.end()
        return out

    def task_interval(self) -> Interval | None:
        """The task_interval extension's interval, if the task has one."""
        for extension in self.extensions:
            if extension.extension_type == TASK_INTERVAL_EXTENSION:
                return Interval.decode(extension.extension_data)
        return None


def _task_info_minimum(version: DapVersion) -> int:
    return 1 if version is DapVersion.DAP_18 else 0


def task_interval_extension(interval: Interval) -> Extension:
    """The task_interval task extension (codepoint 1)."""
    return Extension(TASK_INTERVAL_EXTENSION, interval.encode())


# The VDAF configuration encodings of the draft's appendix B, by the VDAF's
# codepoint (draft-irtf-cfrg-vdaf section 10): each parameter and its size.
_VDAF_CONFIGS: dict[int, tuple[str, tuple[tuple[str, int], ...]]] = {
    0x00000001: ("Prio3Count", ()),
    0x00000002: ("Prio3Sum", (("max_measurement", 8),)),
    0x00000003: (
        "Prio3SumVec",
        (("length", 4), ("max_measurement", 8), ("chunk_length", 4)),
    ),
    0x00000004: ("Prio3Histogram", (("length", 4), ("chunk_length", 4))),
    0x00000005: (
        "Prio3MultihotCountVec",
        (("length", 4), ("chunk_length", 4), ("max_weight", 8)),
    ),
    0x00000006: ("Poplar1", (("bits", 2),)),
}
_VDAF_TYPES = {name: code for code, (name, _) in _VDAF_CONFIGS.items()}


@dataclass(frozen=True)
class VdafConfig:
    """A VDAF as a task configuration names it: the draft's name (e.g.
    "Prio3Histogram") and its parameters."""

    name: str
    params: tuple[tuple[str, int], ...] = ()

    @property
    def vdaf_type(self) -> int:
        try:
            return _VDAF_TYPES[self.name]
        except KeyError:
            raise ValueError(f"DAP defines no configuration of {self.name!r}") from None

    def encode(self) -> bytes:
        _, layout = _VDAF_CONFIGS[self.vdaf_type]
        given = dict(self.params)
        if sorted(given) != sorted(name for name, _ in layout):
            raise ValueError(
                f"{self.name} takes {', '.join(n for n, _ in layout) or 'no parameters'}"
            )
        return b"".join(put_uint(given[name], size, name) for name, size in layout)

    @classmethod
    def decode(cls, vdaf_type: int, data: bytes) -> VdafConfig:
        if vdaf_type not in _VDAF_CONFIGS:
            raise DecodeError(f"TaskConfiguration.vdaf_type: {vdaf_type:#010x} is not supported")
        name, layout = _VDAF_CONFIGS[vdaf_type]
        r = Reader(data, f"{name}Config")
        params = tuple((field, r.uint(size, field)) for field, size in layout)
        r.end()
        return cls(name, params)


@dataclass(frozen=True)
class InputShareAad:
    task_id: bytes
    task_configuration: TaskConfiguration
    metadata: ReportMetadata
    public_share: bytes

    def encode(self, version: DapVersion) -> bytes:
        return (
            put_fixed(self.task_id, TASK_ID_SIZE, "task_id")
            + self.task_configuration.encode(version)
            + self.metadata.encode()
            + put_opaque(self.public_share, 4, "public_share")
        )

    @classmethod
    def decode(cls, data: bytes, version: DapVersion) -> InputShareAad:
        r = Reader(data, "InputShareAad")
        out = cls(
            r.take(TASK_ID_SIZE, "task_id"),
            TaskConfiguration.read(r, version),
            ReportMetadata.read(r),
            r.opaque(4, "public_share"),
        )
        r.end()
        return out
