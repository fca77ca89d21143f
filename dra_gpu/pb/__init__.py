"""Generated protobuf and gRPC modules for the kubelet plugin protocols (do not edit them).

Sources are ``api/*.proto``; regenerate with ``make protos`` (``python api/generate.py``).
Each ``<name>.proto`` yields ``<name>_pb2`` (messages), ``<name>_pb2_grpc`` (stub, servicer base
class, ``add_*Servicer_to_server``) and typed stubs (``.pyi``) for both:

- ``dra_v1`` / ``dra_v1beta1``: ``DRAPlugin`` (NodePrepareResources, NodeUnprepareResources),
  proto packages ``k8s.io.kubelet.pkg.apis.dra.v1`` / ``...v1beta1``.
- ``pluginregistration_v1``: ``Registration`` (GetInfo, NotifyRegistrationStatus), package
  ``pluginregistration``.
- ``health_v1alpha1`` / ``health_v1``: ``DRAResourceHealth`` (server-streaming
  NodeWatchResources), packages ``v1alpha1`` / ``v1``.

All five can be imported into one process: their fully qualified names do not collide.
"""
