"""The GPU driver's kubelet plugin: the kit (``kubeletplugin.kit``) told this node's devices.

:class:`NodePlugin` is the kit with the settings of ``dra-gpu kubelet-plugin`` and the GPU
devices: their slices rendered by ``published.node_slices``, their taints from the health
monitor. What starts in which order, and how it stops: ``kubeletplugin.kit``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection, Mapping, Sequence

from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin import kit, publisher, slice_plan, slices, sockets
from dra_gpu.plugin import published
from dra_gpu.plugin.settings import Settings, instance_socket_paths


def renderer(
    settings: Settings,
    devices: Sequence[Device],
    taints: Mapping[str, Sequence[publisher.JSON]] | None = None,
    binding: slices.BindingConditions | None = None,
) -> publisher.Renderer:
    """``taints``: device name -> its taints (``device_taints.device_taints``); ``binding``:
    the dynamic MIG devices' binding conditions (None: not served, or MIG is not dynamic)."""
    frozen = tuple(devices)
    frozen_taints = dict(taints or {})

    def render(node_uid: str) -> list[publisher.JSON]:
        return published.node_slices(
            frozen,
            driver_name=settings.driver_name,
            node_name=settings.node_name,
            node_uid=node_uid,
            taints=frozen_taints,
            shares=settings.consumable_shares,
            binding=binding,
        )

    return render


def this_instance(settings: Settings) -> slice_plan.Instance:
    """This process as a publisher: its start time, and its pod UID (else host and PID)."""
    name = settings.pod_uid or f"{socket.gethostname()}-{os.getpid()}"
    return slice_plan.Instance(started_ns=time.time_ns(), name=name)


def options(settings: Settings) -> kit.Options:
    """What the kit needs of the plugin's settings."""

    def paths(pod_uid: str | None) -> sockets.SocketPaths:
        return instance_socket_paths(settings, pod_uid)

    return kit.Options(
        driver_name=settings.driver_name,
        node_name=settings.node_name,
        pod_uid=settings.pod_uid,
        data_dir=settings.plugin_data_dir,
        paths=paths,
        healthz_address=settings.healthz_address,
        healthz_port=settings.healthz_port,
    )


class NodePlugin(kit.Kit):
    def __init__(
        self,
        settings: Settings,
        *,
        store: publisher.SliceStore,
        devices: Sequence[Device],
        instance: slice_plan.Instance,
        binding: slices.BindingConditions | None = None,
    ) -> None:
        self._settings = settings
        self._binding = binding
        super().__init__(
            options(settings),
            store=store,
            render=renderer(settings, devices, binding=binding),
            device_names=[d.name for d in devices],
            instance=instance,
        )

    def set_devices(
        self,
        devices: Sequence[Device],
        *,
        in_use: Collection[str] | None,
        taints: Mapping[str, Sequence[publisher.JSON]] | None = None,
        faults: Mapping[str, str] | None = None,
    ) -> None:
        """A new inventory, or new faults (``health_monitor`` calls this whenever either
        changes): ``taints`` and ``faults`` by device name; ``in_use`` as in ``set_inventory``."""
        self.set_inventory(
            renderer(self._settings, devices, taints, self._binding),
            [d.name for d in devices],
            in_use=in_use,
            faults=faults,
        )
