"""The kubelet plugin: registration, DRA gRPC services, ResourceSlice publishing, prepare state.

Import the submodules directly; this package re-exports nothing so that importing one part
(e.g. the pure slice planning) never pulls in grpc or the Kubernetes client.
"""
