"""The kubelet plugin registration service (``pluginregistration.Registration``).

The kubelet finds the registration socket in its registry directory, calls ``GetInfo`` and
picks the first of ``supported_versions`` that it knows, so ``v1.DRAPlugin`` comes first and
``v1beta1.DRAPlugin`` second (kubelets 1.32/1.33). The health service versions are listed too:
the kubelet looks for them in the same list to decide whether to open a health stream.

A refused registration (``plugin_registered`` false) means no pod on this node can get our
devices, so it is logged as an ERROR with the kubelet's reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from dra_gpu.kubeletplugin.rpc_methods import CallContext, Method, serialize_message
from dra_gpu.pb import pluginregistration_v1_pb2 as pb

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
SUPPORTED_VERSIONS = DRA_VERSIONS + HEALTH_VERSIONS


SERVICE = "pluginregistration.Registration"


class Registration:
    def __init__(
        self, *, driver_name: str, dra_endpoint: Path, on_registered: Callable[[], None]
    ) -> None:
        if not dra_endpoint.is_absolute():
            raise ValueError(f"the DRA endpoint must be an absolute path, got {dra_endpoint}")
        self._info = pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=driver_name,
            endpoint=str(dra_endpoint),
            supported_versions=list(SUPPORTED_VERSIONS),
        )
        self._on_registered = on_registered

    def methods(self) -> list[Method]:
        return [
            Method(
                f"/{SERVICE}/GetInfo", pb.InfoRequest.FromString, self.get_info, serialize_message
            ),
            Method(
                f"/{SERVICE}/NotifyRegistrationStatus",
                pb.RegistrationStatus.FromString,
                self.notify_registration_status,
                serialize_message,
            ),
        ]

    def get_info(self, request: pb.InfoRequest, context: CallContext) -> pb.PluginInfo:
        log.debug("kubelet asked for plugin info")
        return self._info

    def notify_registration_status(
        self, request: pb.RegistrationStatus, context: CallContext
    ) -> pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as %s", self._info.name)
            self._on_registered()
        else:
            log.error(
                "the kubelet REFUSED to register plugin %s: %s",
                self._info.name,
                request.error or "(no reason given)",
            )
        return pb.RegistrationStatusResponse()
