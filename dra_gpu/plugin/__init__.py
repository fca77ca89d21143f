"""The GPU kubelet plugin: settings, inventory, health monitoring, and the wiring of the kit
(:mod:`dra_gpu.kubeletplugin`) to the prepare side (:mod:`dra_gpu.prepare`).

Import the submodules directly; this package re-exports nothing so that importing one part
never pulls in grpc or the Kubernetes client.
"""
