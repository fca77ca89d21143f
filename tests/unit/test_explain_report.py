"""``dra-gpu explain`` without a cluster: Kubernetes CEL functions, per-node counts, the first
failing selector with its values, CEL errors, constraints, and the suggestion that ends it."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
import yaml

from dra_gpu import DRIVER_NAME
from dra_gpu.controller import classes
from dra_gpu.explain import analysis, command, render
from dra_gpu.explain.cel import CelError, DeviceView, Selector
from dra_gpu.kube.objects import DeviceClassSpec, ResourceClaim, ResourceSlice
from e2e.sim_slices import node_slices

A = f"device.attributes['{DRIVER_NAME}']"
H200 = DeviceView(
    DRIVER_NAME,
    {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H200"},
        "driverVersion": {"version": "580.159.4"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    },
    {"memory": {"value": "143771Mi"}},
)
# The controller's and the kit's plain dicts, typed as the API objects they become.
CLASSES = {
    c.name: cast(DeviceClassSpec, c.spec)
    for c in classes.builtin_classes(extended_resource_name=None)
}


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        (f"device.driver == '{DRIVER_NAME}' && {A}.type == 'gpu'", True),
        (f"device.capacity['{DRIVER_NAME}'].memory.compareTo(quantity('140Gi')) >= 0", True),
        (f"device.capacity['{DRIVER_NAME}'].memory.isGreaterThan(quantity('150Gi'))", False),
        (f"{A}.driverVersion.isGreaterThan(semver('570.0.0'))", True),
        (f"{A}.driverVersion.isLessThan(semver('580.100.0'))", False),
        ("device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:18')", True),
        (f"'{DRIVER_NAME}' in device.attributes", True),
    ],
)
def test_selectors_use_kubernetes_cel_semantics(expression: str, matches: bool) -> None:
    verdict = Selector(expression).check(H200)
    assert (verdict.matches, verdict.error) == (matches, None)


def test_missing_attribute_is_a_cel_error_not_a_mismatch() -> None:
    verdict = Selector(f"{A}.productname == 'NVIDIA H200'").check(H200)
    assert not verdict.matches and verdict.error and "productname" in verdict.error


def test_syntax_error_is_reported_at_compile_time() -> None:
    with pytest.raises(CelError, match="does not compile"):
        Selector(f"{A}.type == ")


def test_same_values_are_evaluated_once() -> None:
    selector = Selector(f"{A}.productName == 'NVIDIA H200'")
    assert selector.references == (("attributes", DRIVER_NAME, "productName"),)
    other = DeviceView(DRIVER_NAME, {**H200.attributes, "uuid": {"string": "GPU-2"}}, {})
    assert selector.check(H200).matches and selector.check(other).matches
    assert len(selector._memo) == 1


SLICES = cast("list[ResourceSlice]", node_slices("h200", "h200x8") + node_slices("h100", "h100x8"))
BUSY: ResourceClaim = {
    "metadata": {"namespace": "ns", "name": "busy", "uid": "b"},
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {"driver": DRIVER_NAME, "pool": "h200", "device": f"gpu-{i}", "request": "g"}
                    for i in range(6)
                ]
            }
        }
    },
}


def explain(requests: list[dict[str, Any]], constraints: Any = ()) -> analysis.Report:
    claim = {
        "metadata": {"namespace": "ns", "name": "c", "uid": "c"},
        "spec": {"devices": {"requests": requests, "constraints": list(constraints)}},
    }
    # Test literals, malformed ones included: typed as what the API server would send.
    return analysis.explain_claim(
        cast(ResourceClaim, claim), classes=CLASSES, slices=SLICES, claims=[BUSY]
    )


def gpus(count: int, *selectors: str, name: str = "g") -> dict[str, Any]:
    spec = {
        "deviceClassName": "gpu.nvidia.com",
        "count": count,
        "selectors": [{"cel": {"expression": e}} for e in selectors],
    }
    return {"name": name, "exactly": spec}


def test_counts_per_node_exclude_devices_of_other_claims() -> None:
    report = explain([gpus(4, f"{A}.productName == 'NVIDIA H200'")])
    assert report.fits == []
    counts = {
        c.node: (c.devices, c.stages, c.allocated, c.available) for c in report.requests[0].nodes
    }
    assert counts == {"h200": (8, [8, 8], 6, 2), "h100": (8, [8, 0], 0, 0)}
    assert any("wait for those claims" in s and "ns/busy" in s for s in report.suggestions)


def test_admin_access_takes_devices_others_hold_and_holds_none_itself() -> None:
    """validate's check claim: on a node whose GPUs are all held it still fits, and while it
    is allocated the workloads' claims do not count its device as taken."""
    admin = gpus(8, f"{A}.productName == 'NVIDIA H200'")
    admin["exactly"]["adminAccess"] = True
    report = explain([admin])
    assert report.fits == ["h200"]
    counts = {c.node: (c.allocated, c.available) for c in report.requests[0].nodes}
    assert counts["h200"] == (0, 8)
    checker = cast(ResourceClaim, json.loads(json.dumps(BUSY)))
    checker["metadata"] = {"namespace": "ns", "name": "check", "uid": "k"}
    for r in checker["status"]["allocation"]["devices"]["results"]:
        r["adminAccess"] = True
    assert analysis.allocations([checker], except_uid=None) == {}


def test_first_failing_selector_names_the_values_devices_have() -> None:
    report = explain([gpus(1, f"{A}.productName == 'NVIDIA B200'")])
    (failure,) = report.requests[0].failures[:1]
    assert failure.stage == "selector 1" and failure.devices == 16
    assert sorted(failure.values[f"attributes['{DRIVER_NAME}'].productName"]) == [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H200",
    ]
    assert "no device passes selector 1" in render.as_table(report)


def test_cel_error_is_shown_as_such() -> None:
    report = explain([gpus(1, f"{A}.productname == 'x'")])
    assert not report.satisfiable
    assert any("CEL error" in s and "productname" in s for s in report.suggestions)


def test_match_attribute_applies_across_requests() -> None:
    h200 = gpus(1, f"{A}.productName == 'NVIDIA H200'", name="a")
    one = gpus(1, name="b")
    assert explain([h200, one]).fits == ["h200"]  # the claim's devices all on one node
    assert explain([h200, one], [{"matchAttribute": f"{DRIVER_NAME}/productName"}]).fits == ["h200"]
    assert explain([h200, one], [{"matchAttribute": f"{DRIVER_NAME}/uuid"}]).fits == []
    same = [{"matchAttribute": f"{DRIVER_NAME}/productName"}]
    assert explain([gpus(1, name="a"), gpus(2, name="b")], same).fits == ["h100"]


def test_distinct_attribute_needs_as_many_values_as_devices() -> None:
    distinct = [{"distinctAttribute": f"{DRIVER_NAME}/productName"}]
    assert explain([gpus(2)], distinct).fits == []
    assert explain([gpus(2)], [{"distinctAttribute": f"{DRIVER_NAME}/uuid"}]).fits == [
        "h100",
        "h200",
    ]


def test_first_available_takes_the_alternative_that_fits() -> None:
    request = {
        "name": "g",
        "firstAvailable": [
            {"name": "many", "deviceClassName": "gpu.nvidia.com", "count": 16},
            {"name": "few", "deviceClassName": "gpu.nvidia.com", "count": 2},
        ],
    }
    assert explain([request]).fits == ["h100", "h200"]


def test_missing_class_is_named() -> None:
    report = explain([{"name": "g", "exactly": {"deviceClassName": "nope", "count": 1}}])
    assert report.suggestions == ["request g: DeviceClass 'nope' does not exist"]


def test_json_and_yaml_carry_the_same_report() -> None:
    report = explain([gpus(16)])
    as_json = json.loads(command.output([report], "json"))
    assert yaml.safe_load(command.output([report], "yaml")) == as_json
    (data,) = as_json
    assert data["satisfiable"] is False and data["fitsOn"] == []
    assert data["requests"][0]["nodes"][0]["available"] in (2, 8)
