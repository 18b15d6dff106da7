from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SpaceValue(_message.Message):
    __slots__ = ("leaves",)
    LEAVES_FIELD_NUMBER: _ClassVar[int]
    leaves: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, leaves: _Optional[_Iterable[bytes]] = ...) -> None: ...
