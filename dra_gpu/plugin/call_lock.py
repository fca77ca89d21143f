"""One DRA call at a time on a node, across every instance of the plugin (rolling update).

During a rolling update two plugin instances serve the same node; the kubelet may send
prepare to one and unprepare to the other. A ``flock`` on a file in the plugin data directory,
which both instances share, serializes those calls (:func:`held`, i.e.
:func:`dra_gpu.plugin.atomicfile.locked`, which also serializes threads of one process).

The lock is applied by a server interceptor to every method of the DRA services, so the DRA
adapter itself needs no knowledge of it. Start-up recovery holds it too (``node_plugin``): a new
instance must not mistake the other instance's call in progress for a crash's leftovers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from dra_gpu.plugin.atomicfile import locked as held

__all__ = ["DRA_SERVICE_PREFIX", "SerializeDraCalls", "held"]

DRA_SERVICE_PREFIX = "/k8s.io.kubelet.pkg.apis.dra."


class SerializeDraCalls(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps the unary DRA methods so each runs while holding the node-wide lock."""

    def __init__(self, lock_path: Path) -> None:
        self._lock_path = lock_path

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith(DRA_SERVICE_PREFIX):
            return handler
        inner = handler.unary_unary
        if inner is None:
            return handler
        lock_path = self._lock_path

        def locked(request: Any, context: grpc.ServicerContext) -> Any:
            with held(lock_path):
                return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            locked,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
