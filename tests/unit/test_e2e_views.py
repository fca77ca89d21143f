"""The e2e suite's judgement: what a container saw against what its claim was allocated."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.config.quantity import to_bytes as parse_quantity
from e2e.suite import views

CTL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


def report(env: dict[str, str], paths: list[str]) -> str:
    lines = ["== env", *(f"{k}={v}" for k, v in sorted(env.items())), "== devices", *paths]
    return "\n".join([*lines, "== end", ""])


def claim(*results: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": r, "driver": d, "pool": "node", "device": n}
                        for r, d, n in results
                    ]
                }
            }
        }
    }


def test_parse_report_reads_env_and_device_paths() -> None:
    view = views.parse_report(report({"GPU_DEVICE_3": "gpu-3", "A": "b=c"}, ["/dev/nvidia3"]))
    assert view.env["A"] == "b=c"
    assert view.device_names == {"gpu-3"}
    assert view.gpu_nodes == {"/dev/nvidia3"}


def test_parse_report_refuses_an_unfinished_report() -> None:
    with pytest.raises(views.LogIncomplete):
        views.parse_report("== env\nA=b\n== devices\n")


@pytest.mark.parametrize(
    ("name", "minor"),
    [("gpu-0", 0), ("gpu-12", 12), ("gpu-1-mig-3g20gb-9-4", 1)],
    ids=["gpu", "two-digit", "mig"],
)
def test_gpu_minor_from_device_names(name: str, minor: int) -> None:
    assert views.gpu_minor(name) == minor


def test_allocated_devices_keeps_own_driver_and_request() -> None:
    c = claim(
        ("gpu", "gpu.nvidia.com", "gpu-1"),
        ("nic", "other.example.com", "eth0"),
        ("gpu2/big", "gpu.nvidia.com", "gpu-2"),
    )
    assert views.allocated_devices(c) == ["gpu-1", "gpu-2"]
    assert views.allocated_devices(c, request="gpu") == ["gpu-1"]
    assert views.allocated_devices(c, request="gpu2") == ["gpu-2"]
    assert views.allocated_devices({"status": {}}) == []


def test_exactly_the_allocated_devices_is_no_mismatch() -> None:
    view = views.parse_report(report({"GPU_DEVICE_1": "gpu-1"}, ["/dev/nvidia1", *CTL]))
    assert views.mismatches(view, ["gpu-1"]) == []


@pytest.mark.parametrize(
    ("env", "paths", "allocated", "fragment"),
    [
        (
            {"GPU_DEVICE_1": "gpu-1"},
            ["/dev/nvidia1", "/dev/nvidia2", *CTL],
            ["gpu-1"],
            "unexpected ['/dev/nvidia2']",
        ),
        ({"GPU_DEVICE_1": "gpu-1"}, [*CTL], ["gpu-1"], "missing ['/dev/nvidia1']"),
        ({}, ["/dev/nvidia1", *CTL], ["gpu-1"], "env names []"),
        ({}, ["/dev/nvidiactl"], [], "unexpected ['/dev/nvidiactl']"),
    ],
    ids=["extra-gpu", "missing-gpu", "missing-env", "control-node-without-claim"],
)
def test_mismatches_name_what_differs(
    env: dict[str, str], paths: list[str], allocated: list[str], fragment: str
) -> None:
    problems = views.mismatches(views.parse_report(report(env, paths)), allocated)
    assert any(fragment in p for p in problems), problems


def test_mig_device_shows_its_parent_gpu_node() -> None:
    assert "/dev/nvidia2" in views.expected_paths(["gpu-2-mig-3g20gb-9-4"])


@pytest.mark.parametrize(
    ("text", "value"),
    [("141Gi", 141 * 2**30), ("42949672960", 42949672960), ("1k", 1000), ("1.5Gi", 3 * 2**29)],
)
def test_parse_quantity(text: str, value: int) -> None:
    assert parse_quantity(text) == value
