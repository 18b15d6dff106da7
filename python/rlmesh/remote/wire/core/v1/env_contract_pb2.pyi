from rlmesh.remote.wire.spaces.v1 import meta_pb2 as _meta_pb2
from rlmesh.remote.wire.spaces.v1 import spaces_pb2 as _spaces_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AutoresetMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUTORESET_MODE_UNSPECIFIED: _ClassVar[AutoresetMode]
    AUTORESET_MODE_NEXT_STEP: _ClassVar[AutoresetMode]
    AUTORESET_MODE_SAME_STEP: _ClassVar[AutoresetMode]
    AUTORESET_MODE_DISABLED: _ClassVar[AutoresetMode]
AUTORESET_MODE_UNSPECIFIED: AutoresetMode
AUTORESET_MODE_NEXT_STEP: AutoresetMode
AUTORESET_MODE_SAME_STEP: AutoresetMode
AUTORESET_MODE_DISABLED: AutoresetMode

class EnvSpec(_message.Message):
    __slots__ = ("id", "action_space", "observation_space", "metadata")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    action_space: _spaces_pb2.SpaceSpec
    observation_space: _spaces_pb2.SpaceSpec
    metadata: _meta_pb2.MetaMap
    def __init__(self, id: _Optional[str] = ..., action_space: _Optional[_Union[_spaces_pb2.SpaceSpec, _Mapping]] = ..., observation_space: _Optional[_Union[_spaces_pb2.SpaceSpec, _Mapping]] = ..., metadata: _Optional[_Union[_meta_pb2.MetaMap, _Mapping]] = ...) -> None: ...

class EnvContract(_message.Message):
    __slots__ = ("spec", "num_envs", "render_mode", "autoreset_mode")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    RENDER_MODE_FIELD_NUMBER: _ClassVar[int]
    AUTORESET_MODE_FIELD_NUMBER: _ClassVar[int]
    spec: EnvSpec
    num_envs: int
    render_mode: str
    autoreset_mode: AutoresetMode
    def __init__(self, spec: _Optional[_Union[EnvSpec, _Mapping]] = ..., num_envs: _Optional[int] = ..., render_mode: _Optional[str] = ..., autoreset_mode: _Optional[_Union[AutoresetMode, str]] = ...) -> None: ...
