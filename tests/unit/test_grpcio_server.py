"""The plugin's gRPC server (kubeletplugin.grpcio_server) and its /healthz probe, on unix sockets.

grpcio clients: a method table's calls, aborts with their codes and messages, a handler's
error as UNKNOWN, an unknown method UNIMPLEMENTED, a cancelled stream closes its handler, stop
lets the call in flight finish; the limits take effect (a request, a response or headers over
its size limit are RESOURCE_EXHAUSTED, a call beyond the concurrency bound is refused at once,
one connection cannot take every call slot).

Clients that misbehave (raw sockets, and the h2 library for a client that never grants the
server window to send): garbage bytes, a connection that never reads, a PING flood (answered
with GOAWAY ENHANCE_YOUR_CALM) do not stop other clients; after accept failed at the open-file
limit (a subprocess with a low RLIMIT_NOFILE), the server accepts again once descriptors are free.

The probe: /healthz is 200 while both sockets answer and 503, naming the socket, when one's
server is gone or never answers.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dra_gpu.kubeletplugin import grpc_probe, grpcio_server, healthz, registration
from dra_gpu.kubeletplugin.rpc_methods import Abort, CallContext, Code, Method
from e2e import waiting

TIMEOUT_S = 10  # bounds a broken server only
LIMITS = grpcio_server.Limits(concurrent_rpcs=4, streams_per_connection=2)


def _same(data: bytes) -> bytes:
    return data


class Handlers:
    """The methods of the server under test, and what they saw."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.stream_closed = threading.Event()
        self.entered: list[bytes] = []
        self.entered_changed = threading.Condition()

    def methods(self) -> list[Method]:
        def unary(path: str, handle: Callable[[bytes, CallContext], bytes]) -> Method:
            return Method(f"/test.Svc/{path}", _same, handle, _same)

        return [
            unary("Echo", lambda request, context: request),
            unary("Repeat", lambda request, context: request * 1_000_000),
            unary("Blocked", self.blocked),
            unary("Fail", self.fail),
            unary("Abort", self.abort),
            Method("/test.Svc/Ticks", _same, self.ticks, _same, streaming=True),
        ]

    def blocked(self, request: bytes, context: CallContext) -> bytes:
        with self.entered_changed:
            self.entered.append(request)
            self.entered_changed.notify_all()
        assert self.release.wait(TIMEOUT_S)
        return b"released " + request

    def wait_entered(self, count: int) -> list[bytes]:
        with self.entered_changed:
            assert self.entered_changed.wait_for(lambda: len(self.entered) >= count, TIMEOUT_S)
            return list(self.entered)

    def fail(self, request: bytes, context: CallContext) -> bytes:
        raise ValueError("the handler broke")

    def abort(self, request: bytes, context: CallContext) -> bytes:
        raise Abort(Code.NOT_FOUND, "no 100% match for ünïcode")

    def ticks(self, request: bytes, context: CallContext) -> Iterator[bytes]:
        try:
            n = 0
            while context.is_active():
                yield b"tick %d" % n
                n += 1
                threading.Event().wait(0.01)
        finally:
            self.stream_closed.set()


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def served(tmp_path: Path, handlers: Handlers) -> Iterator[tuple[grpcio_server.GrpcioServer, Path]]:
    path = tmp_path / "rpc.sock"
    health = grpcio_server.health_servicer()
    grpcio_server.set_serving(health, True)
    server = grpcio_server.GrpcioServer(handlers.methods(), health=health, limits=LIMITS)
    server.add_address(f"unix:{path}")
    server.start()
    yield server, path
    handlers.release.set()
    server.stop(grace=0)


def own_channel(path: Path) -> grpc.Channel:
    """A channel with a connection of its own (grpcio shares one between equal channels)."""
    return grpc.insecure_channel(f"unix:{path}", options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.fixture
def channel(served: tuple[grpcio_server.GrpcioServer, Path]) -> Iterator[grpc.Channel]:
    with own_channel(served[1]) as ch:
        yield ch


def unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    return channel.unary_unary(
        f"/test.Svc/{method}", request_serializer=None, response_deserializer=None
    )


def call(channel: grpc.Channel, method: str, request: bytes = b"") -> bytes:
    response: bytes = unary(channel, method)(request, timeout=TIMEOUT_S)
    return response


def error_of(channel: grpc.Channel, method: str, request: bytes = b"") -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(channel, method, request)
    return raised.value


# --- the method table over grpcio


def test_calls_errors_and_aborts(channel: grpc.Channel, caplog: pytest.LogCaptureFixture) -> None:
    assert call(channel, "Echo", b"hello") == b"hello"
    err = error_of(channel, "Fail")
    assert err.code() == grpc.StatusCode.UNKNOWN
    assert "ValueError: the handler broke" in caplog.text  # with its traceback
    err = error_of(channel, "Abort")
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "no 100% match for ünïcode")
    assert error_of(channel, "Nope").code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_cancelled_stream_stops_its_handler(channel: grpc.Channel, handlers: Handlers) -> None:
    ticks = channel.unary_stream(
        "/test.Svc/Ticks", request_serializer=None, response_deserializer=None
    )
    responses: Any = ticks(b"", timeout=TIMEOUT_S)
    assert [next(responses) for _ in range(3)] == [b"tick 0", b"tick 1", b"tick 2"]
    responses.cancel()
    assert handlers.stream_closed.wait(TIMEOUT_S)


def test_stop_lets_the_call_in_flight_finish(
    served: tuple[grpcio_server.GrpcioServer, Path], channel: grpc.Channel, handlers: Handlers
) -> None:
    in_flight = unary(channel, "Blocked").future(b"a", timeout=TIMEOUT_S)
    handlers.wait_entered(1)
    stopping = threading.Thread(target=served[0].stop, args=(TIMEOUT_S,))
    stopping.start()
    handlers.release.set()
    assert in_flight.result() == b"released a"
    stopping.join()


def test_the_health_service_answers_the_status_it_was_given(
    served: tuple[grpcio_server.GrpcioServer, Path], channel: grpc.Channel
) -> None:
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


# --- the limits


def test_a_request_or_response_over_its_size_limit_is_resource_exhausted(
    channel: grpc.Channel,
) -> None:
    limit = grpcio_server.MAX_RECEIVE_MESSAGE_BYTES
    err = error_of(channel, "Echo", b"x" * (limit + 1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(channel, "Echo", b"x" * (limit - 16)) == b"x" * (limit - 16)
    # 5 bytes repeated a million times: over the send limit, refused rather than sent
    assert grpcio_server.MAX_SEND_MESSAGE_BYTES < 5 * 1_000_000
    assert error_of(channel, "Repeat", b"12345").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(channel, "Repeat", b"1234") == b"1234" * 1_000_000


def test_headers_over_their_limit_are_resource_exhausted(channel: grpc.Channel) -> None:
    echo = unary(channel, "Echo")
    big = (("x-big", "v" * grpcio_server.MAX_HEADER_BYTES),)
    with pytest.raises(grpc.RpcError) as refused:
        echo(b"", timeout=TIMEOUT_S, metadata=big)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    fits = (("x-small", "v" * (grpcio_server.MAX_HEADER_BYTES // 2)),)
    assert echo(b"ok", timeout=TIMEOUT_S, metadata=fits) == b"ok"


def test_a_call_beyond_the_concurrency_bound_is_refused_at_once(
    served: tuple[grpcio_server.GrpcioServer, Path], handlers: Handlers
) -> None:
    # two connections fill every slot; the call beyond them comes on a third
    channels = [own_channel(served[1]) for _ in range(3)]
    try:
        running = [
            unary(channels[i % 2], "Blocked").future(b"%d" % i, timeout=TIMEOUT_S)
            for i in range(LIMITS.concurrent_rpcs)
        ]
        handlers.wait_entered(LIMITS.concurrent_rpcs)
        err = error_of(channels[2], "Echo", b"one more")
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        handlers.release.set()
        assert sorted(f.result() for f in running) == [
            b"released %d" % i for i in range(LIMITS.concurrent_rpcs)
        ]
        assert call(channels[2], "Echo", b"again") == b"again"  # the slots are free again
    finally:
        for ch in channels:
            ch.close()


def test_one_connection_cannot_take_every_call_slot(
    served: tuple[grpcio_server.GrpcioServer, Path], handlers: Handlers
) -> None:
    with own_channel(served[1]) as greedy, own_channel(served[1]) as other:
        call(greedy, "Echo")  # connected: the client knows the server's stream limit
        greedy_calls = [
            unary(greedy, "Blocked").future(b"greedy %d" % i, timeout=TIMEOUT_S)
            for i in range(LIMITS.streams_per_connection + 1)
        ]
        handlers.wait_entered(LIMITS.streams_per_connection)
        other_call = unary(other, "Blocked").future(b"other", timeout=TIMEOUT_S)
        entered = handlers.wait_entered(LIMITS.streams_per_connection + 1)
        # the other connection got a slot; the greedy one's extra call waits on its side
        assert b"other" in entered
        assert len([e for e in entered if e.startswith(b"greedy")]) == (
            LIMITS.streams_per_connection
        )
        handlers.release.set()
        assert other_call.result() == b"released other"
        assert len([f.result() for f in greedy_calls]) == LIMITS.streams_per_connection + 1


# --- clients that misbehave


class H2Client:
    """A raw HTTP/2 client (the h2 library) that sends what it is told and reads when told."""

    def __init__(self, path: Path, settings: dict[h2.settings.SettingCodes, int]) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(str(path))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def call(self, stream: int, method: str, body: bytes) -> None:
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", f"/test.Svc/{method}"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.conn.send_headers(stream, headers)
        self.conn.send_data(stream, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
        self.flush()

    def until(self, done: Callable[[h2.events.Event], bool]) -> h2.events.Event:
        while True:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            for event in self.conn.receive_data(chunk):
                if done(event):
                    return event
            # What h2 answers (a SETTINGS ack) may find the server gone already: what it sent
            # before it closed is still there to read.
            with contextlib.suppress(BrokenPipeError):
                self.flush()

    def close(self) -> None:
        self.sock.close()


def read_to_the_end(sock: socket.socket) -> bytes:
    """All the peer sends until it closes the connection (a timeout raises)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_garbage_and_a_client_that_never_reads_do_not_stop_the_others(
    served: tuple[grpcio_server.GrpcioServer, Path], channel: grpc.Channel
) -> None:
    path = served[1]
    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    garbage.connect(str(path))
    garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096))
    # Never lets the server send a byte of data: a window of 0, and it never reads.
    stalled = H2Client(path, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    try:
        stalled.call(1, "Repeat", b"0123456789")  # a 10 MB response that can never leave
        stalled.call(3, "Echo", b"x" * 1000)
        for i in range(3):
            assert call(channel, "Echo", b"%d" % i) == b"%d" % i
        garbage.settimeout(TIMEOUT_S)
        assert read_to_the_end(garbage) is not None  # the server closed it
    finally:
        garbage.close()
        stalled.close()
    assert call(channel, "Echo", b"after") == b"after"


def test_a_ping_flood_is_answered_with_goaway(
    served: tuple[grpcio_server.GrpcioServer, Path], channel: grpc.Channel
) -> None:
    flood = H2Client(served[1], {})
    try:
        for i in range(grpcio_server.MAX_PING_STRIKES + 3):
            flood.conn.ping(b"%08d" % i)
        flood.flush()
        goaway = flood.until(lambda e: isinstance(e, h2.events.ConnectionTerminated))
        assert isinstance(goaway, h2.events.ConnectionTerminated)
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
        assert goaway.additional_data == b"too_many_pings"
    finally:
        flood.close()
    assert call(channel, "Echo", b"still here") == b"still here"


# Serves Echo with RLIMIT_NOFILE lowered, then prints READY; the test connects until the server
# runs out of descriptors, closes those connections and calls Echo again.
AT_THE_LIMIT = """
import resource
import sys
import threading

from dra_gpu.kubeletplugin import grpcio_server
from dra_gpu.kubeletplugin.rpc_methods import Method

limits = grpcio_server.Limits(concurrent_rpcs=4, streams_per_connection=4)
server = grpcio_server.GrpcioServer(
    [Method("/test.Svc/Echo", bytes, lambda r, c: r, bytes)],
    health=grpcio_server.health_servicer(),
    limits=limits,
)
server.add_address("unix:" + sys.argv[1])
server.start()
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]),) * 2)
print("READY", flush=True)
sys.stdin.read()  # until the test closes it
server.stop(0)
"""


NOFILE_LIMIT = 64


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_server_accepts_again_after_the_open_file_limit(tmp_path: Path) -> None:
    path = tmp_path / "rpc.sock"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", AT_THE_LIMIT, str(path), str(NOFILE_LIMIT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "READY"
        held: list[socket.socket] = []
        # Each connection the server accepts takes one of its descriptors; the kernel queues
        # the rest. Connect until the server's table is full and some wait unaccepted.
        for _ in range(200):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(path))
            held.append(conn)
        waiting.wait_for(
            "the server's descriptor table to fill",
            lambda: open_fds(proc.pid) >= NOFILE_LIMIT,
            timeout=TIMEOUT_S,
            every=0.05,
        )
        # no descriptor left for this connection
        with own_channel(path) as ch, pytest.raises(grpc.RpcError):
            ch.unary_unary("/test.Svc/Echo", _same, _same)(b"full", timeout=1)
        for conn in held:
            conn.close()
        with own_channel(path) as ch:
            echo = ch.unary_unary("/test.Svc/Echo", _same, _same)
            assert echo(b"again", timeout=TIMEOUT_S, wait_for_ready=True) == b"again"
    finally:
        proc.stdin.close()
        proc.wait(TIMEOUT_S)


# --- the /healthz probe


def serve_both(tmp_path: Path) -> tuple[list[grpcio_server.GrpcioServer], Path, Path]:
    health = grpcio_server.health_servicer()
    dra, reg = tmp_path / "dra.sock", tmp_path / "reg.sock"
    service = registration.Registration(
        driver_name="gpu.example.com", dra_endpoint=dra, on_registered=lambda: None
    )
    servers = []
    for path, methods in ((dra, []), (reg, service.methods())):
        server = grpcio_server.GrpcioServer(methods, health=health, limits=LIMITS)
        server.add_address(f"unix:{path}")
        server.start()
        servers.append(server)
    return servers, dra, reg


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode().strip()
    finally:
        conn.close()


@pytest.fixture
def probes_served(tmp_path: Path) -> Iterator[tuple[list[grpcio_server.GrpcioServer], Path, Path]]:
    servers, dra, reg = serve_both(tmp_path)
    yield servers, dra, reg
    for server in servers:
        server.stop(0)


@pytest.mark.parametrize("stopped", [0, 1], ids=["dra", "registration"])
def test_healthz_is_503_naming_the_socket_whose_server_is_gone(
    probes_served: tuple[list[grpcio_server.GrpcioServer], Path, Path], stopped: int
) -> None:
    servers, dra, reg = probes_served
    probes = grpc_probe.SocketProbes(dra=dra, registration_socket=reg)
    server = healthz.HealthzServer(
        address="127.0.0.1", port=0, live=probes.problem, ready=probes.problem
    )
    server.start()
    try:
        assert get(server.port, "/healthz") == (200, "ok")
        servers[stopped].stop(0)
        status, reason = get(server.port, "/healthz")
        assert status == 503
        named = f"the DRA socket {dra}" if stopped == 0 else f"the registration socket {reg}"
        assert reason.startswith(named), reason
    finally:
        server.stop()
        probes.close()


def test_a_socket_that_never_answers_fails_the_probe_within_its_deadline(
    probes_served: tuple[list[grpcio_server.GrpcioServer], Path, Path], tmp_path: Path
) -> None:
    _, dra, _ = probes_served
    # A listener that never accepts: the connection is made, no byte ever comes back.
    hung_path = tmp_path / "hung.sock"
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(str(hung_path))
    hung.listen()
    probes = grpc_probe.SocketProbes(dra=dra, registration_socket=hung_path)
    try:
        reason = probes.problem()
        assert reason is not None
        assert reason.startswith(f"the registration socket {hung_path} did not answer GetInfo")
        assert "DEADLINE_EXCEEDED" in reason
    finally:
        probes.close()
        hung.close()


def test_streams_cannot_hold_every_thread_and_calls_beyond_the_threads_wait(
    tmp_path: Path, handlers: Handlers
) -> None:
    # Two threads, one of which may serve a stream: a second stream is refused, and the calls
    # beyond the one thread left wait for it instead of being refused (the slots are not full).
    limits = grpcio_server.Limits(concurrent_rpcs=8, streams_per_connection=8, workers=2, streams=1)
    path = tmp_path / "rpc.sock"
    server = grpcio_server.GrpcioServer(
        handlers.methods(), health=grpcio_server.health_servicer(), limits=limits
    )
    server.add_address(f"unix:{path}")
    server.start()
    try:
        with own_channel(path) as ch:
            ticks = ch.unary_stream(
                "/test.Svc/Ticks", request_serializer=None, response_deserializer=None
            )
            first = ticks(b"", timeout=TIMEOUT_S)
            assert next(iter(first)) == b"tick 0"
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(ticks(b"", timeout=TIMEOUT_S)))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "too many streams" in (refused.value.details() or "")
            waiting = [unary(ch, "Blocked").future(b"%d" % i, timeout=TIMEOUT_S) for i in range(3)]
            assert handlers.wait_entered(1)  # one thread for three calls: they take turns
            handlers.release.set()
            assert sorted(f.result() for f in waiting) == [b"released %d" % i for i in range(3)]
            first.cancel()
            assert handlers.stream_closed.wait(TIMEOUT_S)
    finally:
        handlers.release.set()
        server.stop(grace=0)
