"""Simulated-profile files (YAML or JSON) -> ``SimProfile``; format:
docs/user/simulated-profiles.md.

A file is user input, so it is parsed strictly with pydantic (unknown keys are errors, so a typo
such as ``migDevice`` fails loudly instead of silently simulating a GPU without MIG), then
checked against the real MIG rules with ``simulated.profile_errors``. Every problem is reported
at once in one ``ProfileError``.

Use ``profiles.resolve_profile`` for ``--simulate``: it imports this module only for paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dra_gpu.devices import simulated
from dra_gpu.devices.model import Version
from dra_gpu.devices.simulated import ProfileError, SimGpu, SimMig, SimProfile


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class MigDeviceEntry(_Strict):
    profile: str
    placement: int = Field(ge=0)


class MigEntry(_Strict):
    enabled: bool = False
    devices: list[MigDeviceEntry] = Field(default_factory=list)


class GpuEntry(_Strict):
    product: str
    count: int = Field(default=1, ge=1, le=256)
    pci_bus_id: str | None = Field(default=None, alias="pciBusID")
    pcie_root: str | None = Field(default=None, alias="pcieRoot")
    product_name: str | None = Field(default=None, alias="productName", min_length=1, max_length=64)
    memory_bytes: int | None = Field(default=None, alias="memoryBytes", gt=0)
    # null: a GPU whose NVML cannot report the mode (the attribute is left out)
    addressing_mode: Literal["None", "HMM", "ATS"] | None = Field(
        default="None", alias="addressingMode"
    )
    # absent or null: unknown, and the attribute is left out (what a VM typically reports)
    numa_node: int | None = Field(default=None, alias="numaNode", ge=0)
    mig: MigEntry = Field(default_factory=MigEntry)

    @model_validator(mode="after")
    def _one_bus_id_per_gpu(self) -> GpuEntry:
        if self.count > 1 and (self.pci_bus_id or self.pcie_root):
            raise ValueError("pciBusID/pcieRoot can only be given for an entry with count 1")
        return self


class ProfileFile(_Strict):
    driver_version: str = Field(default="580.159.04", alias="driverVersion")
    cuda_driver_version: str = Field(default="13.0", alias="cudaDriverVersion")
    # false: the kernel driver is unloaded, as during a driver upgrade
    # (docs/concepts/device-health.md)
    driver_loaded: bool = Field(default=True, alias="driverLoaded")
    gpus: list[GpuEntry] = Field(min_length=1)


def _to_profile(name: str, doc: ProfileFile) -> SimProfile:
    gpus: list[SimGpu] = []
    for entry in doc.gpus:
        for _ in range(entry.count):
            bus, root = simulated.default_pci(len(gpus))
            gpus.append(
                SimGpu(
                    product=entry.product,
                    pci_bus_id=entry.pci_bus_id or bus,
                    pcie_root=entry.pcie_root or (None if entry.pci_bus_id else root),
                    mig_enabled=entry.mig.enabled,
                    mig_devices=tuple(SimMig(m.profile, m.placement) for m in entry.mig.devices),
                    addressing_mode=entry.addressing_mode,
                    product_name=entry.product_name,
                    memory_bytes=entry.memory_bytes,
                    numa_node=entry.numa_node,
                )
            )
    return SimProfile(
        name=name,
        gpus=tuple(gpus),
        driver_version=doc.driver_version,
        cuda_driver_version=doc.cuda_driver_version,
        driver_loaded=doc.driver_loaded,
    )


def parse_profile(name: str, data: Any) -> SimProfile:
    """Validate already-decoded file content; raises ``ProfileError``."""
    try:
        doc = ProfileFile.model_validate(data)
    except ValidationError as e:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '<top>'}: {err['msg']}" for err in e.errors()
        ]
        raise ProfileError(f"profile {name}: " + "; ".join(problems)) from None
    profile = _to_profile(name, doc)
    problems = simulated.profile_errors(profile)
    try:
        Version.parse(profile.driver_version)
        Version.parse(profile.cuda_driver_version)
    except ValueError as e:
        problems.append(str(e))
    if problems:
        raise ProfileError(f"profile {name}: " + "; ".join(problems))
    return profile


def load_profile_file(path: Path) -> SimProfile:
    """Read a ``.json``, ``.yaml`` or ``.yml`` profile file; raises ``ProfileError``."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError(f"cannot read simulated profile {path}: {e}") from e
    return parse_profile(path.stem, _decode(path, text))


def _decode(path: Path, text: str) -> Any:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as e:
            raise ProfileError(f"{path} is not valid JSON: {e}") from e
    import yaml  # only for YAML files: the plugin image need not ship it otherwise

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(f"{path} is not valid YAML: {e}") from e
