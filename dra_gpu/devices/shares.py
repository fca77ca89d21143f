"""Consumable GPU shares (KEP-5075): a device several claims are allocated at once (pure).

With a share mode set on the node (``--consumable-shares``), every full GPU and MIG device is
published with ``allowMultipleAllocations: true`` and a ``requestPolicy`` per capacity; the
scheduler then places claims on one device until a capacity is used up, and writes what each
one consumed (``consumedCapacity``) and a ``shareID`` into its allocation.

The modes, their names and the capacity names are NVIDIA's (driver v0.5.0, ``ConsumableShares``)
so that claims written for that driver are allocated the same way here:

- ``memory``: ``memory`` in 1Mi steps from 1Mi to the whole memory; a claim that does not ask
  for memory gets the whole of it (so it holds the device alone, as without shares).
- ``unlimited``: ``memory`` from 0, default 0: claims that ask nothing all fit.
- an integer N: ``memory`` as ``unlimited``, plus a capacity ``shares`` = N (1 per claim unless
  it asks for more), so at most N claims share a device.

The published memory is rounded down to a whole MiB: the API server wants a range's maximum to
be a multiple of its step.

Beyond NVIDIA's: ``compute`` = 100 (percent of the device's SMs, default 0: no cap asked), only
where the node enforces it (``compute=True``: the strategy that caps shares is switched on --
``dra_gpu.config.strategies``, today MPS, which gives each share an MPS server whose
active-thread percentage is the share's), and a policy on each MIG engine count
(default 0, so a claim that asks nothing leaves them to the others; without a policy the API's
rule is that a claim consumes the whole capacity, and no second claim would fit). Capacities
of 0 get no policy: a range needs ``min + step <= value``, and nothing can be consumed anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from dra_gpu.devices.model import CAP_MEMORY, AttributeValue, Device, MigPartition

CAP_SHARES: Final = "shares"
CAP_COMPUTE: Final = "compute"
MEMORY_STEP: Final = 1024 * 1024  # 1Mi, NVIDIA's step
COMPUTE_PERCENT: Final = 100
MODES: Final = ("memory", "unlimited")  # or a positive integer
OFF: Final = ("", "disabled", "false", "off")


@dataclass(frozen=True)
class RequestPolicy:
    """``requestPolicy`` of one capacity: a default and a range (``step`` None: any amount)."""

    default: int
    min: int
    max: int
    step: int | None


@dataclass(frozen=True)
class ShareMode:
    """``mode``: ``memory``, ``unlimited`` or ``shares`` (the integer mode, ``shares`` = N)."""

    mode: str
    shares: int = 0
    compute: bool = False

    def __str__(self) -> str:
        return str(self.shares) if self.mode == "shares" else self.mode


class ShareModeError(ValueError):
    """The share mode is none of ``memory``, ``unlimited``, a positive integer, ``disabled``."""


def parse_mode(text: str | None, *, compute: bool = False) -> ShareMode | None:
    """The node's share mode from ``--consumable-shares``; None when off (the default)."""
    value = (text or "").strip().lower()
    if value in OFF:
        return None
    if value in MODES:
        return ShareMode(mode=value, compute=compute)
    if value.isdigit() and int(value) > 0:
        return ShareMode(mode="shares", shares=int(value), compute=compute)
    raise ShareModeError(
        f"consumable shares must be memory, unlimited, a positive integer or disabled, got {text!r}"
    )


def _memory(device: Device) -> int:
    return device.capacity.get(CAP_MEMORY, 0) // MEMORY_STEP * MEMORY_STEP


def capacity(device: Device, mode: ShareMode) -> dict[str, int]:
    """What the device publishes in ``mode``: its capacities, memory in whole MiB, plus
    ``shares`` and ``compute`` where the mode has them."""
    out = dict(device.capacity)
    if CAP_MEMORY in out:
        out[CAP_MEMORY] = _memory(device)
    if mode.mode == "shares":
        out[CAP_SHARES] = mode.shares
    if mode.compute:
        out[CAP_COMPUTE] = COMPUTE_PERCENT
    return out


def _counted(value: int, default: int = 0, minimum: int = 0) -> RequestPolicy:
    return RequestPolicy(
        default=default, min=minimum, max=value, step=1 if minimum + 1 <= value else None
    )


def policies(device: Device, mode: ShareMode) -> dict[str, RequestPolicy]:
    """The ``requestPolicy`` of each capacity of the device in ``mode`` (see the module doc)."""
    values = capacity(device, mode)
    out: dict[str, RequestPolicy] = {}
    for name, value in values.items():
        if name == CAP_MEMORY:
            if mode.mode == "memory":
                out[name] = RequestPolicy(
                    default=value, min=MEMORY_STEP, max=value, step=MEMORY_STEP
                )
            else:
                out[name] = RequestPolicy(default=0, min=0, max=value, step=MEMORY_STEP)
        elif name == CAP_SHARES:
            out[name] = _counted(value, default=1, minimum=1)
        elif value > 0:  # compute, and a MIG device's engine counts
            out[name] = _counted(value)
    return out


@dataclass(frozen=True)
class SharedDevice:
    """A device as published in a share mode (the kit's ``ConsumableDevice``)."""

    device: Device
    mode: ShareMode

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def attributes(self) -> Mapping[str, AttributeValue]:
        return self.device.attributes

    @property
    def capacity(self) -> Mapping[str, int]:
        return MappingProxyType(capacity(self.device, self.mode))

    @property
    def partition(self) -> MigPartition | None:
        return self.device.partition

    @property
    def request_policies(self) -> Mapping[str, RequestPolicy]:
        return MappingProxyType(policies(self.device, self.mode))


def shared(devices: Iterable[Device], mode: ShareMode) -> list[SharedDevice]:
    return [SharedDevice(d, mode) for d in devices]
