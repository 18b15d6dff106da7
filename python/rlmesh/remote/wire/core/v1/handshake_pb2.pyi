from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerInfo(_message.Message):
    __slots__ = ("component", "package_version", "language", "language_version", "os", "os_version", "arch", "framework_versions", "extra")
    class FrameworkVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    PACKAGE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    OS_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    component: str
    package_version: str
    language: str
    language_version: str
    os: str
    os_version: str
    arch: str
    framework_versions: _containers.ScalarMap[str, str]
    extra: _containers.ScalarMap[str, str]
    def __init__(self, component: _Optional[str] = ..., package_version: _Optional[str] = ..., language: _Optional[str] = ..., language_version: _Optional[str] = ..., os: _Optional[str] = ..., os_version: _Optional[str] = ..., arch: _Optional[str] = ..., framework_versions: _Optional[_Mapping[str, str]] = ..., extra: _Optional[_Mapping[str, str]] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("protocol_generation", "peer_info", "capabilities", "supported_workflow_editions")
    class CapabilitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROTOCOL_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PEER_INFO_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_WORKFLOW_EDITIONS_FIELD_NUMBER: _ClassVar[int]
    protocol_generation: str
    peer_info: PeerInfo
    capabilities: _containers.ScalarMap[str, str]
    supported_workflow_editions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_generation: _Optional[str] = ..., peer_info: _Optional[_Union[PeerInfo, _Mapping]] = ..., capabilities: _Optional[_Mapping[str, str]] = ..., supported_workflow_editions: _Optional[_Iterable[str]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("compatible", "peer_info", "capabilities", "supported_workflow_editions", "error_message")
    class CapabilitiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMPATIBLE_FIELD_NUMBER: _ClassVar[int]
    PEER_INFO_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_WORKFLOW_EDITIONS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    compatible: bool
    peer_info: PeerInfo
    capabilities: _containers.ScalarMap[str, str]
    supported_workflow_editions: _containers.RepeatedScalarFieldContainer[str]
    error_message: str
    def __init__(self, compatible: bool = ..., peer_info: _Optional[_Union[PeerInfo, _Mapping]] = ..., capabilities: _Optional[_Mapping[str, str]] = ..., supported_workflow_editions: _Optional[_Iterable[str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ("accepted", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    message: str
    def __init__(self, accepted: bool = ..., message: _Optional[str] = ...) -> None: ...
