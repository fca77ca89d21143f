"""Opaque device configuration, API group ``resource.nvidia.com``, version ``v1beta1``.

These are the kinds users of NVIDIA's DRA driver already put into ``ResourceClaim`` and
``DeviceClass`` ``config[].opaque.parameters``; field names and values are kept identical so
their claims work unchanged.

Invariants enforced here (and therefore by both the admission webhook and prepare, which share
this code):

- Decoding is strict: unknown fields are errors at every level, and types are not coerced
  (``"50"`` is not an integer).
- ``sharing.strategy`` is ``TimeSlicing`` or ``MPS``; the sub-config of the *other* strategy must
  not be set. ``MigDeviceConfig`` has no ``timeSlicingConfig`` at all (MIG devices cannot be
  time-sliced with a per-GPU interval), so there it is simply an unknown field.
- Models are frozen values. :func:`normalized` fills defaults without mutating its input.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from dra_gpu.config.quantity import MemoryLimit
from dra_gpu.config.shown import shown

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
API_VERSION: Final = "resource.nvidia.com/v1beta1"  # f"{GROUP}/{VERSION}", spelled out for mypy

GPU_CONFIG_KIND: Final = "GpuConfig"
MIG_DEVICE_CONFIG_KIND: Final = "MigDeviceConfig"

# One value per row of dra_gpu.config.strategies, which spells the names again so that it loads
# no pydantic (tests/unit/test_sharing_strategies.py checks they agree).
Strategy = Literal["TimeSlicing", "MPS"]
TIME_SLICING: Final = "TimeSlicing"
MPS: Final = "MPS"

TimeSliceInterval = Literal["Default", "Short", "Medium", "Long"]

_DEVICE_KEY_RE: Final = re.compile(r"^(?:[0-9]+|(?:GPU|MIG)-[A-Za-z0-9/-]+)$")


def _check_device_key(key: str) -> str:
    # fullmatch: with match, "$" would also accept a trailing newline ("0\n").
    if not _DEVICE_KEY_RE.fullmatch(key):
        raise ValueError(f"{shown(key)} is neither a device index nor a GPU-/MIG- UUID")
    return key


DeviceKey = Annotated[str, AfterValidator(_check_device_key)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TimeSlicingConfig(_Strict):
    """How long each process sharing the GPU may run before it is switched out."""

    interval: TimeSliceInterval | None = None


class MpsConfig(_Strict):
    """Limits the MPS control daemon applies to every client of the shared device."""

    defaultActiveThreadPercentage: Annotated[int, Field(ge=0, le=100)] | None = None
    defaultPinnedDeviceMemoryLimit: MemoryLimit | None = None
    defaultPerDevicePinnedMemoryLimit: Annotated[
        dict[DeviceKey, MemoryLimit] | None,
        Field(json_schema_extra={"propertyNames": {"pattern": _DEVICE_KEY_RE.pattern}}),
    ] = None


def _mismatch(field: str, strategy: str) -> PydanticCustomError:
    return PydanticCustomError(
        "strategy_mismatch",
        "must not be set when strategy is {strategy}",
        {"field": field, "strategy": strategy},
    )


class GpuSharing(_Strict):
    strategy: Strategy
    timeSlicingConfig: TimeSlicingConfig | None = None
    mpsConfig: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> GpuSharing:
        if self.strategy == TIME_SLICING and self.mpsConfig is not None:
            raise _mismatch("mpsConfig", self.strategy)
        if self.strategy == MPS and self.timeSlicingConfig is not None:
            raise _mismatch("timeSlicingConfig", self.strategy)
        return self


class MigDeviceSharing(_Strict):
    strategy: Strategy
    mpsConfig: MpsConfig | None = None

    @model_validator(mode="after")
    def _one_strategy(self) -> MigDeviceSharing:
        if self.strategy == TIME_SLICING and self.mpsConfig is not None:
            raise _mismatch("mpsConfig", self.strategy)
        return self


class GpuConfig(_Strict):
    """Configuration for a full GPU (DeviceClass ``gpu.nvidia.com``)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["GpuConfig"]
    sharing: GpuSharing | None = None


class MigDeviceConfig(_Strict):
    """Configuration for a MIG device (DeviceClass ``mig.nvidia.com``)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"]
    kind: Literal["MigDeviceConfig"]
    sharing: MigDeviceSharing | None = None


DeviceConfig = GpuConfig | MigDeviceConfig


def default_gpu_config() -> GpuConfig:
    """What a full GPU gets when no config applies: time-slicing with the driver's interval."""
    return GpuConfig(
        apiVersion=API_VERSION,
        kind=GPU_CONFIG_KIND,
        sharing=GpuSharing(
            strategy=TIME_SLICING, timeSlicingConfig=TimeSlicingConfig(interval="Default")
        ),
    )


def default_mig_device_config() -> MigDeviceConfig:
    """What a MIG device gets when no config applies."""
    return MigDeviceConfig(
        apiVersion=API_VERSION,
        kind=MIG_DEVICE_CONFIG_KIND,
        sharing=MigDeviceSharing(strategy=TIME_SLICING),
    )


def _normalized_mps(mps: MpsConfig | None) -> MpsConfig:
    return mps if mps is not None else MpsConfig()


def normalized(config: DeviceConfig) -> DeviceConfig:
    """The config with every optional part a consumer relies on filled in.

    A missing ``sharing`` becomes the kind's default; a strategy without its sub-config gets an
    empty one (TimeSlicing gets ``interval: Default``). Idempotent; the input is not changed.
    """
    if isinstance(config, GpuConfig):
        if config.sharing is None:
            return default_gpu_config()
        sharing = config.sharing
        if sharing.strategy == TIME_SLICING:
            interval = (sharing.timeSlicingConfig or TimeSlicingConfig()).interval or "Default"
            update: dict[str, Any] = {"timeSlicingConfig": TimeSlicingConfig(interval=interval)}
        else:
            update = {"mpsConfig": _normalized_mps(sharing.mpsConfig)}
        return config.model_copy(update={"sharing": sharing.model_copy(update=update)})
    if config.sharing is None:
        return default_mig_device_config()
    if config.sharing.strategy == MPS:
        sharing_mig = config.sharing.model_copy(
            update={"mpsConfig": _normalized_mps(config.sharing.mpsConfig)}
        )
        return config.model_copy(update={"sharing": sharing_mig})
    return config
