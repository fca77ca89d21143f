"""Configuration files of a real node, as pure functions of its directory layout.

The layout (``NodePaths``) puts everything a node writes under one directory, so that teardown can
find and unmount all of it, and several nodes (or test sessions) never share a socket or state:
containerd's root/state/socket, the runc root, CNI config and IPAM state, the kubelet's root dir
(whose ``plugins_registry`` the DRA kubelet plugin registers through) and the pod logs.

Config choices that matter on these machines (root in a VM, cgroup v1 hierarchies + cgroup2 at
``/sys/fs/cgroup/unified``, no systemd, no swap): kubelet ``cgroupDriver: cgroupfs``,
``failCgroupV1: false``, ``failSwapOn: false``; a dedicated ``cgroupRoot`` per node so teardown can
kill and remove exactly its containers; every port on loopback, except the kubelet's server,
which listens on the node's IP (a host-local address on an interface of its own, see ``node_ip``);
containerd's CDI spec directory is the directory the plugin writes to; the sandbox image is
pinned (there is no registry to pull from).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodePaths:
    root: Path

    @property
    def root_hash(self) -> str:
        """Hex SHA-256 of the root: the host-wide names (cgroup, links, IPs) derive from it, so
        nodes in different directories never share one."""
        return hashlib.sha256(str(self.root).encode()).hexdigest()

    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def plugin_registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def containerd_config(
    paths: NodePaths, *, runc: Path, cni_bin_dir: Path, cdi_dirs: tuple[Path, ...], sandbox: str
) -> str:
    d, q = paths.containerd_dir, _toml_str
    cdi = ", ".join(q(p) for p in cdi_dirs)
    return f"""\
version = 3
root = {q(d / "root")}
state = {q(d / "state")}

[grpc]
  address = {q(paths.containerd_socket)}

[ttrpc]
  address = {q(str(paths.containerd_socket) + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(d / "opt")}

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(sandbox)}

[plugins."io.containerd.cri.v1.runtime"]
  cdi_spec_dirs = [{cdi}]
  netns_mounts_under_state_dir = true
  # These VMs give root no CAP_SYS_RESOURCE: an oom_score_adj below containerd's own is refused.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(runc)}
        Root = {q(d / "runc")}
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(cni_bin_dir)}]
    conf_dir = {q(paths.cni_conf_dir)}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def bridge_name(paths: NodePaths) -> str:
    # Linux limits interface names to 15 bytes; the hash keeps concurrent nodes apart.
    return "dragpu" + paths.root_hash[:8]


def cgroup_root(paths: NodePaths, name: str) -> str:
    """The node's cgroup parent: unique per node directory, so that two sessions running a node
    of the same name never kill or remove each other's containers."""
    return f"/dra-gpu-{name}-" + paths.root_hash[:8]


def node_link(paths: NodePaths) -> str:
    """Name of the interface carrying the node's IP."""
    return "dragpuip" + paths.root_hash[:7]


def node_ip(paths: NodePaths) -> str:
    """The node's InternalIP: kubelet refuses a loopback node IP, and the API server reaches the
    kubelet (logs, exec) at its InternalIP. An address of the benchmarking range 198.18.0.0/15 on
    an interface of its own is local to this host only and collides with no real network."""
    digest = bytes.fromhex(paths.root_hash)
    return f"198.18.{digest[0]}.{1 + digest[1] % 254}"


def pod_subnet(paths: NodePaths, *, taken: Iterable[str] = ()) -> str:
    """A /24 of 10.244.0.0/16 for the node's pods: derived from its directory, skipping subnets
    whose gateway address is already on this host (another node's bridge)."""
    used = set(taken)
    first = int(paths.root_hash[8:10], 16)
    for step in range(256):
        third = (first + step) % 256
        if f"10.244.{third}.1" not in used:
            return f"10.244.{third}.0/24"
    raise RuntimeError("every 10.244.x.0/24 pod subnet is in use on this host")


def cni_config(paths: NodePaths, *, network: str, subnet: str) -> str:
    conf = {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge_name(paths),
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.cni_ipam_dir),
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


@dataclass(frozen=True)
class KubeletPorts:
    server: int
    healthz: int


def kubelet_config(
    paths: NodePaths, *, ports: KubeletPorts, client_ca: Path, cgroup_root: str, address: str
) -> str:
    config = {
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "address": address,
        "port": ports.server,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.healthz,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "imageServiceEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.root / "volume-plugins"),
        # The API server reaches the kubelet (logs, exec) with a client cert from the cluster CA.
        "authentication": {
            "x509": {"clientCAFile": str(client_ca)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Shared dev machines: never evict test pods because the disk is fuller than a
        # production node would allow; never garbage-collect the locally built images.
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "resolvConf": "/etc/resolv.conf",
        "shutdownGracePeriod": "0s",
    }
    return json.dumps(config, indent=2) + "\n"
