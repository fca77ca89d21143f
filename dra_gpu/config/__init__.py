"""The ``resource.nvidia.com`` opaque configuration API (see :mod:`dra_gpu.config.v1beta1`).

Public surface: the models, :func:`parse_opaque_config` and :class:`ConfigError`. The admission
webhook and prepare both use :func:`parse_opaque_config`, so they accept exactly the same input.
"""

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
