"""The builtin gRPC server (kubeletplugin.rpcserver) against real clients on a unix socket.

grpcio clients (what gRPC users run; the kubelet's grpc-go is judged in tests/node): unary
calls with a response larger than the default flow-control window; a server stream that the
client cancels (the handler sees ``is_active()`` turn false and its generator is closed);
unknown method; a too-large request; 64 concurrent calls on ONE channel, 16 of them running at
once, and a call that waits for a later one on the same connection; handler errors and aborts
with their codes and (percent-encoded) messages; grpc.health.v1 Check.

An h2 client for the protocol edge cases: CONTINUATION, padding and priority, PING, a tiny
client window, compressed messages, GOAWAY on stop with a call in flight (it finishes, a new
stream is refused), garbage bytes and protocol errors (GOAWAY, the server keeps serving),
unknown frame types ignored; a request ended twice runs once; a call cancelled while it waits
for a worker never runs.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from dra_gpu.kubeletplugin import grpc_health, rpcserver
from dra_gpu.kubeletplugin.rpc_methods import Abort, CallContext, Code, Method

TIMEOUT_S = 10  # bounds a broken server only


def _same(data: bytes) -> bytes:
    return data


class Handlers:
    """The methods of the server under test, and what they saw."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stream_closed = threading.Event()
        self.barrier = threading.Barrier(16)
        self.second_ran = threading.Event()
        self.blocked_calls = 0
        self.entered = threading.Event()  # a Blocked call runs

    def methods(self) -> list[Method]:
        def unary(path: str, handle: Callable[[bytes, CallContext], bytes]) -> Method:
            return Method(f"/test.Svc/{path}", _same, handle, _same)

        return [
            unary("Echo", lambda request, context: request),
            unary("Repeat", lambda request, context: request * 100_000),
            unary("Blocked", self.blocked),
            unary("Together", self.together),
            unary("First", self.first),
            unary("Second", self.second),
            unary("Fail", self.fail),
            unary("Abort", self.abort),
            Method("/test.Svc/Ticks", _same, self.ticks, _same, streaming=True),
            *grpc_health.methods(lambda: True),
        ]

    def blocked(self, request: bytes, context: CallContext) -> bytes:
        self.blocked_calls += 1
        self.entered.set()
        assert self.release.wait(TIMEOUT_S)
        return b"released"

    def together(self, request: bytes, context: CallContext) -> bytes:
        self.barrier.wait(TIMEOUT_S)  # breaks (and fails the call) unless 16 run at once
        return request

    def first(self, request: bytes, context: CallContext) -> bytes:
        return b"after second" if self.second_ran.wait(TIMEOUT_S) else b"alone"

    def second(self, request: bytes, context: CallContext) -> bytes:
        self.second_ran.set()
        return b""

    def fail(self, request: bytes, context: CallContext) -> bytes:
        raise ValueError("the handler broke")

    def abort(self, request: bytes, context: CallContext) -> bytes:
        raise Abort(Code.NOT_FOUND, "no 100% match for ünïcode\nline")

    def ticks(self, request: bytes, context: CallContext) -> Iterator[bytes]:
        try:
            n = 0
            while context.is_active():
                yield b"tick %d" % n
                n += 1
                time.sleep(0.01)
        finally:
            self.stream_closed.set()


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def served(tmp_path: Path, handlers: Handlers) -> Iterator[tuple[rpcserver.Server, Path]]:
    path = tmp_path / "rpc.sock"
    server = rpcserver.Server(handlers.methods(), max_workers=16)
    server.add_address(f"unix:{path}")
    server.start()
    yield server, path
    handlers.release.set()
    server.stop(grace=0)


@pytest.fixture
def channel(served: tuple[rpcserver.Server, Path]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix:{served[1]}") as ch:
        yield ch


def unary(channel: grpc.Channel, path: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)


def call(channel: grpc.Channel, method: str, request: bytes = b"") -> bytes:
    response: bytes = unary(channel, f"/test.Svc/{method}")(request, timeout=TIMEOUT_S)
    return response


def error_of(channel: grpc.Channel, method: str, request: bytes = b"") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, method, request)
    return raised.value


# --- grpcio clients


def test_unary_call_and_a_response_larger_than_the_window(channel: grpc.Channel) -> None:
    assert call(channel, "Echo", b"hello") == b"hello"
    assert call(channel, "Echo", b"") == b""
    assert call(channel, "Repeat", b"0123456789") == b"0123456789" * 100_000  # 1 MB


def test_a_cancelled_stream_stops_its_handler(channel: grpc.Channel, handlers: Handlers) -> None:
    ticks = channel.unary_stream(
        "/test.Svc/Ticks", request_serializer=None, response_deserializer=None
    )
    responses: Any = ticks(b"", timeout=TIMEOUT_S)
    assert [next(responses) for _ in range(3)] == [b"tick 0", b"tick 1", b"tick 2"]
    responses.cancel()
    assert handlers.stream_closed.wait(TIMEOUT_S)


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    err = error_of(channel, "Nope")
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert err.details() == "unknown method /test.Svc/Nope"


def test_a_request_over_4_mib_is_refused(channel: grpc.Channel) -> None:
    err = error_of(channel, "Echo", b"x" * (4 * 1024 * 1024 + 1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(channel, "Echo", b"x" * (4 * 1024 * 1024)) == b"x" * (4 * 1024 * 1024)


def test_64_concurrent_calls_on_one_channel(channel: grpc.Channel) -> None:
    method = unary(channel, "/test.Svc/Together")
    pending = [method.future(b"%d" % i, timeout=TIMEOUT_S) for i in range(64)]
    assert [p.result() for p in pending] == [b"%d" % i for i in range(64)]


def test_a_call_does_not_wait_for_the_one_before_it(channel: grpc.Channel) -> None:
    first = unary(channel, "/test.Svc/First").future(b"", timeout=TIMEOUT_S)
    time.sleep(0.05)  # the first call is running; the second comes on the same connection
    call(channel, "Second")
    assert first.result() == b"after second"


def test_handler_errors_and_aborts(channel: grpc.Channel, caplog: pytest.LogCaptureFixture) -> None:
    err = error_of(channel, "Fail")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert err.details() == "Exception calling application: the handler broke"
    assert "ValueError: the handler broke" in caplog.text  # with its traceback
    err = error_of(channel, "Abort")
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "no 100% match for ünïcode\nline"


def test_health_check(channel: grpc.Channel) -> None:
    check = unary(channel, "/grpc.health.v1.Health/Check")
    assert check(b"", timeout=TIMEOUT_S) == grpc_health.encode_status(grpc_health.SERVING)
    with pytest.raises(grpc.RpcError) as raised:
        check(b"\x0a\x03abc", timeout=TIMEOUT_S)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


# --- an h2 client, for the protocol's edge cases


def message(data: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(data)) + data


def request_headers(method: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/test.Svc/{method}"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


class Client:
    """An HTTP/2 connection from the h2 library; collects what arrives per stream."""

    def __init__(
        self, path: Path, settings: dict[h2.settings.SettingCodes, int] | None = None
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(str(path))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        if settings:
            self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.conn.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.data: dict[int, bytearray] = {}
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def call(self, stream: int, method: str, body: bytes, **kwargs: Any) -> None:
        self.conn.send_headers(stream, request_headers(method), **kwargs)
        self.conn.send_data(stream, body, end_stream=True)
        self.flush()

    def until(self, done: Callable[[h2.events.Event], bool]) -> h2.events.Event:
        """Read until an event ``done`` accepts arrives (returns it)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            for event in self.events:
                if done(event):
                    self.events.remove(event)
                    return event
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    self.data.setdefault(event.stream_id, bytearray()).extend(event.data)
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                self.events.append(event)
            self.flush()
        raise TimeoutError("no such event")

    def status(self, stream: int) -> dict[bytes, bytes]:
        """The trailers (or trailers-only headers) that end ``stream``."""

        def ends(event: h2.events.Event) -> bool:
            return getattr(event, "stream_id", None) == stream and isinstance(
                event, h2.events.TrailersReceived | h2.events.ResponseReceived
            ) and (event.stream_ended is not None)  # fmt: skip

        event = self.until(ends)
        assert isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived)
        return {bytes(k): bytes(v) for k, v in event.headers or []}

    def body(self, stream: int) -> bytes:
        return bytes(self.data.get(stream, b""))[5:]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def client(served: tuple[rpcserver.Server, Path]) -> Iterator[Client]:
    c = Client(served[1])
    yield c
    c.close()


def test_headers_with_continuation_padding_and_priority(client: Client) -> None:
    headers = request_headers("Echo", ("x-big", "v" * 40_000))  # > 2 frames of 16 KiB
    client.conn.send_headers(1, headers)
    client.conn.send_data(1, message(b"continued"), end_stream=True)
    # (h2 cannot send a split header block with a priority: its frames would be too large.)
    client.conn.send_headers(3, request_headers("Echo"), priority_weight=200, priority_depends_on=0)
    client.conn.send_data(3, message(b"padded"), end_stream=True, pad_length=40)
    client.flush()
    assert client.status(1)[b"grpc-status"] == b"0"
    assert client.body(1) == b"continued"
    assert client.status(3)[b"grpc-status"] == b"0"
    assert client.body(3) == b"padded"


def test_ping_is_answered(client: Client) -> None:
    client.conn.ping(b"8 bytes!")
    client.flush()
    ack = client.until(lambda e: isinstance(e, h2.events.PingAckReceived))
    assert isinstance(ack, h2.events.PingAckReceived) and ack.ping_data == b"8 bytes!"


def test_a_tiny_client_window_gets_the_whole_response(served: tuple[Any, Path]) -> None:
    client = Client(served[1], {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 7})
    try:
        client.call(1, "Echo", message(b"0123456789" * 300))
        assert client.status(1)[b"grpc-status"] == b"0"
        assert client.body(1) == b"0123456789" * 300
    finally:
        client.close()


def test_a_compressed_message_is_unimplemented(client: Client) -> None:
    client.conn.send_headers(1, request_headers("Echo", ("grpc-encoding", "gzip")))
    client.conn.send_data(1, message(b"\x1f\x8b", compressed=1), end_stream=True)
    client.flush()
    trailers = client.status(1)
    assert trailers[b"grpc-status"] == str(int(Code.UNIMPLEMENTED)).encode()
    assert b"gzip" in trailers[b"grpc-message"]


def test_stop_lets_the_call_in_flight_finish(
    served: tuple[rpcserver.Server, Path], channel: grpc.Channel, handlers: Handlers
) -> None:
    server, _ = served
    blocked = unary(channel, "/test.Svc/Blocked").future(b"", timeout=TIMEOUT_S)
    assert handlers.entered.wait(TIMEOUT_S)  # the call is running
    stopping = threading.Thread(target=server.stop, args=(TIMEOUT_S,))
    stopping.start()
    time.sleep(0.05)
    assert stopping.is_alive()  # waits for the call
    handlers.release.set()
    assert blocked.result() == b"released"
    stopping.join(TIMEOUT_S)
    assert not stopping.is_alive()


def test_stop_sends_goaway_and_refuses_new_streams(
    served: tuple[rpcserver.Server, Path], handlers: Handlers
) -> None:
    server, path = served
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(str(path))
        sock.sendall(h2_preface_and_settings() + raw_call(1, "Blocked"))
        assert handlers.entered.wait(TIMEOUT_S)  # the call is running
        stopping = threading.Thread(target=server.stop, args=(TIMEOUT_S,))
        stopping.start()
        frames = Frames(sock)
        goaway = frames.until(0x7)
        assert struct.unpack(">II", goaway[3][:8]) == (1, 0)  # last stream 1, NO_ERROR
        # What a client that had not read the GOAWAY yet sends:
        sock.sendall(raw_call(3, "Echo"))
        reset = frames.until(0x3)
        assert reset[2] == 3 and reset[3] == struct.pack(">I", 0x7)  # REFUSED_STREAM
        handlers.release.set()
        trailers = frames.until(0x1, stream=1, flags=0x1)  # HEADERS with END_STREAM
        assert b"grpc-status" in trailers[3]
        stopping.join(TIMEOUT_S)
        assert not stopping.is_alive()


def raw_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
    return header + payload


def raw_call(stream: int, method: str) -> bytes:
    """HEADERS and DATA (END_STREAM) of a call with an empty message, as bytes on the wire."""
    block = hpack.Encoder().encode(request_headers(method))
    return raw_frame(0x1, 0x4, stream, block) + raw_frame(0x0, 0x1, stream, message(b""))


Frame = tuple[int, int, int, bytes]  # type, flags, stream, payload


class Frames:
    """The frames a raw socket receives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def until(self, kind: int, *, stream: int | None = None, flags: int = 0) -> Frame:
        while True:
            while len(self.buf) >= 9:
                length = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + length:
                    break
                sid = struct.unpack(">I", self.buf[5:9])[0]
                got = (self.buf[3], self.buf[4], sid, self.buf[9 : 9 + length])
                self.buf = self.buf[9 + length :]
                if got[0] == kind and stream in (None, sid) and got[1] & flags == flags:
                    return got
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk


def frames_of(data: bytes) -> list[tuple[int, bytes]]:
    """(type, payload) of each whole frame in ``data``."""
    out, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at : at + 3], "big")
        out.append((data[at + 3], data[at + 9 : at + 9 + length]))
        at += 9 + length
    return out


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(
    "sent",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http1"),
        pytest.param(b"\x00" * 64, id="zeros"),
        pytest.param(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x",
            id="data-on-stream-0",
        ),
        pytest.param(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            b"\x00\x00\x03\x06\x00\x00\x00\x00\x00abc",
            id="short-ping",
        ),
        pytest.param(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
            b"\x00\x00\x02\x01\x05\x00\x00\x00\x01\xff\xff",
            id="bad-hpack",
        ),
    ],
)
def test_protocol_errors_end_the_connection_with_goaway(
    served: tuple[rpcserver.Server, Path], channel: grpc.Channel, sent: bytes
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(str(served[1]))
        sock.sendall(sent)
        frames = frames_of(read_until_closed(sock))
    assert frames[-1][0] == 0x7  # GOAWAY
    assert struct.unpack(">I", frames[-1][1][4:8])[0] != 0  # an error code
    assert call(channel, "Echo", b"still serving") == b"still serving"


def test_a_request_ended_twice_runs_once(
    served: tuple[rpcserver.Server, Path], handlers: Handlers
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.connect(str(served[1]))
        sock.sendall(h2_preface_and_settings() + raw_call(1, "Blocked"))
        assert handlers.entered.wait(TIMEOUT_S)  # the call is running
        sock.sendall(raw_frame(0x1, 0x5, 1, b""))  # trailers: HEADERS, END_STREAM, no fields
        reset = Frames(sock).until(0x3)
        assert reset[2] == 1 and reset[3] == struct.pack(">I", 0x5)  # STREAM_CLOSED
    handlers.release.set()
    assert handlers.blocked_calls == 1


def test_a_call_cancelled_while_it_waits_for_a_worker_never_runs(
    tmp_path: Path, handlers: Handlers
) -> None:
    server = rpcserver.Server(handlers.methods(), max_workers=1)
    server.add_address(f"unix:{tmp_path / 'one.sock'}")
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(tmp_path / "one.sock"))
            sock.sendall(
                h2_preface_and_settings() + raw_call(1, "Blocked") + raw_call(3, "Blocked")
            )
            assert handlers.entered.wait(TIMEOUT_S)  # the first holds the only worker
            sock.sendall(raw_frame(0x3, 0, 3, struct.pack(">I", 0x8)))  # RST_STREAM, CANCEL
            sock.sendall(raw_frame(0x6, 0, 0, b"in order"))  # PING: its ACK comes after
            frames = Frames(sock)
            frames.until(0x6, flags=0x1)  # the reset was read before the worker gets free
            handlers.release.set()
            frames.until(0x1, stream=1, flags=0x1)  # the first call's trailers
        server.pool.submit(lambda: None).result(TIMEOUT_S)  # the queue has been worked off
        assert handlers.blocked_calls == 1
    finally:
        server.stop(grace=0)


def test_unknown_frame_types_are_ignored(client: Client) -> None:
    client.sock.sendall(b"\x00\x00\x03\xfa\x00\x00\x00\x00\x00abc")
    client.call(1, "Echo", message(b"after"))
    assert client.status(1)[b"grpc-status"] == b"0"
    assert client.body(1) == b"after"


def test_a_stalled_call_does_not_stop_the_server(
    served: tuple[rpcserver.Server, Path], channel: grpc.Channel
) -> None:
    # A client that opens a call and never finishes it holds no worker.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(served[1]))
        sock.sendall(h2_preface_and_settings() + raw_call(1, "Echo")[:-20])
        with futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda i: call(channel, "Echo", b"%d" % i), range(8)))
    assert results == [b"%d" % i for i in range(8)]


def h2_preface_and_settings() -> bytes:
    return b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
