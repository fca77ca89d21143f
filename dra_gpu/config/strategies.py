"""The sharing strategies as one table: what the rest of the driver asks of a strategy (pure).

A device config's ``sharing.strategy`` names a row of :data:`STRATEGIES`. Code outside the
strategy's own modules asks the row, never compares the name:

- telemetry (``plugin.usage_series``): whether a pod's own SM utilization can be known
  (``through_daemon``: clients reach the GPU through a server of the claim, and NVML samples
  the SMs for that server only) and the SM share each client of a claim may use
  (:meth:`SharingStrategy.compute_share`);
- consumable shares (``prepare.shares``, the plugin's settings, ``dra-gpu discover``): which
  strategy caps each share's memory and compute (``limits_shares``, :func:`share_limiter`),
  whether it is switched on (:func:`limits_shares_when`, so ``compute`` is published) and the
  config that gives a share its caps (:meth:`SharingStrategy.limited`);
- the node's switches (``prepare.sharing.applied.Switches``): which plugin setting applies the
  strategy on the node (``setting``, a ``Settings`` field; its flag is ``--`` and the field
  with dashes, its environment variable the field in capitals).

This module loads no pydantic (the plugin's flag parser and ``dra-gpu discover`` read it).

docs/development/where-to-change-what.md lists the files a new strategy touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dra_gpu.config.v1beta1 import DeviceConfig

# The values of ``sharing.strategy``, as ``v1beta1`` spells them (its ``Strategy`` literal and
# constants; not imported from it, which would load pydantic).
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"

# A share's caps: (config, memory in bytes (0: none), percent of the SMs (0: none)) -> config.
Limiter = Callable[["DeviceConfig", int, int], "DeviceConfig"]


@dataclass(frozen=True)
class SharingStrategy:
    """One sharing strategy: its name and the answers callers ask of it."""

    name: str  # the value of ``sharing.strategy``
    sub_config: str  # the field of GpuSharing / MigDeviceSharing holding its settings
    setting: str  # the plugin Settings field (and flag) that applies it on the node
    # Clients reach the GPU through a server of the claim (a daemon the plugin runs): NVML
    # gives the SM samples to the server, so a pod's own utilization is not known.
    through_daemon: bool
    # Its setting is one for the whole GPU (not per claim): two claims on one GPU must agree,
    # and a MIG device cannot have it.
    per_gpu: bool
    # The sub-config's field giving the percent of SMs each client may use; None: no such cap.
    compute_share_field: str | None = None
    # How a consumable share's memory and compute caps are given to it; None: this strategy
    # cannot cap a share (``limits_shares`` is False).
    limiter: Limiter | None = None

    @property
    def flag(self) -> str:
        return "--" + self.setting.replace("_", "-")

    @property
    def env(self) -> str:
        return self.setting.upper()

    @property
    def limits_shares(self) -> bool:
        """Whether each consumable share of a device can be capped to what it consumed."""
        return self.limiter is not None

    def compute_share(self, sharing: Mapping[str, Any]) -> float | None:
        """The share of the SMs (0..1) each client may use, from a recorded (JSON) ``sharing``;
        None when the strategy has no such cap or the claim set none."""
        if self.compute_share_field is None:
            return None
        percent = (sharing.get(self.sub_config) or {}).get(self.compute_share_field)
        return percent / 100 if isinstance(percent, int) else None

    def limited(self, config: DeviceConfig, memory: int, compute: int) -> DeviceConfig:
        """``config`` switched to this strategy with a share's caps (see ``limiter``)."""
        if self.limiter is None:
            raise ValueError(f"sharing strategy {self.name} cannot cap a consumable share")
        return self.limiter(config, memory, compute)


def _mps_limited(config: DeviceConfig, memory: int, compute: int) -> DeviceConfig:
    """The config's own MPS limits lowered to the share's: its pinned device memory limit to
    the consumed memory (whole MiB, at least 1), its active thread percentage to the consumed
    compute. A lower limit of the claim's own is kept; another strategy's config is replaced."""
    # Here, not at the top: this table is read where pydantic must not load (see __init__).
    from dra_gpu.config.quantity import MIB, to_bytes
    from dra_gpu.config.v1beta1 import (
        GpuConfig,
        GpuSharing,
        MigDeviceConfig,
        MigDeviceSharing,
        MpsConfig,
        normalized,
    )

    sharing = config.sharing
    own = (sharing.mpsConfig if sharing is not None and sharing.strategy == MPS else None) or (
        MpsConfig()
    )
    if memory > 0:
        mine = own.defaultPinnedDeviceMemoryLimit
        limit = min(memory, to_bytes(mine)) if mine is not None else memory
        own = own.model_copy(update={"defaultPinnedDeviceMemoryLimit": f"{max(limit // MIB, 1)}Mi"})
    if compute > 0:
        mine_pct = own.defaultActiveThreadPercentage
        pct = min(compute, mine_pct) if mine_pct is not None else compute
        own = own.model_copy(update={"defaultActiveThreadPercentage": pct})
    if isinstance(config, GpuConfig):
        gpu = config.model_copy(update={"sharing": GpuSharing(strategy=MPS, mpsConfig=own)})
        return normalized(gpu)
    assert isinstance(config, MigDeviceConfig)
    mig = config.model_copy(update={"sharing": MigDeviceSharing(strategy=MPS, mpsConfig=own)})
    return normalized(mig)


STRATEGIES: Final[Mapping[str, SharingStrategy]] = MappingProxyType(
    {
        TIME_SLICING: SharingStrategy(
            name=TIME_SLICING,
            sub_config="timeSlicingConfig",
            setting="time_slicing_settings",
            through_daemon=False,
            per_gpu=True,
        ),
        MPS: SharingStrategy(
            name=MPS,
            sub_config="mpsConfig",
            setting="mps_support",
            through_daemon=True,
            per_gpu=False,
            compute_share_field="defaultActiveThreadPercentage",
            limiter=_mps_limited,
        ),
    }
)


def recorded(sharing: Mapping[str, Any] | None) -> SharingStrategy | None:
    """The strategy a recorded (JSON) ``sharing`` names; None without one, or a name this
    release does not know (a record written by another release)."""
    name = (sharing or {}).get("strategy")
    return STRATEGIES.get(name) if isinstance(name, str) else None


def share_limiter() -> SharingStrategy:
    """The strategy that caps consumable shares (exactly one row has a limiter)."""
    (limiter,) = (s for s in STRATEGIES.values() if s.limits_shares)
    return limiter


def limits_shares_when(enabled: Iterable[str]) -> bool:
    """Whether, with the strategies named in ``enabled`` applied on the node, each consumable
    share is capped to what it consumed (so the ``compute`` capacity is published)."""
    return any(STRATEGIES[name].limits_shares for name in enabled)


def enabled_by(settings: Mapping[str, bool]) -> frozenset[str]:
    """The strategies a node applies, from its switches by ``setting`` name (a missing one is
    off)."""
    return frozenset(s.name for s in STRATEGIES.values() if settings.get(s.setting, False))
