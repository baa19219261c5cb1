from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HpkeConfig(_message.Message):
    __slots__ = ("config_id", "kem_id", "kdf_id", "aead_id", "public_key")
    CONFIG_ID_FIELD_NUMBER: _ClassVar[int]
    KEM_ID_FIELD_NUMBER: _ClassVar[int]
    KDF_ID_FIELD_NUMBER: _ClassVar[int]
    AEAD_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    config_id: int
    kem_id: int
    kdf_id: int
    aead_id: int
    public_key: bytes
    def __init__(self, config_id: _Optional[int] = ..., kem_id: _Optional[int] = ..., kdf_id: _Optional[int] = ..., aead_id: _Optional[int] = ..., public_key: _Optional[bytes] = ...) -> None: ...

class HpkeConfigRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: bytes
    def __init__(self, task_id: _Optional[bytes] = ...) -> None: ...

class HpkeConfigList(_message.Message):
    __slots__ = ("configs",)
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[HpkeConfig]
    def __init__(self, configs: _Optional[_Iterable[_Union[HpkeConfig, _Mapping]]] = ...) -> None: ...

class HpkeCiphertext(_message.Message):
    __slots__ = ("config_id", "enc", "payload")
    CONFIG_ID_FIELD_NUMBER: _ClassVar[int]
    ENC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    config_id: int
    enc: bytes
    payload: bytes
    def __init__(self, config_id: _Optional[int] = ..., enc: _Optional[bytes] = ..., payload: _Optional[bytes] = ...) -> None: ...

class ReportMetadata(_message.Message):
    __slots__ = ("report_id", "time")
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    report_id: bytes
    time: int
    def __init__(self, report_id: _Optional[bytes] = ..., time: _Optional[int] = ...) -> None: ...

class Interval(_message.Message):
    __slots__ = ("start", "duration")
    START_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    start: int
    duration: int
    def __init__(self, start: _Optional[int] = ..., duration: _Optional[int] = ...) -> None: ...
