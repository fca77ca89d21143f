"""Time-slice intervals: which full GPUs of a claim get which interval, and the command.

``nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>`` (Default/Short/Medium/Long), as
NVIDIA's driver runs it. The interval is a property of the GPU, not of a process, so:

- ``Default`` is never applied: a GPU no prepared claim holds with another interval is kept at
  Default (unprepare and start-up reset it), so a claim asking ``Default`` gets it without a
  call and the common case costs prepare nothing.
- Two claims on one GPU (admin access, or a shared allocation) may not ask for different
  non-Default intervals: the second one fails naming the first (the first one's pods are
  running with its setting; silently changing it under them would be worse). The same interval,
  or ``Default`` next to another interval, is accepted; the GPU goes back to Default when the
  last claim asking another interval is unprepared.

MIG devices are never time-sliced (``MigDeviceConfig`` has no interval).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from dra_gpu.config import GpuConfig
from dra_gpu.prepare.cdi import ClaimDevice
from dra_gpu.prepare.checkpoint import ClaimRecord
from dra_gpu.prepare.sharing.runner import Command

DEFAULT: Final = "Default"
CODES: Final = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class Interval:
    uuid: str
    device: str
    interval: str


def wanted(devices: Iterable[ClaimDevice]) -> list[Interval]:
    """The non-Default intervals the claim's full GPUs ask for."""
    out = []
    for d in devices:
        config = d.config
        if d.type != "gpu" or not isinstance(config, GpuConfig) or config.sharing is None:
            continue
        slicing = config.sharing.timeSlicingConfig
        if slicing is not None and slicing.interval not in (None, DEFAULT):
            out.append(Interval(uuid=d.uuid, device=d.name, interval=slicing.interval))
    return out


def recorded_interval(config: Mapping[str, Any] | None) -> str:
    """The interval a checkpoint record's config (normalized, as JSON) asks for."""
    sharing = (config or {}).get("sharing") or {}
    interval = (sharing.get("timeSlicingConfig") or {}).get("interval")
    return str(interval) if interval else DEFAULT


def held(records: Iterable[ClaimRecord]) -> dict[str, str]:
    """GPU UUID -> the non-Default interval some record in ``records`` asks for."""
    out: dict[str, str] = {}
    for record in records:
        for device in record.devices:
            interval = recorded_interval(device.config)
            if device.type == "gpu" and device.uuid and interval != DEFAULT:
                out[device.uuid] = interval
    return out


def conflict(devices: Iterable[ClaimDevice], *, other_uid: str, other: ClaimRecord) -> str | None:
    """Why the claim's intervals cannot be set while ``other`` holds its GPUs; None if they can."""
    theirs = held([other])
    for want in wanted(devices):
        have = theirs.get(want.uuid)
        if have is not None and have != want.interval:
            return (
                f"GPU {want.device} ({want.uuid}) runs with time-slice interval {have} for claim "
                f"{other.namespace}/{other.name} ({other_uid}); this claim asks for "
                f"{want.interval} (one GPU has one interval: ask for {have} or Default)"
            )
    return None


def set_command(uuid: str, interval: str) -> Command:
    return Command(
        argv=("nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(CODES[interval])),
        timeout_s=TIMEOUT_S,
    )
