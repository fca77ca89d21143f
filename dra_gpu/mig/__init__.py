"""Dynamic MIG: the MIG instances prepare creates and unprepare destroys (NVML or simulated).

What a GPU can be partitioned into, and how it is published as counters, is pure device model:
``dra_gpu.devices.partitions``.
"""
