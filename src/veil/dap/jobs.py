"""DAP's messages of aggregation jobs and collections (sections 4.5 to
4.7 of draft-ietf-ppm-dap-18 and -19), in the TLS presentation language of
`veil.dap.codec`; the shared types, the reports and the task configuration
are `veil.dap.messages`, whose conventions these follow."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from veil.dap.codec import DecodeError, Reader, put_fixed, put_opaque, put_uint
from veil.dap.messages import (
    BATCH_ID_SIZE,
    CHECKSUM_SIZE,
    LEADER_SELECTED_BATCH_ID_EXTENSION,
    REPORT_ID_SIZE,
    TASK_ID_SIZE,
    BatchMode,
    Extension,
    Interval,
    ReportMetadata,
    TaskConfiguration,
    put_ciphertext,
    put_extensions,
    read_batch_mode,
    read_ciphertext,
    read_extensions,
)
from veil.dap.versions import DapVersion, ReportError, report_error_code, report_error_of
from veil.messages import Ciphertext

# -- aggregation jobs (section 4.5) --------------------------------------------


@dataclass(frozen=True)
class ReportShare:
    metadata: ReportMetadata
    public_share: bytes
    encrypted_input_share: Ciphertext

    def encode(self) -> bytes:
        return (
            self.metadata.encode()
            + put_opaque(self.public_share, 4, "public_share")
            + put_ciphertext(self.encrypted_input_share, "encrypted_input_share")
        )

    @classmethod
    def read(cls, r: Reader) -> ReportShare:
        return cls(
            ReportMetadata.read(r),
            r.opaque(4, "public_share"),
            read_ciphertext(r, "encrypted_input_share"),
        )


@dataclass(frozen=True)
class VerifyInit:
    """One report of an aggregation job's first request (PrepareInit before
    -17): the helper's report share and the leader's first ping-pong
    message."""

    report_share: ReportShare
    payload: bytes

    def encode(self) -> bytes:
        return self.report_share.encode() + put_opaque(self.payload, 4, "payload", 1)

    @classmethod
    def read(cls, r: Reader) -> VerifyInit:
        return cls(ReportShare.read(r), r.opaque(4, "payload", 1))


@dataclass(frozen=True)
class AggregationJobInitReq:
    verification_key_id: int
    agg_param: bytes
    extensions: tuple[Extension, ...]
    verify_inits: tuple[VerifyInit, ...]

    def encode(self) -> bytes:
        return (
            put_uint(self.verification_key_id, 1, "verification_key_id")
            + put_opaque(self.agg_param, 4, "agg_param")
            + put_extensions(self.extensions, "extensions")
            + b"".join(v.encode() for v in self.verify_inits)
        )

    @classmethod
    def decode(cls, data: bytes) -> AggregationJobInitReq:
        r = Reader(data, "AggregationJobInitReq")
        key_id = r.uint(1, "verification_key_id")
        agg_param = r.opaque(4, "agg_param")
        extensions = read_extensions(r, "extensions")
        r.what = "AggregationJobInitReq.VerifyInit"
        inits = []
        while r.remaining:
            inits.append(VerifyInit.read(r))
        return cls(key_id, agg_param, extensions, tuple(inits))

    def batch_id(self) -> bytes | None:
        """The leader_selected_batch_id extension's batch id, if present;
        DecodeError if its data is not 32 bytes."""
        for extension in self.extensions:
            if extension.extension_type == LEADER_SELECTED_BATCH_ID_EXTENSION:
                if len(extension.extension_data) != BATCH_ID_SIZE:
                    raise DecodeError(
                        "AggregationJobInitReq.extensions: leader_selected_batch_id has "
                        f"{len(extension.extension_data)} bytes, a BatchID {BATCH_ID_SIZE}"
                    )
                return extension.extension_data
        return None


def batch_id_extension(batch_id: bytes) -> Extension:
    """The leader_selected_batch_id aggregation job extension."""
    return Extension(
        LEADER_SELECTED_BATCH_ID_EXTENSION, put_fixed(batch_id, BATCH_ID_SIZE, "batch_id")
    )


class VerifyRespType(enum.IntEnum):
    CONTINUE = 0
    FINISH = 1
    REJECT = 2


@dataclass(frozen=True)
class VerifyResp:
    """The helper's answer for one report: `payload` (the next ping-pong
    message) for continue, nothing for finish, `error` for reject."""

    report_id: bytes
    type: VerifyRespType
    payload: bytes = b""
    error: ReportError | None = None

    def __post_init__(self) -> None:
        if (self.type is VerifyRespType.REJECT) != (self.error is not None):
            raise ValueError("a VerifyResp carries an error exactly when it rejects")
        if self.payload and self.type is not VerifyRespType.CONTINUE:
            raise ValueError("only a continue VerifyResp carries a payload")

    def encode(self, version: DapVersion) -> bytes:
        head = put_fixed(self.report_id, REPORT_ID_SIZE, "report_id") + put_uint(
            self.type, 1, "verify_resp_type"
        )
        if self.type is VerifyRespType.CONTINUE:
            return head + put_opaque(self.payload, 4, "payload", 1)
        if self.error is not None:
            return head + put_uint(report_error_code(version, self.error), 1, "report_error")
        return head

    @classmethod
    def read(cls, r: Reader, version: DapVersion) -> VerifyResp:
        report_id = r.take(REPORT_ID_SIZE, "report_id")
        code = r.uint(1, "verify_resp_type")
        if code == VerifyRespType.CONTINUE:
            return cls(report_id, VerifyRespType.CONTINUE, r.opaque(4, "payload", 1))
        if code == VerifyRespType.FINISH:
            return cls(report_id, VerifyRespType.FINISH)
        if code == VerifyRespType.REJECT:
            error = report_error_of(version, r.uint(1, "report_error"), f"{r.what}.report_error")
            return cls(report_id, VerifyRespType.REJECT, error=error)
        raise DecodeError(f"{r.what}.verify_resp_type: {code} is not a VerifyRespType")


def continue_resp(report_id: bytes, payload: bytes) -> bytes:
    """``VerifyResp(report_id, CONTINUE, payload).encode(version)``, the same
    bytes under either draft, written out: the helper answers one for every
    report it verifies."""
    if len(report_id) != REPORT_ID_SIZE or not payload:
        return VerifyResp(report_id, VerifyRespType.CONTINUE, payload).encode(DapVersion.DAP_19)
    return report_id + b"\x00" + put_opaque(payload, 4, "payload", 1)


@dataclass(frozen=True)
class AggregationJobResp:
    verify_resps: tuple[VerifyResp, ...]

    def encode(self, version: DapVersion) -> bytes:
        return b"".join(v.encode(version) for v in self.verify_resps)

    @classmethod
    def decode(cls, data: bytes, version: DapVersion) -> AggregationJobResp:
        r = Reader(data, "AggregationJobResp.VerifyResp")
        resps = []
        while r.remaining:
            resps.append(VerifyResp.read(r, version))
        return cls(tuple(resps))


@dataclass(frozen=True)
class VerifyContinue:
    report_id: bytes
    payload: bytes

    def encode(self) -> bytes:
        return put_fixed(self.report_id, REPORT_ID_SIZE, "report_id") + put_opaque(
            self.payload, 4, "payload", 1
        )


@dataclass(frozen=True)
class AggregationJobContinueReq:
    step: int
    verify_continues: tuple[VerifyContinue, ...]

    def encode(self) -> bytes:
        return put_uint(self.step, 2, "step") + b"".join(v.encode() for v in self.verify_continues)

    @classmethod
    def decode(cls, data: bytes) -> AggregationJobContinueReq:
        r = Reader(data, "AggregationJobContinueReq")
        step = r.uint(2, "step")
        r.what = "AggregationJobContinueReq.VerifyContinue"
        continues = []
        while r.remaining:
            continues.append(
                VerifyContinue(r.take(REPORT_ID_SIZE, "report_id"), r.opaque(4, "payload", 1))
            )
        return cls(step, tuple(continues))


# -- collection (section 4.6) ----------------------------------------------------


@dataclass(frozen=True)
class Query:
    """The collector's query: a batch interval (time-interval) or nothing,
    the leader choosing the batch (leader-selected)."""

    batch_mode: BatchMode
    batch_interval: Interval | None = None

    def __post_init__(self) -> None:
        if (self.batch_mode is BatchMode.TIME_INTERVAL) != (self.batch_interval is not None):
            raise ValueError("a time-interval query has a batch interval, a leader-selected none")

    def encode(self) -> bytes:
        config = self.batch_interval.encode() if self.batch_interval is not None else b""
        return put_uint(self.batch_mode, 1, "batch_mode") + put_opaque(config, 2, "config")

    @classmethod
    def read(cls, r: Reader) -> Query:
        mode = read_batch_mode(r, "batch_mode")
        config = Reader(r.opaque(2, "config"), f"{r.what}.config")
        if mode is BatchMode.TIME_INTERVAL:
            config.what = f"{r.what}.config.TimeIntervalQueryConfig"
            interval = Interval.read(config)
            config.end()
            return cls(mode, interval)
        config.end()  # leader-selected: empty
        return cls(mode)


@dataclass(frozen=True)
class CollectionJobReq:
    query: Query
    agg_param: bytes = b""
    extensions: tuple[Extension, ...] = ()

    def encode(self) -> bytes:
        return (
            self.query.encode()
            + put_opaque(self.agg_param, 4, "agg_param")
            + put_extensions(self.extensions, "extensions")
        )

    @classmethod
    def read(cls, r: Reader) -> CollectionJobReq:
        return cls(Query.read(r), r.opaque(4, "agg_param"), read_extensions(r, "extensions"))

    @classmethod
    def decode(cls, data: bytes) -> CollectionJobReq:
        r = Reader(data, "CollectionJobReq")
        out = cls.read(r)
        r.end()
        return out


@dataclass(frozen=True)
class CollectionJobResp:
    report_count: int
    interval: Interval
    leader_encrypted_agg_share: Ciphertext
    helper_encrypted_agg_share: Ciphertext

    def encode(self) -> bytes:
        return (
            put_uint(self.report_count, 8, "report_count")
            + self.interval.encode()
            + put_ciphertext(self.leader_encrypted_agg_share, "leader_encrypted_agg_share")
            + put_ciphertext(self.helper_encrypted_agg_share, "helper_encrypted_agg_share")
        )

    @classmethod
    def decode(cls, data: bytes) -> CollectionJobResp:
        r = Reader(data, "CollectionJobResp")
        out = cls(
            r.uint(8, "report_count"),
            Interval.read(r),
            read_ciphertext(r, "leader_encrypted_agg_share"),
            read_ciphertext(r, "helper_encrypted_agg_share"),
        )
        r.end()
        return out


@dataclass(frozen=True)
class BatchSelector:
    """Which batch the leader asks the helper for: an interval
    (time-interval) or a batch id (leader-selected)."""

    batch_mode: BatchMode
    batch_interval: Interval | None = None
    batch_id: bytes | None = None

    def __post_init__(self) -> None:
        if self.batch_mode is BatchMode.TIME_INTERVAL:
            ok = self.batch_interval is not None and self.batch_id is None
        else:
            ok = self.batch_interval is None and self.batch_id is not None
        if not ok:
            raise ValueError("a batch selector has an interval (time-interval) or a batch id")

    def encode(self) -> bytes:
        if self.batch_interval is not None:
            config = self.batch_interval.encode()
        else:
            config = put_fixed(self.batch_id or b"", BATCH_ID_SIZE, "batch_id")
        return put_uint(self.batch_mode, 1, "batch_mode") + put_opaque(config, 2, "config")

    @classmethod
    def read(cls, r: Reader) -> BatchSelector:
        mode = read_batch_mode(r, "batch_mode")
        config = Reader(r.opaque(2, "config"), f"{r.what}.config")
        if mode is BatchMode.TIME_INTERVAL:
            config.what += ".TimeIntervalBatchSelectorConfig"
            out = cls(mode, batch_interval=Interval.read(config))
        else:
            config.what += ".LeaderSelectedBatchSelectorConfig"
            out = cls(mode, batch_id=config.take(BATCH_ID_SIZE, "batch_id"))
        config.end()
        return out


@dataclass(frozen=True)
class AggregateShareReq:
    collection_job_req: CollectionJobReq
    batch_selector: BatchSelector
    report_count: int
    checksum: bytes

    def encode(self) -> bytes:
        return (
            self.collection_job_req.encode()
            + self.batch_selector.encode()
            + put_uint(self.report_count, 8, "report_count")
            + put_fixed(self.checksum, CHECKSUM_SIZE, "checksum")
        )

    @classmethod
    def decode(cls, data: bytes) -> AggregateShareReq:
        r = Reader(data, "AggregateShareReq")
        out = cls(
            CollectionJobReq.read(r),
            BatchSelector.read(r),
            r.uint(8, "report_count"),
            r.take(CHECKSUM_SIZE, "checksum"),
        )
        r.end()
        return out


@dataclass(frozen=True)
class AggregateShare:
    encrypted_aggregate_share: Ciphertext

    def encode(self) -> bytes:
        return put_ciphertext(self.encrypted_aggregate_share, "encrypted_aggregate_share")

    @classmethod
    def decode(cls, data: bytes) -> AggregateShare:
        r = Reader(data, "AggregateShare")
        out = cls(read_ciphertext(r, "encrypted_aggregate_share"))
        r.end()
        return out


@dataclass(frozen=True)
class AggregateShareAad:
    task_id: bytes
    task_configuration: TaskConfiguration
    collection_job_req: CollectionJobReq

    def encode(self, version: DapVersion) -> bytes:
        return (
            put_fixed(self.task_id, TASK_ID_SIZE, "task_id")
            + self.task_configuration.encode(version)
            + self.collection_job_req.encode()
        )

    @classmethod
    def decode(cls, data: bytes, version: DapVersion) -> AggregateShareAad:
        r = Reader(data, "AggregateShareAad")
        out = cls(
            r.take(TASK_ID_SIZE, "task_id"),
            TaskConfiguration.read(r, version),
            CollectionJobReq.read(r),
        )
        r.end()
        return out
