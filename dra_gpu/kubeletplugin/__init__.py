"""A kubelet plugin kit for DRA drivers: registration, sockets, the DRA gRPC adapter, the health
stream, health/readiness endpoints and ResourceSlice encode/plan/publish.

Driver-agnostic: it knows claims, devices and slices, not what a device is. Import the
submodules directly; this package re-exports nothing so that importing one part (e.g. the pure
slice planning) never pulls in grpc or the Kubernetes client.
"""
