"""The standard gRPC health service (``grpc.health.v1.Health/Check``) without generated code.

Its two messages have one field each (``HealthCheckRequest.service = 1: string``,
``HealthCheckResponse.status = 1: enum``), so they are encoded here by hand instead of adding a
proto and a dependency. Only ``Check`` is served; ``Watch`` answers UNIMPLEMENTED, which the
protocol allows. ``grpc_health_probe`` and Kubernetes' gRPC probes use ``Check``.

The empty service name is the whole plugin; any other name is answered NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_gpu.kubeletplugin.rpc_methods import Abort, CallContext, Code, Method

SERVICE = "grpc.health.v1.Health"
SERVING = 1
NOT_SERVING = 2


def decode_service(data: bytes) -> str:
    """``HealthCheckRequest.service`` from its wire bytes ("" when absent or malformed)."""
    i = 0
    while i < len(data):
        tag, i = _varint(data, i)
        wire_type = tag & 7
        if wire_type == 0:
            _, i = _varint(data, i)
        elif wire_type == 2:
            length, i = _varint(data, i)
            if tag >> 3 == 1:
                return data[i : i + length].decode(errors="replace")
            i += length
        else:
            return ""  # fixed-width fields never occur in this message
    return ""


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while i < len(data):
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
    return value, len(data)


def encode_status(status: int) -> bytes:
    """``HealthCheckResponse{status}``; proto3 omits a zero value."""
    return b"" if status == 0 else bytes([0x08, status])


def methods(is_serving: Callable[[], bool]) -> list[Method]:
    def check(service: str, context: CallContext) -> int:
        if service:
            raise Abort(Code.NOT_FOUND, f"unknown service {service!r}")
        return SERVING if is_serving() else NOT_SERVING

    return [Method(f"/{SERVICE}/Check", decode_service, check, encode_status)]
