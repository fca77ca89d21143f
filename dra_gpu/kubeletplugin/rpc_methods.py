"""What the kubelet plugin serves over gRPC, apart from the server that carries it.

A service is a list of :class:`Method`: its full path (``/package.Service/Method``), how to
parse a request from its wire bytes, the handler, how to serialize a response, and whether the
handler returns one response or yields a stream of them. ``grpcio_server`` serves such a table
with grpcio's generic handlers, so no service module imports a transport (each is tested by
calling its handlers), and the generated ``*_pb2_grpc`` modules are never needed to serve.

A handler reports a gRPC error by raising :class:`Abort`; any other exception becomes UNKNOWN.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, Protocol


class Code(enum.IntEnum):
    """gRPC status codes (the subset this plugin sends; values from the gRPC spec)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


class Abort(Exception):
    """Raised by a handler: the call ends with ``code`` and ``message``."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class CallContext(Protocol):
    """What a handler may ask about its call (grpcio's ``ServicerContext`` has the same)."""

    def is_active(self) -> bool:
        """False once the client cancelled the call or the connection closed."""
        ...


@dataclasses.dataclass(frozen=True)
class Method:
    path: str  # "/package.Service/Method"
    parse: Callable[[bytes], Any]
    handle: Callable[[Any, CallContext], Any]  # a response, or an iterator of them (streaming)
    serialize: Callable[[Any], bytes]
    streaming: bool = False  # server streaming: ``handle`` returns an iterator

    @property
    def service(self) -> str:
        return self.path[1:].rsplit("/", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


def serialize_message(message: Any) -> bytes:
    """A protobuf message's wire bytes (``SerializeToString``, as a plain function)."""
    data: bytes = message.SerializeToString()
    return data
