"""HTTP/2 framing (RFC 9113) for the builtin gRPC server: frame layouts, pure functions.

Only what a server needs: reading the frame header and the fields of the frame types a client
sends, and building the frames the server sends. Header blocks are decoded with ``hpack``; the
few header blocks the server sends are built here as HPACK literals that never touch the
dynamic table (RFC 7541 6.2.2), so they need no encoder state and can be made once.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

# Error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_LIMIT = 2**24 - 1
HEADER_SIZE = 9

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class Violation(Exception):
    """The peer broke the protocol: the connection ends with GOAWAY(``code``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_header(data: bytes | bytearray, at: int) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the frame header at ``data[at:at + 9]``."""
    length = data[at] << 16 | data[at + 1] << 8 | data[at + 2]
    stream: int = _U32.unpack_from(data, at + 5)[0]
    return length, data[at + 3], data[at + 4], stream & 0x7FFFFFFF


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _U32.pack(len(payload))[1:] + bytes((kind, flags)) + _U32.pack(stream) + payload


def unpad(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding (PADDED flag)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise Violation(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


def header_fragment(flags: int, payload: bytes) -> bytes:
    """The header block fragment of a HEADERS frame (padding and priority removed)."""
    payload = unpad(flags, payload)
    if flags & PRIORITY_FLAG:
        if len(payload) < 5:
            raise Violation(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
        payload = payload[5:]
    return payload


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise Violation(FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


def u32(payload: bytes, what: str) -> int:
    """The one 31-bit field of a RST_STREAM or WINDOW_UPDATE payload."""
    if len(payload) != 4:
        raise Violation(FRAME_SIZE_ERROR, f"{what} payload is {len(payload)} bytes, not 4")
    value: int = _U32.unpack(payload)[0]
    return value & 0x7FFFFFFF


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream) + _U32.pack(code) + debug)


# HPACK (RFC 7541) literals without indexing.


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_string(data: bytes) -> bytes:
    return _hpack_int(len(data), 7, 0) + data  # not Huffman-coded


def literal(name: bytes | int, value: bytes) -> bytes:
    """One header field, never added to the dynamic table; ``name``: bytes or a static index."""
    if isinstance(name, int):
        return _hpack_int(name, 4, 0) + _hpack_string(value)
    return b"\x00" + _hpack_string(name) + _hpack_string(value)


STATUS_200 = b"\x88"  # static table entry 8, ":status: 200"
CONTENT_TYPE = 31  # static table index of "content-type"
TABLE_SIZE_ZERO = b"\x20"  # dynamic table size update to 0 (RFC 7541 6.3)
