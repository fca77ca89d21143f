"""A real kube-proxy for the local cluster's real nodes, so pods reach Services.

Pods of the chart find the API server as every pod does: ``KUBERNETES_SERVICE_HOST`` is the
ClusterIP of the ``kubernetes`` Service, which only kube-proxy's NAT rules make reachable. The
API server's own calls to the admission webhook need no kube-proxy (``--enable-aggregator-routing``
resolves a Service to its endpoints), but pods do.

All real nodes of this harness share the host's network namespace, so one kube-proxy serves them
all (two would rewrite each other's chains). It runs in iptables mode with its own identity
(``system:kube-proxy``, which the bootstrap RBAC binds to ``system:node-proxier``). Only one may
run on the host at a time: ``up()`` takes a host-wide file lock and holds it until ``down()``,
which stops the process and then runs ``kube-proxy --cleanup`` to remove every rule it added,
leaving the host's netfilter tables as they were.

What its rules touch: the ``nat`` table's PREROUTING/OUTPUT jump to ``KUBE-SERVICES``, which
matches only this cluster's Service IPs (``10.0.0.0/24``); ``KUBE-FORWARD`` accepts traffic it
marked and drops conntrack-INVALID packets. The nodes' bridge CNI (no masquerading, no port maps)
adds no rule of its own, so nothing of theirs is overwritten.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from e2e import binaries, procs
from e2e.locked_daemon import LockedDaemon

if TYPE_CHECKING:
    from e2e.cluster import Cluster

Log = Callable[[str], None]
HOST_LOCK = Path("/run/dra-gpu-kube-proxy.lock")
USER = "system:kube-proxy"


def proxy_config(*, kubeconfig: Path, hostname: str, healthz_port: int, metrics_port: int) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": hostname,
        "mode": "iptables",
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # Leave the host's conntrack table size and route_localnet alone.
        "conntrack": {"maxPerCore": 0},
        "iptables": {"localhostNodePorts": False},
        "nodePortAddresses": ["primary"],
    }
    return json.dumps(config, indent=2) + "\n"


class KubeProxy:
    def __init__(self, cluster: Cluster, *, hostname: str, workdir: Path, log: Log) -> None:
        self.cluster, self.hostname, self.workdir, self._log = cluster, hostname, workdir, log
        self.log_path = workdir / "kube-proxy.log"
        self._binary: Path | None = None
        self._daemon = LockedDaemon("kube-proxy", lock_path=HOST_LOCK, log_path=self.log_path)

    def up(self, *, timeout: float = 60.0) -> KubeProxy:
        binary = binaries.ensure(("kube-proxy",), log=self._log)["kube-proxy"]
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = self.cluster.issue_client_cert(USER)
        kubeconfig = self.workdir / "kube-proxy.kubeconfig"
        self.cluster.write_kubeconfig(kubeconfig, cert, key)
        healthz, metrics = procs.free_ports(2)
        config = self.workdir / "kube-proxy.json"
        config.write_text(
            proxy_config(
                kubeconfig=kubeconfig,
                hostname=self.hostname,
                healthz_port=healthz,
                metrics_port=metrics,
            )
        )

        def synced() -> bool:
            rules = subprocess.run(
                ["iptables-save", "-t", "nat"], capture_output=True, text=True
            ).stdout
            return "KUBE-SVC-" in rules  # the `kubernetes` Service has its chain

        self._binary = binary
        self._daemon.start(
            [str(binary), f"--config={config}", "--v=2"],
            ready=synced,
            what="kube-proxy's Service rules",
            timeout=timeout,
            every=0.5,
        )
        return self

    def down(self) -> None:
        self._daemon.stop()
        if self._binary is not None:
            # Removes every chain and rule kube-proxy made (all modes).
            subprocess.run([str(self._binary), "--cleanup"], capture_output=True, check=False)
            self._binary = None

    def __enter__(self) -> KubeProxy:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
