from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetaValue(_message.Message):
    __slots__ = ("integer", "number", "text", "bool", "bytes", "list", "map")
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    BOOL_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    integer: int
    number: float
    text: str
    bool: bool
    bytes: bytes
    list: MetaList
    map: MetaMap
    def __init__(self, integer: _Optional[int] = ..., number: _Optional[float] = ..., text: _Optional[str] = ..., bool: bool = ..., bytes: _Optional[bytes] = ..., list: _Optional[_Union[MetaList, _Mapping]] = ..., map: _Optional[_Union[MetaMap, _Mapping]] = ...) -> None: ...

class MetaList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[MetaValue]
    def __init__(self, items: _Optional[_Iterable[_Union[MetaValue, _Mapping]]] = ...) -> None: ...

class MetaMap(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetaValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetaValue, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, MetaValue]
    def __init__(self, entries: _Optional[_Mapping[str, MetaValue]] = ...) -> None: ...
