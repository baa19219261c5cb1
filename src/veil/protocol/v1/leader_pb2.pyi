from veil.protocol.v1 import messages_pb2 as _messages_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskInfoRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    def __init__(self, task_id: _Optional[bytes] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("collector_hpke_config", "reports", "rejected", "collections_finished", "counts_withheld")
    COLLECTOR_HPKE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    COUNTS_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    collector_hpke_config: _messages_pb2.HpkeConfig
    reports: int
    rejected: int
    collections_finished: int
    counts_withheld: bool
    def __init__(self, collector_hpke_config: _Optional[_Union[_messages_pb2.HpkeConfig, _Mapping]] = ..., reports: _Optional[int] = ..., rejected: _Optional[int] = ..., collections_finished: _Optional[int] = ..., counts_withheld: _Optional[bool] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("metadata", "public_share", "leader_encrypted_input_share", "helper_encrypted_input_share", "token")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_SHARE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ENCRYPTED_INPUT_SHARE_FIELD_NUMBER: _ClassVar[int]
    HELPER_ENCRYPTED_INPUT_SHARE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    metadata: _messages_pb2.ReportMetadata
    public_share: bytes
    leader_encrypted_input_share: _messages_pb2.HpkeCiphertext
    helper_encrypted_input_share: _messages_pb2.HpkeCiphertext
    token: bytes
    def __init__(self, metadata: _Optional[_Union[_messages_pb2.ReportMetadata, _Mapping]] = ..., public_share: _Optional[bytes] = ..., leader_encrypted_input_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ..., helper_encrypted_input_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ..., token: _Optional[bytes] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("task_id", "reports")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    def __init__(self, task_id: _Optional[bytes] = ..., reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("accepted", "duplicates")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("task_id", "collection_job_id", "batch_interval", "agg_param")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    AGG_PARAM_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    collection_job_id: bytes
    batch_interval: _messages_pb2.Interval
    agg_param: bytes
    def __init__(self, task_id: _Optional[bytes] = ..., collection_job_id: _Optional[bytes] = ..., batch_interval: _Optional[_Union[_messages_pb2.Interval, _Mapping]] = ..., agg_param: _Optional[bytes] = ...) -> None: ...

class GetCollectionRequest(_message.Message):
    __slots__ = ("task_id", "collection_job_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    collection_job_id: bytes
    def __init__(self, task_id: _Optional[bytes] = ..., collection_job_id: _Optional[bytes] = ...) -> None: ...

class CollectionJob(_message.Message):
    __slots__ = ("state", "collection_job_id", "batch_interval", "report_count", "leader_encrypted_agg_share", "helper_encrypted_agg_share", "error_code", "error_message", "agg_param")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[CollectionJob.State]
        PENDING: _ClassVar[CollectionJob.State]
        FINISHED: _ClassVar[CollectionJob.State]
        FAILED: _ClassVar[CollectionJob.State]
    STATE_UNSPECIFIED: CollectionJob.State
    PENDING: CollectionJob.State
    FINISHED: CollectionJob.State
    FAILED: CollectionJob.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    REPORT_COUNT_FIELD_NUMBER: _ClassVar[int]
    LEADER_ENCRYPTED_AGG_SHARE_FIELD_NUMBER: _ClassVar[int]
    HELPER_ENCRYPTED_AGG_SHARE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AGG_PARAM_FIELD_NUMBER: _ClassVar[int]
    state: CollectionJob.State
    collection_job_id: bytes
    batch_interval: _messages_pb2.Interval
    report_count: int
    leader_encrypted_agg_share: _messages_pb2.HpkeCiphertext
    helper_encrypted_agg_share: _messages_pb2.HpkeCiphertext
    error_code: int
    error_message: str
    agg_param: bytes
    def __init__(self, state: _Optional[_Union[CollectionJob.State, str]] = ..., collection_job_id: _Optional[bytes] = ..., batch_interval: _Optional[_Union[_messages_pb2.Interval, _Mapping]] = ..., report_count: _Optional[int] = ..., leader_encrypted_agg_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ..., helper_encrypted_agg_share: _Optional[_Union[_messages_pb2.HpkeCiphertext, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., agg_param: _Optional[bytes] = ...) -> None: ...
