"""The ResourceSlices this node publishes for its GPUs: the one writer of their bodies.

Both the plugin's publisher (through ``node_plugin.renderer``) and ``dra-gpu discover -o
json|yaml`` take the slices from :func:`node_slices`, so what ``discover`` prints is what the
plugin publishes on that node (the publisher adds only its bookkeeping: the pool generation of
each write, its annotations, the Node's UID as owner). Pure; no API client here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.devices import shares as device_shares
from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin import slices

JSON = dict[str, Any]
FIRST_GENERATION = 1  # the pool generation of a node's first publish
MIG_CREATED = "mig-created"
MIG_FAILED = "mig-failed"


def mig_binding_conditions(driver_name: str) -> slices.BindingConditions:
    """What a dynamic MIG device reports before its pod binds (docs/concepts/dynamic-mig.md):
    the MIG device was created for the allocation, or it could not be (nothing of it is left)."""
    return slices.BindingConditions(
        ready=(f"{driver_name}/{MIG_CREATED}",), failed=(f"{driver_name}/{MIG_FAILED}",)
    )


def binding_of(
    devices: Sequence[Device], conditions: slices.BindingConditions | None
) -> dict[str, slices.BindingConditions]:
    """Device name -> its binding conditions: every dynamic MIG partition (a MIG device made
    for its allocation), none of the others; none at all without ``conditions``."""
    if conditions is None:
        return {}
    return {d.name: conditions for d in devices if d.partition is not None}


def node_slices(
    devices: Sequence[Device],
    *,
    driver_name: str,
    node_name: str,
    node_uid: str | None,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    pool_generation: int = 0,
    shares: device_shares.ShareMode | None = None,
    binding: slices.BindingConditions | None = None,
) -> list[JSON]:
    """``node_uid``: the Node as the slices' owner (None: no owner, for printing).
    ``taints``: device name -> its taints (``device_taints.device_taints``). The publisher
    sets ``pool_generation`` itself; ``discover`` prints :data:`FIRST_GENERATION`.
    ``shares``: the node's share mode (``--consumable-shares``); None: each device is allocated
    to one claim at a time. ``binding``: the dynamic MIG devices' binding conditions (None: the
    API server does not serve them, or MIG is not dynamic)."""
    published: Sequence[slices.SliceDevice] = (
        devices if shares is None else device_shares.shared(devices, shares)
    )
    return slices.build_resource_slices(
        devices=published,
        driver_name=driver_name,
        node_name=node_name,
        pool_generation=pool_generation,
        node_owner=None if node_uid is None else (node_name, node_uid),
        taints=taints,
        binding=binding_of(devices, binding),
    )
