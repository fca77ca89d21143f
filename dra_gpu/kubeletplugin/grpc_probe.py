"""Whether the plugin's two sockets answer: a real call on each, for ``/healthz``.

A flag set at start-up says the servers were started, not that they still answer. So each
probe makes a call through the whole path the kubelet uses (socket, HTTP/2, a worker thread, a
handler): a grpc.health.v1 ``Check`` on the DRA socket and a ``Registration.GetInfo`` on the
registration socket, each with a short deadline. A call that fails or does not finish in time
is the reason /healthz reports.

One channel per socket, kept for the life of the plugin, so a probe costs one call and no new
connection; no lock is held, grpcio's channels are safe to call from several probes at once.
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2

from dra_gpu.kubeletplugin import registration
from dra_gpu.pb import pluginregistration_v1_pb2 as reg_pb

# The kubelet's liveness probe has a timeout of its own (1 s by default); both calls together
# stay below it, and a healthy server answers in well under a millisecond.
PROBE_DEADLINE_S = 0.4
# After a failed call the channel reconnects at most this long later, not after grpcio's
# default backoff of up to two minutes: a socket that answers again is healthy at the next probe.
_RECONNECT_BACKOFF_MS = 500
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS),
    ("grpc.min_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", _RECONNECT_BACKOFF_MS),
]


class SocketProbes:
    """Probes the DRA socket and the registration socket; :meth:`problem` makes one call on each."""

    def __init__(
        self, *, dra: Path, registration_socket: Path, deadline_s: float = PROBE_DEADLINE_S
    ) -> None:
        self._dra_path = dra
        self._reg_path = registration_socket
        self._deadline_s = deadline_s
        self._dra = grpc.insecure_channel(f"unix:{dra}", options=_CHANNEL_OPTIONS)
        self._reg = grpc.insecure_channel(f"unix:{registration_socket}", options=_CHANNEL_OPTIONS)
        self._check = self._dra.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        self._get_info = self._reg.unary_unary(
            f"/{registration.SERVICE}/GetInfo",
            request_serializer=reg_pb.InfoRequest.SerializeToString,
            response_deserializer=reg_pb.PluginInfo.FromString,
        )

    def problem(self) -> str | None:
        """Why a socket does not answer (the first that does not), or None when both answer."""
        try:
            self._check(health_pb2.HealthCheckRequest(), timeout=self._deadline_s)
        except grpc.RpcError as err:
            return f"the DRA socket {self._dra_path} did not answer a health check: {_why(err)}"
        try:
            self._get_info(reg_pb.InfoRequest(), timeout=self._deadline_s)
        except grpc.RpcError as err:
            return f"the registration socket {self._reg_path} did not answer GetInfo: {_why(err)}"
        return None

    def close(self) -> None:
        self._dra.close()
        self._reg.close()


def _why(err: grpc.RpcError) -> str:
    if isinstance(err, grpc.Call):
        return f"{err.code().name}: {err.details()}"
    return str(err)
