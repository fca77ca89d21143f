"""The local control plane: etcd, kube-apiserver, -controller-manager and -scheduler as processes.

``control_plane.Cluster`` runs them (re-exported here with ``ClusterError``); ``cli`` is
``python -m e2e.cluster {up,down,env,logs}``; ``certs``, ``kubeconfigs`` and ``components`` are
what the processes are started with.
"""

from e2e.cluster.control_plane import SIMULATED_TOLERATION as SIMULATED_TOLERATION
from e2e.cluster.control_plane import Cluster as Cluster
from e2e.cluster.control_plane import ClusterError as ClusterError
