from rlmesh.remote.wire.core.v1 import env_contract_pb2 as _env_contract_pb2
from rlmesh.remote.wire.spaces.v1 import value_pb2 as _value_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_ERROR_CODE_UNSPECIFIED: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_INVALID_REQUEST: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_NOT_CONFIGURED: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_BUSY: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_UNSUPPORTED: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_INTERNAL: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_CANCELLED: _ClassVar[ModelErrorCode]
    MODEL_ERROR_CODE_CLOSED: _ClassVar[ModelErrorCode]
MODEL_ERROR_CODE_UNSPECIFIED: ModelErrorCode
MODEL_ERROR_CODE_INVALID_REQUEST: ModelErrorCode
MODEL_ERROR_CODE_NOT_CONFIGURED: ModelErrorCode
MODEL_ERROR_CODE_BUSY: ModelErrorCode
MODEL_ERROR_CODE_UNSUPPORTED: ModelErrorCode
MODEL_ERROR_CODE_INTERNAL: ModelErrorCode
MODEL_ERROR_CODE_CANCELLED: ModelErrorCode
MODEL_ERROR_CODE_CLOSED: ModelErrorCode

class AdapterContext(_message.Message):
    __slots__ = ("session_id", "env_id", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    env_id: str
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., env_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResolveAdapterRequest(_message.Message):
    __slots__ = ("context", "env_spec", "selected_workflow_edition", "execution_horizon")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    SELECTED_WORKFLOW_EDITION_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_HORIZON_FIELD_NUMBER: _ClassVar[int]
    context: AdapterContext
    env_spec: _env_contract_pb2.EnvSpec
    selected_workflow_edition: str
    execution_horizon: int
    def __init__(self, context: _Optional[_Union[AdapterContext, _Mapping]] = ..., env_spec: _Optional[_Union[_env_contract_pb2.EnvSpec, _Mapping]] = ..., selected_workflow_edition: _Optional[str] = ..., execution_horizon: _Optional[int] = ...) -> None: ...

class ResolveAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EpisodeInfo(_message.Message):
    __slots__ = ("episode_id", "seed")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    seed: int
    def __init__(self, episode_id: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("context", "observation", "episode_info")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INFO_FIELD_NUMBER: _ClassVar[int]
    context: AdapterContext
    observation: _value_pb2.SpaceValue
    episode_info: _containers.RepeatedCompositeFieldContainer[EpisodeInfo]
    def __init__(self, context: _Optional[_Union[AdapterContext, _Mapping]] = ..., observation: _Optional[_Union[_value_pb2.SpaceValue, _Mapping]] = ..., episode_info: _Optional[_Iterable[_Union[EpisodeInfo, _Mapping]]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("context", "actions")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    context: AdapterContext
    actions: _containers.RepeatedCompositeFieldContainer[_value_pb2.SpaceValue]
    def __init__(self, context: _Optional[_Union[AdapterContext, _Mapping]] = ..., actions: _Optional[_Iterable[_Union[_value_pb2.SpaceValue, _Mapping]]] = ...) -> None: ...

class GroupedPredictRequest(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[PredictRequest]
    def __init__(self, groups: _Optional[_Iterable[_Union[PredictRequest, _Mapping]]] = ...) -> None: ...

class GroupedPredictResult(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: PredictResponse
    error: ModelError
    def __init__(self, response: _Optional[_Union[PredictResponse, _Mapping]] = ..., error: _Optional[_Union[ModelError, _Mapping]] = ...) -> None: ...

class GroupedPredictResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GroupedPredictResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GroupedPredictResult, _Mapping]]] = ...) -> None: ...

class ReleaseAdapterRequest(_message.Message):
    __slots__ = ("context", "reason")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    context: AdapterContext
    reason: str
    def __init__(self, context: _Optional[_Union[AdapterContext, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetAdapterRequest(_message.Message):
    __slots__ = ("context", "episode_ids")
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    context: AdapterContext
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, context: _Optional[_Union[AdapterContext, _Mapping]] = ..., episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ResetAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CloseParticipantRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class CloseParticipantResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelError(_message.Message):
    __slots__ = ("code", "message", "is_recoverable", "debug_info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_RECOVERABLE_FIELD_NUMBER: _ClassVar[int]
    DEBUG_INFO_FIELD_NUMBER: _ClassVar[int]
    code: ModelErrorCode
    message: str
    is_recoverable: bool
    debug_info: str
    def __init__(self, code: _Optional[_Union[ModelErrorCode, str]] = ..., message: _Optional[str] = ..., is_recoverable: bool = ..., debug_info: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("resolve_adapter", "predict", "release_adapter", "close", "grouped_predict", "reset_adapter", "request_id")
    RESOLVE_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PREDICT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    GROUPED_PREDICT_FIELD_NUMBER: _ClassVar[int]
    RESET_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    resolve_adapter: ResolveAdapterRequest
    predict: PredictRequest
    release_adapter: ReleaseAdapterRequest
    close: CloseParticipantRequest
    grouped_predict: GroupedPredictRequest
    reset_adapter: ResetAdapterRequest
    request_id: str
    def __init__(self, resolve_adapter: _Optional[_Union[ResolveAdapterRequest, _Mapping]] = ..., predict: _Optional[_Union[PredictRequest, _Mapping]] = ..., release_adapter: _Optional[_Union[ReleaseAdapterRequest, _Mapping]] = ..., close: _Optional[_Union[CloseParticipantRequest, _Mapping]] = ..., grouped_predict: _Optional[_Union[GroupedPredictRequest, _Mapping]] = ..., reset_adapter: _Optional[_Union[ResetAdapterRequest, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("resolve_adapter", "predict", "release_adapter", "close", "grouped_predict", "reset_adapter", "error", "request_id", "endpoint_total_ns")
    RESOLVE_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PREDICT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    GROUPED_PREDICT_FIELD_NUMBER: _ClassVar[int]
    RESET_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    resolve_adapter: ResolveAdapterResponse
    predict: PredictResponse
    release_adapter: ReleaseAdapterResponse
    close: CloseParticipantResponse
    grouped_predict: GroupedPredictResponse
    reset_adapter: ResetAdapterResponse
    error: ModelError
    request_id: str
    endpoint_total_ns: int
    def __init__(self, resolve_adapter: _Optional[_Union[ResolveAdapterResponse, _Mapping]] = ..., predict: _Optional[_Union[PredictResponse, _Mapping]] = ..., release_adapter: _Optional[_Union[ReleaseAdapterResponse, _Mapping]] = ..., close: _Optional[_Union[CloseParticipantResponse, _Mapping]] = ..., grouped_predict: _Optional[_Union[GroupedPredictResponse, _Mapping]] = ..., reset_adapter: _Optional[_Union[ResetAdapterResponse, _Mapping]] = ..., error: _Optional[_Union[ModelError, _Mapping]] = ..., request_id: _Optional[str] = ..., endpoint_total_ns: _Optional[int] = ...) -> None: ...
