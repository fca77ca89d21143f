"""Dynamic MIG before the pod binds (KEP-5007 binding conditions, docs/dynamic-mig.md).

Cases:
- published: where binding conditions are served, every dynamic MIG device carries the
  ``mig-created`` binding condition and the ``mig-failed`` failure condition; the full GPUs and a
  static node's devices carry none; where not served, no device does;
"""

from __future__ import annotations

import pytest
from test_dynamic_mig import dynamic_devices

from dra_gpu.devices import naming, simulated
from dra_gpu.kubeletplugin import slices
from dra_gpu.plugin import published

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def _devices_of(objs: list[published.JSON]) -> list[published.JSON]:
    return [d for s in objs for d in s["spec"].get("devices", [])]


def test_dynamic_mig_devices_carry_binding_conditions_where_served() -> None:
    devices = dynamic_devices("a100x4-mig")
    conditions = published.mig_binding_conditions(DRIVER)
    objs = published.node_slices(
        devices, driver_name=DRIVER, node_name=NODE, node_uid=None, binding=conditions
    )
    listed = _devices_of(objs)
    partitions = [d for d in listed if "consumesCounters" in d]
    assert partitions and len(partitions) == sum(1 for d in devices if d.partition is not None)
    for d in partitions:
        assert d["bindingConditions"] == ["gpu.nvidia.com/mig-created"]
        assert d["bindingFailureConditions"] == ["gpu.nvidia.com/mig-failed"]
    others = [d for d in listed if "consumesCounters" not in d]
    assert all("bindingConditions" not in d for d in others)
    unserved = published.node_slices(devices, driver_name=DRIVER, node_name=NODE, node_uid=None)
    assert all("bindingConditions" not in d for d in _devices_of(unserved))


def test_a_static_node_carries_no_binding_conditions() -> None:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["a100x4-mig"], node_name=NODE
    )
    devices = naming.build_devices(backend.discover().gpus)
    objs = published.node_slices(
        devices,
        driver_name=DRIVER,
        node_name=NODE,
        node_uid=None,
        binding=published.mig_binding_conditions(DRIVER),
    )
    assert all("bindingConditions" not in d for d in _devices_of(objs))


def test_binding_conditions_within_the_api_limit() -> None:
    devices = dynamic_devices("a100x4-mig")
    name = next(d.name for d in devices if d.partition is not None)
    too_many = slices.BindingConditions(ready=tuple(f"c{i}" for i in range(5)), failed=("f",))
    with pytest.raises(ValueError, match="binding conditions"):
        slices.build_resource_slices(
            devices=devices,
            driver_name=DRIVER,
            node_name=NODE,
            pool_generation=1,
            node_owner=None,
            binding={name: too_many},
        )
