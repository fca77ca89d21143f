"""Warnings for CEL selectors that use names the driver never publishes.

Cases: real names (every published one) are silent; misspellings get the nearest real name;
attribute/capacity mix-ups and names from another domain say where the name lives; other
drivers' domains and unparsable expressions are silent; a name used twice warns once.
"""

from __future__ import annotations

import pytest

from dra_gpu.controller import selectors
from dra_gpu.devices import model

ATTR = "device.attributes['gpu.nvidia.com']"
CAP = "device.capacity['gpu.nvidia.com']"


@pytest.mark.parametrize("name", sorted(selectors.published_names().attributes))
def test_every_published_attribute_is_silent(name: str) -> None:
    assert selectors.unknown_name_warnings(f"has({ATTR}.{name})") == []


@pytest.mark.parametrize("name", sorted(selectors.published_names().capacities))
def test_every_published_capacity_is_silent(name: str) -> None:
    assert selectors.unknown_name_warnings(f"{CAP}.{name}.compareTo(quantity('1')) >= 0") == []


def test_names_come_from_the_device_model() -> None:
    names = selectors.published_names()
    assert model.ATTR_PRODUCT_NAME in names.attributes
    assert model.CAP_MEMORY in names.capacities
    assert "pciBusID" not in names.attributes  # published under resource.kubernetes.io


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        pytest.param(
            f"{ATTR}.productname == 'NVIDIA H200'",
            "gpu.nvidia.com never publishes attribute 'productname'; did you mean 'productName'?",
            id="case",
        ),
        pytest.param(
            f"{ATTR}['prodName'] == 'x'",
            "gpu.nvidia.com never publishes attribute 'prodName'; did you mean 'productName'?",
            id="index-form",
        ),
        pytest.param(
            'device.attributes["gpu.nvidia.com"].cudaComputeCapabilty'
            '.isGreaterThan(semver("8.0.0"))',
            "gpu.nvidia.com never publishes attribute 'cudaComputeCapabilty'; "
            "did you mean 'cudaComputeCapability'?",
            id="double-quotes-method",
        ),
        pytest.param(
            f"{CAP}.mem.compareTo(quantity('80Gi')) >= 0",
            "gpu.nvidia.com never publishes capacity 'mem'; did you mean 'memory'?",
            id="capacity",
        ),
        pytest.param(
            f"has({ATTR}.colour)",
            "gpu.nvidia.com never publishes attribute 'colour'",
            id="no-suggestion",
        ),
        pytest.param(
            f"{ATTR}.memory > 0",
            "gpu.nvidia.com publishes 'memory' as capacity: use "
            "device.capacity['gpu.nvidia.com'].memory",
            id="attr-vs-capacity",
        ),
        pytest.param(
            f"{ATTR}.pciBusID == '0000:01:00.0'",
            "'pciBusID' is published in domain 'resource.kubernetes.io', not 'gpu.nvidia.com': "
            "use device.attributes['resource.kubernetes.io'].pciBusID",
            id="other-domain",
        ),
        pytest.param(
            f"device.attributes['gpu.nvidia.com'].all(x, x == 'a') || {ATTR}.brnd == 'x'",
            "gpu.nvidia.com never publishes attribute 'brnd'; did you mean 'brand'?",
            id="nested",
        ),
    ],
)
def test_unpublished_name_warns(expression: str, expected: str) -> None:
    assert selectors.unknown_name_warnings(expression) == [expected]


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("device.attributes['example.com'].productname == 'x'", id="other-driver"),
        pytest.param("device.attributes['resource.kubernetes.io'].pciBusID == 'x'", id="std"),
        pytest.param("device.driver == 'gpu.nvidia.com'", id="no-attrs"),
        pytest.param("device.attributes[", id="unparsable"),
        pytest.param("attributes['gpu.nvidia.com'].productname == 'x'", id="not-device"),
    ],
)
def test_silent(expression: str) -> None:
    assert selectors.unknown_name_warnings(expression) == []


def test_same_name_twice_warns_once() -> None:
    expr = f"{ATTR}.brnd == 'a' || {ATTR}.brnd == 'b'"
    assert len(selectors.unknown_name_warnings(expr)) == 1
