from veil.protocol.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReportError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_ERROR_UNSPECIFIED: _ClassVar[ReportError]
    BATCH_COLLECTED: _ClassVar[ReportError]
    REPORT_REPLAYED: _ClassVar[ReportError]
    REPORT_DROPPED: _ClassVar[ReportError]
    HPKE_UNKNOWN_CONFIG_ID: _ClassVar[ReportError]
    HPKE_DECRYPT_ERROR: _ClassVar[ReportError]
    VDAF_DECODE_ERROR: _ClassVar[ReportError]
    VDAF_VERIFY_ERROR: _ClassVar[ReportError]
    REPORT_TOO_EARLY: _ClassVar[ReportError]
    TASK_EXPIRED: _ClassVar[ReportError]
    INVALID_MESSAGE: _ClassVar[ReportError]
    INVALID_TOKEN: _ClassVar[ReportError]
REPORT_ERROR_UNSPECIFIED: ReportError
BATCH_COLLECTED: ReportError
REPORT_REPLAYED: ReportError
REPORT_DROPPED: ReportError
HPKE_UNKNOWN_CONFIG_ID: ReportError
HPKE_DECRYPT_ERROR: ReportError
VDAF_DECODE_ERROR: ReportError
VDAF_VERIFY_ERROR: ReportError
REPORT_TOO_EARLY: ReportError
TASK_EXPIRED: ReportError
INVALID_MESSAGE: ReportError
INVALID_TOKEN: ReportError

class ReportShare(_message.Message):
    __slots__ = ("metadata", "public_share", "encrypted_input_share")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    ENCRYPTED_INPUT_SHARE_FIELD_NUMBER: _ClassVar[int]
    metadata: _messages_pb2.ReportMetadata
    public_share: bytes
    encrypted_input_share: _messages_pb2.HpkeCiphertext
    def __init__(self, metadata: _Optional[_Union[_messages_pb2.ReportMetadata, _Mapping]] = ..., public_share: _Optional[bytes] = ..., encrypted_input_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ...) -> None: ...

class VerifyInit(_message.Message):
    __slots__ = ("report_share", "leader_verifier_share", "leader_verifier_share_2", "token", "leader_share_digest")
    REPORT_SHARE_FIELD_NUMBER: _ClassVar[int]
    LEADER_VERIFIER_SHARE_FIELD_NUMBER: _ClassVar[int]
    LEADER_VERIFIER_SHARE_2_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEADER_SHARE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    report_share: ReportShare
    leader_verifier_share: bytes
    leader_verifier_share_2: bytes
    token: bytes
    leader_share_digest: bytes
    def __init__(self, report_share: _Optional[_Union[ReportShare, _Mapping]] = ..., leader_verifier_share: _Optional[bytes] = ..., leader_verifier_share_2: _Optional[bytes] = ..., token: _Optional[bytes] = ..., leader_share_digest: _Optional[bytes] = ...) -> None: ...

class AggregationJobRequest(_message.Message):
    __slots__ = ("task_id", "aggregation_job_id", "verify_inits", "agg_param", "batch_interval", "round", "task_window")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFY_INITS_FIELD_NUMBER: _ClassVar[int]
    AGG_PARAM_FIELD_NUMBER: _ClassVar[int]
    BATCH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TASK_WINDOW_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    aggregation_job_id: bytes
    verify_inits: _containers.RepeatedCompositeFieldContainer[VerifyInit]
    agg_param: bytes
    batch_interval: _messages_pb2.Interval
    round: int
    task_window: TaskWindow
    def __init__(self, task_id: _Optional[bytes] = ..., aggregation_job_id: _Optional[bytes] = ..., verify_inits: _Optional[_Iterable[_Union[VerifyInit, _Mapping]]] = ..., agg_param: _Optional[bytes] = ..., batch_interval: _Optional[_Union[_messages_pb2.Interval, _Mapping]] = ..., round: _Optional[int] = ..., task_window: _Optional[_Union[TaskWindow, _Mapping]] = ...) -> None: ...

class TaskWindow(_message.Message):
    __slots__ = ("not_before", "not_after")
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    not_before: int
    not_after: int
    def __init__(self, not_before: _Optional[int] = ..., not_after: _Optional[int] = ...) -> None: ...

class VerifyResp(_message.Message):
    __slots__ = ("report_id", "verifier_message", "reject", "helper_verifier_share")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    HELPER_VERIFIER_SHARE_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    verifier_message: bytes
    reject: ReportError
    helper_verifier_share: bytes
    def __init__(self, report_id: _Optional[bytes] = ..., verifier_message: _Optional[bytes] = ..., reject: _Optional[_Union[ReportError, str]] = ..., helper_verifier_share: _Optional[bytes] = ...) -> None: ...

class AggregationJobResponse(_message.Message):
    __slots__ = ("verify_resps", "helper_time_ms")
    VERIFY_RESPS_FIELD_NUMBER: _ClassVar[int]
    HELPER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    verify_resps: _containers.RepeatedCompositeFieldContainer[VerifyResp]
    helper_time_ms: int
    def __init__(self, verify_resps: _Optional[_Iterable[_Union[VerifyResp, _Mapping]]] = ..., helper_time_ms: _Optional[int] = ...) -> None: ...

class AggregateShareRequest(_message.Message):
    __slots__ = ("task_id", "collection_job_id", "batch_interval", "report_count", "checksum", "agg_param", "task_window")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    REPORT_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    AGG_PARAM_FIELD_NUMBER: _ClassVar[int]
    TASK_WINDOW_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    collection_job_id: bytes
    batch_interval: _messages_pb2.Interval
    report_count: int
    checksum: bytes
    agg_param: bytes
    task_window: TaskWindow
    def __init__(self, task_id: _Optional[bytes] = ..., collection_job_id: _Optional[bytes] = ..., batch_interval: _Optional[_Union[_messages_pb2.Interval, _Mapping]] = ..., report_count: _Optional[int] = ..., checksum: _Optional[bytes] = ..., agg_param: _Optional[bytes] = ..., task_window: _Optional[_Union[TaskWindow, _Mapping]] = ...) -> None: ...

class AggregateShareResponse(_message.Message):
    __slots__ = ("encrypted_agg_share",)
    ENCRYPTED_AGG_SHARE_FIELD_NUMBER: _ClassVar[int]
    encrypted_agg_share: _messages_pb2.HpkeCiphertext
    def __init__(self, encrypted_agg_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ...) -> None: ...
