"""GPU discovery: the device model, the NVML and simulated backends, MIG profile tables.

Modules: ``model`` (values and published names), ``naming`` (facts -> published devices),
``migprofiles`` (per-product MIG tables), ``nvml`` and ``simulated`` (the two ``GpuBackend``s).
Import the submodules directly; this package re-exports nothing so that importing the model
never pulls in pynvml or pydantic.
"""
