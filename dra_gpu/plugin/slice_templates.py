"""A node's ResourceSlices as an autoscaler's templates (pure; used by ``dra-gpu discover``).

Karpenter learns the DRA devices of an instance type it has not launched yet from its cloud
provider: ``cloudprovider.DynamicResources`` with one ``ResourceSliceTemplate`` per driver pool
(``pkg/cloudprovider/dynamicresources.go`` of kubernetes-sigs/karpenter, described in its
``designs/dra/cloudprovider.md``). That type lives in Go memory only; no CRD or file format
carries it. The closest serialised shape Karpenter documents is the NodeOverlay DRA proposal
(``designs/node-overlay-dra.md``): ``dynamicResources.resourceSliceTemplates[]``, each a
``metadata.name`` and a ``spec`` with ``driver`` and ``devices`` in the ``resource.k8s.io/v1``
field names. :func:`karpenter_templates` prints that shape, with:

- ``spec.pool`` kept (the Go type has ``Pool``; the proposal leaves it out as irrelevant);
- what the node's slices carry beyond the proposal's schema kept under the API's own names
  (``sharedCounters``, ``consumesCounters``, ``allowMultipleAllocations``), as Karpenter's
  partitionable-devices design puts counter sets inline on the template: without them a
  prediction for dynamic MIG or consumable shares would promise more than the node holds;
- the attributes Karpenter's guide says to leave out dropped: the ones unique to one physical
  GPU (``uuid``, ``parentUUID``, the PCI bus ID), which no other node of the type will have.
  Taints are left out too (a new node starts without any).

Everything else (device names, the other attributes, capacities, counters) is the slices' own,
so a claim that fits the template fits the node the autoscaler gets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gpu.devices.model import ATTR_PARENT_UUID, ATTR_PCI_BUS_ID, ATTR_UUID

JSON = dict[str, Any]

# Unique to one physical GPU: never the same on another node of the same instance type.
RUNTIME_ONLY_ATTRIBUTES: frozenset[str] = frozenset((ATTR_UUID, ATTR_PARENT_UUID, ATTR_PCI_BUS_ID))
# Karpenter's NodeOverlay proposal, designs/node-overlay-dra.md (kubernetes-sigs/karpenter).
SHAPE = "Karpenter DynamicResources (NodeOverlay DRA proposal, designs/node-overlay-dra.md)"
_DEVICE_FIELDS = ("name", "attributes", "capacity", "consumesCounters", "allowMultipleAllocations")


def _device(device: Mapping[str, Any]) -> JSON:
    out: JSON = {}
    for key in _DEVICE_FIELDS:
        if key not in device:
            continue
        value = device[key]
        if key == "attributes":
            value = {k: v for k, v in value.items() if k not in RUNTIME_ONLY_ATTRIBUTES}
        out[key] = value
    return out


def karpenter_templates(resource_slices: Sequence[Mapping[str, Any]]) -> JSON:
    """``{"dynamicResources": {"resourceSliceTemplates": [...]}}``: one template per slice."""
    templates: list[JSON] = []
    for obj in resource_slices:
        spec = obj["spec"]
        template_spec: JSON = {"driver": spec["driver"], "pool": {"name": spec["pool"]["name"]}}
        if spec.get("sharedCounters"):
            template_spec["sharedCounters"] = spec["sharedCounters"]
        if "devices" in spec:  # a slice of the pool's counter sets has none
            template_spec["devices"] = [_device(d) for d in spec["devices"]]
        templates.append({"metadata": {"name": obj["metadata"]["name"]}, "spec": template_spec})
    return {"dynamicResources": {"resourceSliceTemplates": templates}}
