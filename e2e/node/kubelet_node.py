"""A real Kubernetes node on this machine: containerd (with CDI) + runc + kubelet as processes.

``Node(cluster).up()`` starts, in order: containerd with its own root/state/socket and a CNI
bridge network, imports the locally built sandbox and test images into its ``k8s.io`` namespace,
then the kubelet with a node client certificate (CN ``system:node:<name>``, O ``system:nodes``)
from the cluster's CA, and waits until the Node object is Ready. ``down()`` (idempotent, also run
at interpreter exit) stops the kubelet, kills every container through containerd, stops
containerd, then removes what the processes leave behind: shims, container processes, mounts under
the node's directory, its cgroup root, its bridge, and the directory itself. A SIGTERM or Ctrl-C
of the process runs the same ``down()`` (``e2e.procs``); after a SIGKILL, the next node's start
does it from the node's record (``e2e.node.cleanup``).

Invariants:
- Everything the node writes is under ``paths.root`` (see ``e2e.node.config``), except the cgroup
  ``/dra-gpu-<name>-<hash>``, the CNI bridge and the interface holding the node IP, all three
  named after the node and removed by ``down()``.
- The DRA kubelet plugin registers through ``paths.plugin_registry_dir`` (the kubelet's real
  registry directory) and writes CDI specs to ``cdi_root``, which containerd reads.
- Each daemon runs in its own session (process group), so a kill reaches its children too.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from e2e import binaries, procs, waiting
from e2e.images import node_images as images
from e2e.node import cleanup as node_cleanup
from e2e.node.binaries import NodeBinaries, ensure_node_binaries
from e2e.node.config import (
    KubeletPorts,
    NodePaths,
    bridge_name,
    cgroup_root,
    cni_config,
    containerd_config,
    kubelet_config,
    node_ip,
    node_link,
    pod_subnet,
)

if TYPE_CHECKING:
    from e2e.cluster import Cluster

Log = Callable[[str], None]
_SUBNETS: set[str] = set()  # pod subnets of this process's live nodes


def _log_stderr(line: str) -> None:
    print(line, flush=True)


class Node:
    def __init__(
        self,
        cluster: Cluster,
        *,
        name: str = "dra-gpu-node",
        workdir: Path | None = None,
        cdi_root: Path | None = None,
        log: Log = _log_stderr,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self._own_dir = workdir is None
        root = workdir or Path(tempfile.mkdtemp(prefix=f"dra-gpu-{name}-"))
        self.paths = NodePaths(root)
        self.cdi_root = cdi_root or root / "cdi"
        self.cgroup_root = cgroup_root(self.paths, name)
        self.ip = node_ip(self.paths)
        self.subnet = ""
        self.log = log
        self.ports = KubeletPorts(*procs.free_ports(2))
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._bins: NodeBinaries | None = None
        self._up = False

    # -- lifecycle -----------------------------------------------------------------------------

    def up(self, *, timeout: float = 120.0) -> Node:
        """Build what is missing, then start the node and wait until it is Ready. ``timeout``
        covers only the start: its clock starts after the builds, which take minutes the first
        time (a budget spent on the build left a cold ``make demo`` 0 s to wait for the node)."""
        self._bins = ensure_node_binaries()
        kubelet = binaries.ensure(("kubelet",), log=self.log)["kubelet"]
        archives = images.ensure_images(images.cache_dir())
        started = time.monotonic()
        for root in node_cleanup.reap_stale():
            self.log(f"[node] cleaned up after a killed run: {root}")
        self._up = True
        atexit.register(self.down)
        node_cleanup.register(self._record())  # before it owns anything a kill would leave
        self.paths.root.mkdir(parents=True, exist_ok=True)
        try:
            self._write_configs()
            node_cleanup.create_cgroup(self.cgroup_root)
            node_cleanup.add_address_link(node_link(self.paths), self.ip)
            self._start_containerd()
            self.import_archives(archives)
            self._start_kubelet(kubelet)
            self._wait_ready(deadline=started + timeout)
        except BaseException:
            self.log(self.diagnostics())
            self.down()
            raise
        self.log(
            f"[node] {self.name} Ready in {time.monotonic() - started:.1f}s ({self.paths.root})"
        )
        return self

    def __enter__(self) -> Node:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def down(self) -> None:
        if not self._up:
            return
        self._up = False
        atexit.unregister(self.down)
        self._stop("kubelet")
        self._kill_all_containers()
        self._stop("containerd")
        node_cleanup.clean(self._record())
        _SUBNETS.discard(self.subnet)

    # -- pieces --------------------------------------------------------------------------------

    def _record(self) -> node_cleanup.NodeRecord:
        return node_cleanup.owned_by_this_process(
            self.paths.root,
            containerd_socket=str(self.paths.containerd_socket),
            cgroup=self.cgroup_root,
            links=(bridge_name(self.paths), node_link(self.paths)),
            remove_root=self._own_dir,
        )

    @property
    def bins(self) -> NodeBinaries:
        if self._bins is None:
            raise RuntimeError("node binaries are only known after up()")
        return self._bins

    def _write_configs(self) -> None:
        p = self.paths
        dirs = (p.containerd_dir, p.cni_conf_dir, p.cni_ipam_dir, p.logs, p.pod_logs)
        for d in (*dirs, p.plugin_registry_dir, p.plugins_dir, self.cdi_root):
            d.mkdir(parents=True, exist_ok=True)
        p.containerd_config.write_text(
            containerd_config(
                p,
                runc=self.bins.runc,
                cni_bin_dir=self.bins.cni_bin_dir,
                cdi_dirs=(self.cdi_root,),
                sandbox=images.PAUSE_IMAGE,
            )
        )
        (p.cni_conf_dir / "10-dra-gpu.conflist").write_text(
            cni_config(
                p,
                network=f"dra-gpu-{self.name}",
                subnet=self._claim_subnet(),
            )
        )
        ca = p.root / "ca.crt"
        ca.write_bytes(self.cluster.ca_cert.read_bytes())
        p.kubelet_config.write_text(
            kubelet_config(
                p, ports=self.ports, client_ca=ca, cgroup_root=self.cgroup_root, address=self.ip
            )
        )
        cert, key = self.cluster.issue_client_cert(f"system:node:{self.name}", ["system:nodes"])
        self.cluster.write_kubeconfig(p.kubeconfig, cert, key)

    def _claim_subnet(self) -> str:
        # A bridge gets its gateway address only with its first pod: nodes of this process
        # also avoid each other's subnets explicitly.
        taken = [*node_cleanup.host_addresses(), *(s.replace(".0/24", ".1") for s in _SUBNETS)]
        self.subnet = pod_subnet(self.paths, taken=taken)
        _SUBNETS.add(self.subnet)
        return self.subnet

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self._procs[name] = procs.spawn(argv, log_path=self.log_path(name), env=env)

    def _start_containerd(self) -> None:
        path = f"{self.bins.containerd_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        env = {**os.environ, "PATH": path}
        argv = [str(self.bins.containerd), "--config", str(self.paths.containerd_config)]
        self._spawn("containerd", argv, env)

        def answers() -> bool:
            if self.ctr("version", check=False).returncode == 0:
                return True
            self._check_alive("containerd")
            return False

        waiting.wait_for("containerd to answer on its socket", answers, timeout=30)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd, in the CRI (``k8s.io``) namespace."""
        argv = [str(self.bins.ctr), "--address", str(self.paths.containerd_socket)]
        return subprocess.run(
            [*argv, "--namespace", "k8s.io", *args], capture_output=True, text=True, check=check
        )

    def import_archives(self, archives: dict[str, Path]) -> None:
        present = set(self.ctr("images", "list", "--quiet").stdout.split())
        for name, archive in archives.items():
            if name not in present:
                self.ctr("images", "import", str(archive))

    def _start_kubelet(self, kubelet: Path) -> None:
        p = self.paths
        argv = [
            str(kubelet),
            f"--config={p.kubelet_config}",
            f"--kubeconfig={p.kubeconfig}",
            f"--root-dir={p.kubelet_root}",
            f"--cert-dir={p.kubelet_root / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            "--node-labels=dra-gpu.test/real-node=true",
            "--v=2",
        ]
        self._spawn("kubelet", argv)

    def _wait_ready(self, *, deadline: float) -> None:
        from kubernetes import client  # the harness may use the client; the driver's core not

        core = client.CoreV1Api(self.cluster.api_client())

        def ready() -> bool:
            self._check_alive("containerd")
            self._check_alive("kubelet")
            status = core.read_node(self.name).status
            conditions = (status.conditions if status else None) or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        waiting.wait_for(
            f"node {self.name} to be Ready",
            ready,
            timeout=max(0.0, deadline - time.monotonic()),
            every=0.5,
            retry_on=(client.ApiException,),
        )

    def _check_alive(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}; see {self.log_path(name)}")

    def _stop(self, name: str, *, grace: float = 10.0) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None:
            procs.stop(proc, grace_s=grace)

    def _kill_all_containers(self) -> None:
        """SIGKILL every task and delete every container, so containerd unmounts their roots."""
        if self._bins is None or "containerd" not in self._procs:
            return
        listed = self.ctr("tasks", "list", "--quiet", check=False).stdout.split()
        for task in listed:
            self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
        for task in listed:
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "list", "--quiet", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    # -- introspection -------------------------------------------------------------------------

    def log_path(self, name: str) -> Path:
        return self.paths.logs / f"{name}.log"

    def diagnostics(self, *, lines: int = 40) -> str:
        parts = []
        for name in ("containerd", "kubelet"):
            path = self.log_path(name)
            if path.is_file():
                tail = procs.log_tail(path, lines)
                count = len(tail.splitlines())
                parts.append(f"--- {name} ({path}), last {count} lines ---\n{tail}")
        return "\n".join(parts)

    def cdi_specs(self) -> list[Path]:
        """The CDI spec files currently in the directory containerd reads."""
        return sorted(self.cdi_root.glob("*.json")) + sorted(self.cdi_root.glob("*.yaml"))

    def summary(self) -> dict[str, str]:
        return {
            "name": self.name,
            "root": str(self.paths.root),
            "plugin_registry_dir": str(self.paths.plugin_registry_dir),
            "plugins_dir": str(self.paths.plugins_dir),
            "cdi_root": str(self.cdi_root),
            "containerd_socket": str(self.paths.containerd_socket),
        }

    def __repr__(self) -> str:
        return f"Node({json.dumps(self.summary())})"
