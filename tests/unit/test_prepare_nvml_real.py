"""Prepare on a real GPU node: the CDI spec for a claim on an NVML-discovered device.

Runs only where NVML answers (skipped with the reason elsewhere). Read only: it changes no GPU
setting, it only reads the driver files and device nodes a container would get. Cases: the
spec for a claim on the first device is valid and injects that GPU's own device node (the
minor NVML reports), the control nodes and the driver's libraries, every host path of it
exists, and unprepare removes it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import real_nvml
from fake_claims import FakeFetcher, claim, device_state, result

from dra_gpu.devices import naming
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import cdi, cdi_host
from dra_gpu.prepare.cdi_validate import validate_spec
from dra_gpu.prepare.plan import ClaimRef

pytestmark = pytest.mark.nvml

# Where GPU containers and hosts put the driver's user-space files.
DRIVER_ROOTS = (Path("/"), Path("/usr/local/nvidia"), Path("/run/nvidia/driver"))


@pytest.fixture(scope="module")
def nvml_ready() -> Iterator[Any]:
    yield from real_nvml.initialized()


def driver_root() -> Path:
    problems = []
    for root in DRIVER_ROOTS:
        try:
            cdi_host.driver_mounts(root, host_driver_root=None)
        except cdi.CDIError as exc:
            problems.append(str(exc))
            continue
        return root
    pytest.fail("NVML answers but no driver root has libcuda: " + "; ".join(problems))


def host_path(entry: dict[str, Any]) -> Path:
    return Path(entry.get("hostPath") or entry["path"])


def test_real_gpu_claim_gets_its_own_device_node_and_driver(
    nvml_ready: Any, tmp_path: Path
) -> None:
    devices = {d.name: d for d in naming.build_devices(NvmlBackend().discover().gpus)}
    assert devices, "NVML reported no GPU"
    name, device = next(iter(sorted(devices.items())))
    root = driver_root()
    fetcher = FakeFetcher()
    fetcher.add(claim("real-1", [result(name)]))
    state = device_state(
        tmp_path, devices=devices, claims=fetcher, simulated=False, driver_root=root
    )
    ref = ClaimRef(uid=ClaimUID("real-1"), namespace="default", name="claim-real-1")

    out = state.prepare([ref])[ClaimUID("real-1")]
    assert out.error == ""
    spec_file = cdi.spec_path(tmp_path / "cdi", ClaimUID("real-1"))

    spec = json.loads(spec_file.read_text())
    assert validate_spec(spec) == []
    (cdi_device,) = spec["devices"]
    nodes = cdi_device["containerEdits"]["deviceNodes"] + spec["containerEdits"]["deviceNodes"]
    paths = [n["path"] for n in nodes]
    assert f"/dev/nvidia{device.gpu.minor}" in paths
    assert "/dev/nvidiactl" in paths
    for node in nodes:
        assert stat.S_ISCHR(os.stat(host_path(node)).st_mode), node
    mounts = spec["containerEdits"]["mounts"]
    assert any(Path(m["containerPath"]).name.startswith("libcuda.so.") for m in mounts)
    assert any(Path(m["containerPath"]).name.startswith("libnvidia-ml.so.") for m in mounts)
    for mount in mounts:
        assert Path(mount["hostPath"]).exists(), mount
        assert "ro" in mount["options"], mount
    env = dict(e.split("=", 1) for e in cdi_device["containerEdits"]["env"])
    assert env[cdi.env_prefix(name) + "_UUID"] == device.uuid

    assert state.unprepare([ref]) == {ClaimUID("real-1"): ""}
    assert not spec_file.exists()
