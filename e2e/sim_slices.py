"""The ResourceSlices a kubelet plugin on simulated GPUs publishes, without running it.

Same builders as the plugin (device model, slice builder), so tests and benchmarks that only
need the published objects (explain, allocation by the real scheduler) skip the process.
"""

from __future__ import annotations

from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.devices import naming, simulated
from dra_gpu.kubeletplugin import slices


def node_slices(
    node: str, profile: str, *, owner_uid: str | None = None, generation: int = 1
) -> list[dict[str, Any]]:
    """Slices of ``node`` with a built-in ``profile``; owned by the Node when its UID is given."""
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=node
    )
    return slices.build_resource_slices(
        devices=naming.build_devices(backend.discover().gpus),
        driver_name=DRIVER_NAME,
        node_name=node,
        pool_generation=generation,
        node_owner=(node, owner_uid) if owner_uid else None,
    )
