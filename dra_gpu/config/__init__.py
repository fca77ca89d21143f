"""The ``resource.nvidia.com`` opaque configuration API (see :mod:`dra_gpu.config.v1beta1`).

Public surface: the models, :func:`parse_opaque_config` and :class:`ConfigError`. The admission
webhook and prepare both use :func:`parse_opaque_config`, so they accept exactly the same input.

The names load on first use (PEP 562), not when the package is imported: the sharing strategy
table (:mod:`dra_gpu.config.strategies`) is read by the plugin's settings and ``dra-gpu
discover``, which must not pay for pydantic (tests/unit/test_cli.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_gpu.config.parsing import ConfigError, Problem, parse_opaque_config
    from dra_gpu.config.v1beta1 import (
        API_VERSION,
        GPU_CONFIG_KIND,
        MIG_DEVICE_CONFIG_KIND,
        DeviceConfig,
        GpuConfig,
        GpuSharing,
        MigDeviceConfig,
        MigDeviceSharing,
        MpsConfig,
        TimeSlicingConfig,
        default_gpu_config,
        default_mig_device_config,
        normalized,
    )

_FROM_PARSING = ("ConfigError", "Problem", "parse_opaque_config")

__all__ = [
    "API_VERSION",
    "GPU_CONFIG_KIND",
    "MIG_DEVICE_CONFIG_KIND",
    "ConfigError",
    "DeviceConfig",
    "GpuConfig",
    "GpuSharing",
    "MigDeviceConfig",
    "MigDeviceSharing",
    "MpsConfig",
    "Problem",
    "TimeSlicingConfig",
    "default_gpu_config",
    "default_mig_device_config",
    "normalized",
    "parse_opaque_config",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "parsing" if name in _FROM_PARSING else "v1beta1"
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
