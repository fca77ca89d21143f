"""dra-gpu: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs."""

import os

__version__ = "0.2.0"

DRIVER_NAME = "gpu.nvidia.com"

# gRPC core registers pthread_atfork handlers that can block a fork() for good while gRPC
# threads are busy (seen here: a subprocess spawn hung inside cygrpc's prefork handler after the
# gRPC tests had run). This program forks only to exec (nvidia-smi, the MPS control daemon,
# test daemons), which needs none of those handlers; gRPC reads the switch when it starts, and
# every module of ours that imports grpc imports this package first. A value the user set wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
