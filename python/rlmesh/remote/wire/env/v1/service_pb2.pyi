from rlmesh.remote.wire.core.v1 import env_contract_pb2 as _env_contract_pb2
from rlmesh.remote.wire.core.v1 import handshake_pb2 as _handshake_pb2
from rlmesh.remote.wire.env.v1 import interaction_pb2 as _interaction_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandshakeRequest(_message.Message):
    __slots__ = ("base",)
    BASE_FIELD_NUMBER: _ClassVar[int]
    base: _handshake_pb2.HandshakeRequest
    def __init__(self, base: _Optional[_Union[_handshake_pb2.HandshakeRequest, _Mapping]] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("base", "env_contract")
    BASE_FIELD_NUMBER: _ClassVar[int]
    ENV_CONTRACT_FIELD_NUMBER: _ClassVar[int]
    base: _handshake_pb2.HandshakeResponse
    env_contract: _env_contract_pb2.EnvContract
    def __init__(self, base: _Optional[_Union[_handshake_pb2.HandshakeResponse, _Mapping]] = ..., env_contract: _Optional[_Union[_env_contract_pb2.EnvContract, _Mapping]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("base",)
    BASE_FIELD_NUMBER: _ClassVar[int]
    base: _handshake_pb2.ShutdownRequest
    def __init__(self, base: _Optional[_Union[_handshake_pb2.ShutdownRequest, _Mapping]] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ("base",)
    BASE_FIELD_NUMBER: _ClassVar[int]
    base: _handshake_pb2.ShutdownResponse
    def __init__(self, base: _Optional[_Union[_handshake_pb2.ShutdownResponse, _Mapping]] = ...) -> None: ...
