"""The profile file of the demo's driver-upgrade node: a built-in profile with its driver's
version and state, which ``e2e.demo.driver_upgrade`` rewrites (apart from it, so that the
environment, which writes the first one, does not import the step that reads the environment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dra_gpu.devices.simulated import BUILTIN_PROFILES

PROFILE = "h200x8"
OLD = ("580.159.04", "13.0")
NEW = ("590.48.01", "13.1")


def profile_document(name: str, *, driver: tuple[str, str] = OLD, loaded: bool = True) -> Any:
    """The built-in profile ``name`` as a profile file (docs/user/simulated-profiles.md), with the
    driver's version and state; saved as ``<name>.yaml`` its GPUs keep their UUIDs."""
    profile = BUILTIN_PROFILES[name]
    gpus = []
    for gpu in profile.gpus:
        entry: dict[str, Any] = {"product": gpu.product, "pciBusID": gpu.pci_bus_id}
        if gpu.pcie_root is not None:
            entry["pcieRoot"] = gpu.pcie_root
        if gpu.numa_node is not None:
            entry["numaNode"] = gpu.numa_node
        if gpu.mig_enabled:
            entry["mig"] = {
                "enabled": True,
                "devices": [
                    {"profile": m.profile, "placement": m.placement} for m in gpu.mig_devices
                ],
            }
        gpus.append(entry)
    return {
        "driverVersion": driver[0],
        "cudaDriverVersion": driver[1],
        "driverLoaded": loaded,
        "gpus": gpus,
    }


def write_profile(path: Path, *, driver: tuple[str, str] = OLD, loaded: bool = True) -> None:
    """Replace the file at once (the plugin never reads half of it)."""
    temp = path.with_suffix(".tmp")
    temp.write_text(yaml.safe_dump(profile_document(PROFILE, driver=driver, loaded=loaded)))
    temp.replace(path)


def profile_path(workdir: Path) -> Path:
    """Where the supervisor writes the node's profile file (named for its UUIDs)."""
    return workdir / "profiles" / f"{PROFILE}.yaml"
