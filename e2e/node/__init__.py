"""A real node on this machine: kubelet + containerd (``kubelet_node.Node``), the binaries they are
built from (``python -m e2e.node.binaries``), their configuration, network and cleanup, and
kube-proxy. Imports nothing itself, so ``python -m e2e.node.binaries`` loads that module once.
"""
