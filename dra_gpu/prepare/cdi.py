"""CDI specs for prepared claims: naming, content, and the atomic file operations.

One transient spec per claim (the layout NVIDIA's driver uses, so tooling that looks for it
keeps working): kind ``k8s.gpu.nvidia.com/claim``, file
``<cdiRoot>/k8s.gpu.nvidia.com-claim_<claimUID>.json``, one CDI device per allocated device named
``<claimUID>-<deviceName>``. Device names embed the claim UID, so a name is never reused for
different content (runtimes cache specs).

Content is built by the pure :func:`build_spec` from :class:`ClaimDevice` values (everything
needed is in the checkpoint, so a spec can be rebuilt after a reboot without asking discovery)
and from the node's facts:

- :class:`RealNode`: the claimed GPUs' device nodes (``/dev/nvidia<minor>``; for MIG also the
  GI/CI capability nodes), the control nodes, and the driver's user-space files bind-mounted
  read-only. Facts are read by :mod:`dra_gpu.prepare.cdi_host`.
- :class:`SimulatedNode`: the same shape, with a harmless host device (``/dev/null``) standing in
  for every NVIDIA device node, so a container shows exactly which devices it got.

Both get environment describing every device: ``GPU_DEVICE_<key>=<name>`` and its UUID, product,
type, MIG profile, sharing settings and claim, ``<key>`` being the device name without ``gpu-``
in upper case (``gpu-3`` -> ``GPU_DEVICE_3``, as in NVIDIA's example driver). A container may use
several claims and the runtime merges their environments, so the key must be unique on the node:
a position in the claim would make a second claim's ``GPU_DEVICE_0`` hide the first one's.

Writes are atomic (:mod:`dra_gpu.kubeletplugin.atomicfile`): a runtime reading the directory sees
either no spec or a complete one, also across a crash of the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

from dra_gpu.config import DeviceConfig, GpuConfig
from dra_gpu.errors import UserError
from dra_gpu.kubeletplugin import atomicfile
from dra_gpu.kubeletplugin.ids import CDIDeviceID, ClaimUID, DeviceName
from dra_gpu.prepare import cdi_validate

VENDOR: Final = "k8s.gpu.nvidia.com"
CLASS: Final = "claim"
KIND: Final = f"{VENDOR}/{CLASS}"
_FILE_PREFIX: Final = f"{VENDOR}-{CLASS}_"
_FILE_SUFFIX: Final = ".json"

CONTROL_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
STAND_IN: Final = "/dev/null"


class CDIError(UserError, RuntimeError):
    """A spec that cannot be built or written; the message names the cause."""


@dataclass(frozen=True)
class ClaimDevice:
    """One allocated device as CDI needs it (also what the checkpoint stores per device)."""

    name: DeviceName
    type: Literal["gpu", "mig"]
    uuid: str
    minor: int  # the GPU's minor number; the parent's for a MIG device
    product_name: str
    config: DeviceConfig  # normalized
    mig_profile: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    # Allocated with admin access (next to the claims that hold it): said in the environment, so
    # a record rebuilt from the spec still knows the device is not this claim's alone.
    admin_access: bool = False


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str


@dataclass(frozen=True)
class RealNode:
    """Facts about a node with the NVIDIA driver (see ``cdi_host.read_real_node``)."""

    dev_root: PurePosixPath  # host directory holding dev/nvidia* ("/" or the driver root)
    driver_mounts: tuple[Mount, ...]
    # (gpu minor, gi id, ci id) -> (minor of the GI access cap, minor of the CI access cap)
    mig_caps: Mapping[tuple[int, int, int], tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class SimulatedNode:
    stand_in: str = STAND_IN


Node = RealNode | SimulatedNode


def spec_path(cdi_root: Path, claim_uid: ClaimUID) -> Path:
    return cdi_root / f"{_FILE_PREFIX}{claim_uid}{_FILE_SUFFIX}"


def device_id(claim_uid: ClaimUID, device: DeviceName) -> CDIDeviceID:
    return CDIDeviceID(f"{KIND}={claim_uid}-{device}")


def _sharing_env(prefix: str, config: DeviceConfig) -> list[str]:
    sharing = config.sharing
    if sharing is None:
        return []
    env = [f"{prefix}_SHARING_STRATEGY={sharing.strategy}"]
    if isinstance(config, GpuConfig) and config.sharing and config.sharing.timeSlicingConfig:
        env.append(f"{prefix}_TIMESLICE_INTERVAL={config.sharing.timeSlicingConfig.interval}")
    mps = sharing.mpsConfig
    if mps is not None:
        if mps.defaultActiveThreadPercentage is not None:
            env.append(f"{prefix}_MPS_ACTIVE_THREAD_PERCENTAGE={mps.defaultActiveThreadPercentage}")
        if mps.defaultPinnedDeviceMemoryLimit is not None:
            env.append(
                f"{prefix}_MPS_PINNED_DEVICE_MEMORY_LIMIT={mps.defaultPinnedDeviceMemoryLimit}"
            )
        if mps.defaultPerDevicePinnedMemoryLimit:
            limits = ",".join(
                f"{k}={v}" for k, v in sorted(mps.defaultPerDevicePinnedMemoryLimit.items())
            )
            env.append(f"{prefix}_MPS_PER_DEVICE_PINNED_MEMORY_LIMIT={limits}")
    return env


def env_prefix(device_name: str) -> str:
    """``GPU_DEVICE_<key>``: the variable naming a device, unique among the node's devices."""
    key = device_name.removeprefix("gpu-").upper().replace("-", "_")
    return f"GPU_DEVICE_{key}"


def device_env(device: ClaimDevice, claim_ref: str) -> list[str]:
    """Environment describing one device; identical on real and simulated nodes."""
    prefix = env_prefix(device.name)
    env = [
        f"{prefix}={device.name}",
        f"{prefix}_UUID={device.uuid}",
        f"{prefix}_TYPE={device.type}",
        f"{prefix}_PRODUCT={device.product_name}",
        f"{prefix}_CLAIM={claim_ref}",
    ]
    if device.mig_profile is not None:
        env.append(f"{prefix}_MIG_PROFILE={device.mig_profile}")
    if device.admin_access:
        env.append(f"{prefix}_ADMIN_ACCESS=true")
    return env + _sharing_env(prefix, device.config)


def _node_paths(device: ClaimDevice, node: Node) -> Iterator[str]:
    yield f"/dev/nvidia{device.minor}"
    if device.type != "mig" or not isinstance(node, RealNode):
        return
    caps = node.mig_caps.get((device.minor, device.gi_id or 0, device.ci_id or 0))
    if caps is None:
        raise CDIError(
            f"no MIG capability nodes known for {device.name} "
            f"(GPU {device.minor}, GI {device.gi_id}, CI {device.ci_id})"
        )
    for cap in caps:
        yield f"/dev/nvidia-caps/nvidia-cap{cap}"


def _device_node(path: str, node: Node) -> dict[str, Any]:
    if isinstance(node, SimulatedNode):
        return {"path": path, "hostPath": node.stand_in}
    if node.dev_root == PurePosixPath("/"):
        return {"path": path}
    return {"path": path, "hostPath": str(node.dev_root / path.lstrip("/"))}


def _common_edits(node: Node) -> dict[str, Any]:
    # "void": a legacy NVIDIA runtime hook would otherwise inject devices on its own, and CDI
    # already does. Nothing claim-specific here: a container with several claims gets every
    # claim's spec-level edits, and the last one's value of a variable would win.
    edits: dict[str, Any] = {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [_device_node(p, node) for p in CONTROL_NODES],
    }
    if isinstance(node, RealNode) and node.driver_mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro", "nosuid", "nodev", "bind"],
                "type": "bind",
            }
            for m in node.driver_mounts
        ]
    return edits


def build_spec(
    *,
    claim_uid: ClaimUID,
    claim_ref: str,
    devices: Sequence[ClaimDevice],
    node: Node,
    device_edits: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The CDI spec (as JSON data) for one claim; raises :class:`CDIError`.

    ``claim_ref`` is ``<namespace>/<name>``, put into the environment for humans.
    ``device_edits``: per device name, more ``env`` and ``mounts`` (the MPS daemon's pipe
    directory and shared memory, from ``dra_gpu.prepare.sharing``).
    """
    if not devices:
        raise CDIError(f"claim {claim_uid} has no devices to put in a CDI spec")
    extra = device_edits or {}
    cdi_devices = []
    for device in devices:
        edits: dict[str, Any] = {
            "env": device_env(device, claim_ref),
            "deviceNodes": [_device_node(p, node) for p in _node_paths(device, node)],
        }
        more = extra.get(device.name) or {}
        edits["env"] += list(more.get("env") or ())
        if more.get("mounts"):
            edits["mounts"] = list(more["mounts"])
        cdi_devices.append({"name": f"{claim_uid}-{device.name}", "containerEdits": edits})
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": KIND,
        "devices": cdi_devices,
        "containerEdits": _common_edits(node),
    }
    spec["cdiVersion"] = cdi_validate.minimum_version(spec)
    return spec


# --- files -----------------------------------------------------------------------------------


def write_spec(cdi_root: Path, claim_uid: ClaimUID, spec: Mapping[str, Any]) -> Path:
    """Validate and atomically write the claim's spec; returns its path."""
    return write_encoded(cdi_root, claim_uid, encode_spec(spec))


def encode_spec(spec: Mapping[str, Any]) -> bytes:
    """The spec's file content; raises CDIError for a spec a runtime would reject."""
    problems = cdi_validate.validate_spec(spec)
    if problems:
        raise CDIError(f"refusing to write an invalid CDI spec: {'; '.join(problems)}")
    # Compact: with ``indent`` the json module falls back to its pure-Python encoder, a fifth of
    # a prepare's CPU (bench/prepare_profile.py). ``jq . FILE`` shows it indented.
    return (json.dumps(spec, separators=(",", ":")) + "\n").encode()


def write_encoded(cdi_root: Path, claim_uid: ClaimUID, data: bytes) -> Path:
    """Atomically write the claim's spec from :func:`encode_spec`'s bytes; returns its path.

    Not fsynced: after a power loss the plugin sees a new boot ID and rewrites the specs of
    every completed claim from the checkpoint, which is durable.
    """
    path = spec_path(cdi_root, claim_uid)
    atomicfile.write_atomic(path, data, durable=False)
    return path


def remove_spec(cdi_root: Path, claim_uid: ClaimUID) -> bool:
    """Remove the claim's spec; ``False`` if there was none (not an error: unprepare repeats).

    Not fsynced, for the reason :func:`write_encoded` gives.
    """
    return atomicfile.remove(spec_path(cdi_root, claim_uid))


def list_specs(cdi_root: Path) -> dict[ClaimUID, Path]:
    """The claim specs this driver wrote that are present now (other vendors' are ignored)."""
    found: dict[ClaimUID, Path] = {}
    if not cdi_root.is_dir():
        return found
    for path in cdi_root.iterdir():
        name = path.name
        if name.startswith(_FILE_PREFIX) and name.endswith(_FILE_SUFFIX):
            found[ClaimUID(name[len(_FILE_PREFIX) : -len(_FILE_SUFFIX)])] = path
    return found


def remove_temp_files(cdi_root: Path) -> int:
    """Remove temp files a crash left behind mid-write; returns how many.

    Only while no spec write can be in progress: the plugin calls it from start-up recovery,
    which holds the node-wide call lock.
    """
    return atomicfile.remove_temp_files(cdi_root, f"{_FILE_PREFIX}*{_FILE_SUFFIX}")
