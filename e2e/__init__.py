"""End-to-end harness: Kubernetes binaries built from source and a local control plane.

Nothing here is imported by the driver itself (``dra_gpu``); this package only exists so that tests,
benchmarks and the demo can run the real Kubernetes components as plain processes on loopback.
"""

# Sets GRPC_ENABLE_FORK_SUPPORT=false before a harness module imports grpc (dra_gpu/__init__.py):
# the harness spawns processes while it talks gRPC to plugins.
import dra_gpu  # noqa: F401
