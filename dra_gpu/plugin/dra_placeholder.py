"""Stand-in DRA services for a build without the prepare state machine.

Used only when ``dra_gpu.plugin.dra_service`` is missing. Every claim gets a per-claim error, so
the kubelet reports a clear ``FailedPrepareDynamicResources`` event instead of a transport
failure, and a call with zero claims succeeds (which is what a kubelet's probe call sends).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import grpc

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

MESSAGE = "not implemented yet: this build of the plugin cannot prepare devices"


def _servicer(pb: ModuleType, base: type) -> Any:
    class Placeholder(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            resp = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                resp.claims[claim.uid].error = MESSAGE
            return resp

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            resp = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                resp.claims[claim.uid].error = MESSAGE
            return resp

    return Placeholder()


def register(server: grpc.Server) -> None:
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer), server
    )
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer), server
    )
