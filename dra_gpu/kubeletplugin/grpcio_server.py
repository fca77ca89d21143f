"""The plugin's gRPC servers: method tables (``rpc_methods``) and grpc.health.v1, on grpcio.

The only module of the kit that serves gRPC (``grpc_probe`` is the only one that calls it): the
services stay method tables that import no transport, so they are tested without sockets, and
the generated ``*_pb2_grpc`` modules are not needed to serve them.

Every server gets the same protection against a client that misbehaves (the sockets are the
kubelet's, owner-only, but a stuck or buggy client must not take the plugin down with it):
- at most ``Limits.concurrent_rpcs`` calls at once; a call beyond them is refused with
  RESOURCE_EXHAUSTED instead of waiting in a queue without end. They run on at most
  ``Limits.workers`` threads (calls beyond wait for one: every handler returns, except a
  stream), and at most ``Limits.streams`` of those threads serve streams (a health stream lasts
  as long as its client): a stream beyond is refused with RESOURCE_EXHAUSTED, so streams can
  never hold every thread;
- at most ``Limits.streams_per_connection`` calls open on one connection, so one client cannot
  take every slot (its further calls wait on its own side, as HTTP/2 says);
- message size limits both ways, and a keepalive policy that closes a connection that pings
  more often than a healthy client would (``MIN_PING_INTERVAL_MS``);
- a limit on a call's headers (``MAX_HEADER_BYTES``).
grpcio's C core does the rest: it accepts connections on its own event loop (a failed accept,
e.g. at the open-file limit, is tried again), holds no thread for a connection that sends
nothing, sends garbage or never reads, and honours the caller's deadline (``grpc-timeout``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dra_gpu.kubeletplugin.rpc_methods import Abort, Method

# A request names claims (uid, namespace, name: under 400 bytes each), so even thousands of
# claims in one NodePrepareResources stay far below this; a larger request is no kubelet's and
# is refused with RESOURCE_EXHAUSTED before it is parsed.
MAX_RECEIVE_MESSAGE_BYTES = 1 << 20
# A response lists each claim's devices (at most 32 per claim, ~200 bytes each with their CDI
# IDs) and a health stream message every device of the node; both stay far below this. It only
# stops a bug from sending without bound (grpcio's own default has no limit).
MAX_SEND_MESSAGE_BYTES = 4 << 20
# The kubelet's DRA client sends no keepalive pings, and a unix socket needs none to notice a
# dead peer; a client that pings more often than once a minute while no call sends data, or at
# all while it has no call open, gets a strike, and after MAX_PING_STRIKES a GOAWAY (the
# ping-flood defence of HTTP/2 servers).
MIN_PING_INTERVAL_MS = 60_000
MAX_PING_STRIKES = 2
# A kubelet's call carries a few hundred bytes of headers. Without a limit of its own grpcio
# takes far larger header blocks, however many CONTINUATION frames carry them; beyond this a
# call is refused with RESOURCE_EXHAUSTED.
MAX_HEADER_BYTES = 16 << 10


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much of the plugin one server's clients may use at once."""

    concurrent_rpcs: int  # calls in progress or waiting for a thread
    streams_per_connection: int  # calls one connection may have open
    # Threads serving calls, started when needed (None: one per call in progress), and how many
    # of them may serve streams at once (None: all of them).
    workers: int | None = None
    streams: int | None = None

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_concurrent_streams", self.streams_per_connection),
            ("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_SEND_MESSAGE_BYTES),
            ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
            ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.max_metadata_size", MAX_HEADER_BYTES),
            ("grpc.absolute_max_metadata_size", MAX_HEADER_BYTES),
        ]


def health_servicer() -> health.HealthServicer:
    """grpc.health.v1 for the whole plugin (service ""), NOT_SERVING until told otherwise.

    One servicer may be added to several servers: they then answer the same status. Watch is
    served without a thread (grpcio's non-blocking stream), so watchers take no call slot.
    """
    servicer = health.HealthServicer()
    servicer.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING)
    return servicer


def set_serving(servicer: health.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse
    servicer.set(health.OVERALL_HEALTH, status.SERVING if serving else status.NOT_SERVING)


class GrpcioServer:
    """``methods`` and ``health`` on the unix sockets given to :meth:`add_address`."""

    def __init__(
        self,
        methods: Iterable[Method],
        *,
        health: health.HealthServicer,
        limits: Limits,
        name: str = "rpc",
    ) -> None:
        pool = futures.ThreadPoolExecutor(
            max_workers=limits.workers or limits.concurrent_rpcs, thread_name_prefix=name
        )
        slots = threading.BoundedSemaphore(limits.streams) if limits.streams else None
        self._server = grpc.server(
            pool,
            options=limits.server_options(),
            maximum_concurrent_rpcs=limits.concurrent_rpcs,
        )
        services: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
        for method in methods:
            services.setdefault(method.service, {})[method.name] = _handler(method, slots)
        self._server.add_generic_rpc_handlers(
            tuple(grpc.method_handlers_generic_handler(s, h) for s, h in services.items())
        )
        health_pb2_grpc.add_HealthServicer_to_server(health, self._server)

    def add_address(self, address: str) -> None:
        """Listen on ``unix:PATH`` (bound at once, served once started)."""
        self._server.add_insecure_port(address)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float) -> None:
        """Refuse new calls, give those in flight ``grace`` seconds, then close; blocks."""
        self._server.stop(grace=grace).wait()


def _handler(
    method: Method, slots: threading.BoundedSemaphore | None
) -> grpc.RpcMethodHandler[Any, Any]:
    if method.streaming:

        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            if slots is not None and not slots.acquire(blocking=False):
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "too many streams open on this socket"
                )
            try:
                yield from method.handle(request, context)
            except Abort as err:
                context.abort(grpc.StatusCode[err.code.name], err.message)
            finally:
                if slots is not None:
                    slots.release()

        return grpc.unary_stream_rpc_method_handler(
            stream, request_deserializer=method.parse, response_serializer=method.serialize
        )

    def unary(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method.handle(request, context)
        except Abort as err:
            context.abort(grpc.StatusCode[err.code.name], err.message)

    return grpc.unary_unary_rpc_method_handler(
        unary, request_deserializer=method.parse, response_serializer=method.serialize
    )
