from rlmesh.remote.wire.spaces.v1 import meta_pb2 as _meta_pb2
from rlmesh.remote.wire.spaces.v1 import value_pb2 as _value_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RenderFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RENDER_FORMAT_UNSPECIFIED: _ClassVar[RenderFormat]
    RENDER_FORMAT_PNG: _ClassVar[RenderFormat]

class EnvErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENV_ERROR_CODE_UNSPECIFIED: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_TIMEOUT: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_INVALID_ACTION: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_NOT_READY: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_BUSY: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_UNSUPPORTED: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_INTERNAL: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_CRASHED: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_CANCELLED: _ClassVar[EnvErrorCode]
    ENV_ERROR_CODE_CLOSED: _ClassVar[EnvErrorCode]
RENDER_FORMAT_UNSPECIFIED: RenderFormat
RENDER_FORMAT_PNG: RenderFormat
ENV_ERROR_CODE_UNSPECIFIED: EnvErrorCode
ENV_ERROR_CODE_TIMEOUT: EnvErrorCode
ENV_ERROR_CODE_INVALID_ACTION: EnvErrorCode
ENV_ERROR_CODE_NOT_READY: EnvErrorCode
ENV_ERROR_CODE_BUSY: EnvErrorCode
ENV_ERROR_CODE_UNSUPPORTED: EnvErrorCode
ENV_ERROR_CODE_INTERNAL: EnvErrorCode
ENV_ERROR_CODE_CRASHED: EnvErrorCode
ENV_ERROR_CODE_CANCELLED: EnvErrorCode
ENV_ERROR_CODE_CLOSED: EnvErrorCode

class EpisodeMetadata(_message.Message):
    __slots__ = ("episode_id", "seed", "env_index", "step_count", "cumulative_reward", "terminated", "truncated", "start_timestamp_ns", "end_timestamp_ns", "final_info")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    ENV_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_COUNT_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_NS_FIELD_NUMBER: _ClassVar[int]
    FINAL_INFO_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    seed: int
    env_index: int
    step_count: int
    cumulative_reward: float
    terminated: bool
    truncated: bool
    start_timestamp_ns: int
    end_timestamp_ns: int
    final_info: _meta_pb2.MetaMap
    def __init__(self, episode_id: _Optional[str] = ..., seed: _Optional[int] = ..., env_index: _Optional[int] = ..., step_count: _Optional[int] = ..., cumulative_reward: _Optional[float] = ..., terminated: bool = ..., truncated: bool = ..., start_timestamp_ns: _Optional[int] = ..., end_timestamp_ns: _Optional[int] = ..., final_info: _Optional[_Union[_meta_pb2.MetaMap, _Mapping]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("seeds", "options", "timeout_ms", "env_indices", "episode_ids")
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    seeds: _containers.RepeatedScalarFieldContainer[int]
    options: _meta_pb2.MetaMap
    timeout_ms: int
    env_indices: _containers.RepeatedScalarFieldContainer[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seeds: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[_meta_pb2.MetaMap, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., env_indices: _Optional[_Iterable[int]] = ..., episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("action", "timeout_ms", "env_indices", "episode_ids")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    action: _value_pb2.SpaceValue
    timeout_ms: int
    env_indices: _containers.RepeatedScalarFieldContainer[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, action: _Optional[_Union[_value_pb2.SpaceValue, _Mapping]] = ..., timeout_ms: _Optional[int] = ..., env_indices: _Optional[_Iterable[int]] = ..., episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenderRequest(_message.Message):
    __slots__ = ("env_indices", "timeout_ms")
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    env_indices: _containers.RepeatedScalarFieldContainer[int]
    timeout_ms: int
    def __init__(self, env_indices: _Optional[_Iterable[int]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class CloseEnvsRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ConfigureEnvRequest(_message.Message):
    __slots__ = ("selected_workflow_edition",)
    SELECTED_WORKFLOW_EDITION_FIELD_NUMBER: _ClassVar[int]
    selected_workflow_edition: str
    def __init__(self, selected_workflow_edition: _Optional[str] = ...) -> None: ...

class ConfigureEnvResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("reset", "step", "render", "close", "configure", "request_id")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RENDER_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    reset: ResetRequest
    step: StepRequest
    render: RenderRequest
    close: CloseEnvsRequest
    configure: ConfigureEnvRequest
    request_id: str
    def __init__(self, reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ..., render: _Optional[_Union[RenderRequest, _Mapping]] = ..., close: _Optional[_Union[CloseEnvsRequest, _Mapping]] = ..., configure: _Optional[_Union[ConfigureEnvRequest, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("observation", "infos")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    observation: _value_pb2.SpaceValue
    infos: _meta_pb2.MetaMap
    def __init__(self, observation: _Optional[_Union[_value_pb2.SpaceValue, _Mapping]] = ..., infos: _Optional[_Union[_meta_pb2.MetaMap, _Mapping]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observation", "rewards", "terminated_mask", "truncated_mask", "infos", "completed_episodes", "env_indices")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_MASK_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_MASK_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    observation: _value_pb2.SpaceValue
    rewards: _containers.RepeatedScalarFieldContainer[float]
    terminated_mask: bytes
    truncated_mask: bytes
    infos: _meta_pb2.MetaMap
    completed_episodes: _containers.RepeatedCompositeFieldContainer[EpisodeMetadata]
    env_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, observation: _Optional[_Union[_value_pb2.SpaceValue, _Mapping]] = ..., rewards: _Optional[_Iterable[float]] = ..., terminated_mask: _Optional[bytes] = ..., truncated_mask: _Optional[bytes] = ..., infos: _Optional[_Union[_meta_pb2.MetaMap, _Mapping]] = ..., completed_episodes: _Optional[_Iterable[_Union[EpisodeMetadata, _Mapping]]] = ..., env_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class RenderResponse(_message.Message):
    __slots__ = ("frame", "format")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    format: RenderFormat
    def __init__(self, frame: _Optional[bytes] = ..., format: _Optional[_Union[RenderFormat, str]] = ...) -> None: ...

class CloseEnvsResponse(_message.Message):
    __slots__ = ("final_episodes",)
    FINAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    final_episodes: _containers.RepeatedCompositeFieldContainer[EpisodeMetadata]
    def __init__(self, final_episodes: _Optional[_Iterable[_Union[EpisodeMetadata, _Mapping]]] = ...) -> None: ...

class EnvError(_message.Message):
    __slots__ = ("code", "message", "is_recoverable", "debug_info", "interrupted_episodes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_RECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    code: EnvErrorCode
    message: str
    is_recoverable: bool
    debug_info: str
    interrupted_episodes: _containers.RepeatedCompositeFieldContainer[EpisodeMetadata]
    def __init__(self, code: _Optional[_Union[EnvErrorCode, str]] = ..., message: _Optional[str] = ..., is_recoverable: bool = ..., debug_info: _Optional[str] = ..., interrupted_episodes: _Optional[_Iterable[_Union[EpisodeMetadata, _Mapping]]] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("reset", "step", "render", "close", "configure", "error", "request_id", "endpoint_total_ns")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RENDER_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    reset: ResetResponse
    step: StepResponse
    render: RenderResponse
    close: CloseEnvsResponse
    configure: ConfigureEnvResponse
    error: EnvError
    request_id: str
    endpoint_total_ns: int
    def __init__(self, reset: _Optional[_Union[ResetResponse, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., render: _Optional[_Union[RenderResponse, _Mapping]] = ..., close: _Optional[_Union[CloseEnvsResponse, _Mapping]] = ..., configure: _Optional[_Union[ConfigureEnvResponse, _Mapping]] = ..., error: _Optional[_Union[EnvError, _Mapping]] = ..., request_id: _Optional[str] = ..., endpoint_total_ns: _Optional[int] = ...) -> None: ...
