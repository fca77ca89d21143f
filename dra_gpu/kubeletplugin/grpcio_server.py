"""A method table (``rpc_methods``) served by grpcio: ``--grpc-server grpcio``.

The fallback to the builtin server (``rpcserver``); importing this module loads grpc, so only
a plugin configured for it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc

from dra_gpu.kubeletplugin.rpc_methods import Abort, Method


class GrpcioServer:
    """The same interface as ``rpcserver.Server``."""

    def __init__(self, methods: Iterable[Method], *, max_workers: int = 16, name: str = "rpc"):
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        )
        services: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
        for method in methods:
            services.setdefault(method.service, {})[method.name] = _handler(method)
        self._server.add_generic_rpc_handlers(
            tuple(grpc.method_handlers_generic_handler(s, h) for s, h in services.items())
        )

    def add_address(self, address: str) -> None:
        self._server.add_insecure_port(address)

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float) -> None:
        self._server.stop(grace=grace).wait()


def _handler(method: Method) -> grpc.RpcMethodHandler[Any, Any]:
    if method.streaming:

        def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from method.handle(request, context)
            except Abort as err:
                context.abort(grpc.StatusCode[err.code.name], err.message)

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
