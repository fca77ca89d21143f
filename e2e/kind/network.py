"""The kit's pod network for node images without kindnetd: what kindnetd does, once, from here.

Every node gets a CNI config for its ``spec.podCIDR`` (``ptp`` + ``host-local``, kindnetd's own
choice) and a route to every other node's pod CIDR through that node's address on the kind
network. Run after ``kind create cluster`` with ``networking.disableDefaultCNI: true``; a node
is Ready once containerd sees its config. Nodes are kind's containers, reached with
``docker exec`` (``DOCKER_HOST`` names the engine); the API with ``kubectl`` (``KUBECONFIG``).

CLI: ``python -m e2e.kind.network`` (what ``e2e/kind/run.sh`` runs as its ``KIND_AFTER_CREATE``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONFLIST = "/etc/cni/net.d/10-dra-gpu-kind.conflist"


@dataclass(frozen=True)
class NodeNet:
    name: str
    pod_cidr: str
    address: str


def node_nets(nodes: dict[str, Any]) -> list[NodeNet]:
    """Name, pod CIDR and internal address of each node of a ``kubectl get nodes -o json``;
    a node without a pod CIDR yet is left out."""
    found = []
    for node in nodes.get("items", []):
        cidr = node.get("spec", {}).get("podCIDR")
        addresses = node.get("status", {}).get("addresses", [])
        internal = [a["address"] for a in addresses if a.get("type") == "InternalIP"]
        if cidr and internal:
            found.append(NodeNet(node["metadata"]["name"], cidr, internal[0]))
    return found


def conflist(pod_cidr: str) -> str:
    config = {
        "cniVersion": "1.0.0",
        "name": "dra-gpu-kind",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": "/run/cni-ipam-state",
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": pod_cidr}]],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def node_script(me: NodeNet, nodes: list[NodeNet]) -> str:
    """The shell run on ``me``: its CNI config, routes to the other nodes' pods."""
    lines = [
        "set -e",
        f"mkdir -p {shlex.quote(CONFLIST.rsplit('/', 1)[0])}",
        f"printf %s {shlex.quote(conflist(me.pod_cidr))} > {CONFLIST}",
    ]
    lines += [f"ip route replace {n.pod_cidr} via {n.address}" for n in nodes if n != me]
    return "\n".join(lines)


def _wait_for_cidrs(timeout: float = 120.0) -> list[NodeNet]:
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["kubectl", "get", "nodes", "-o", "json"], check=True, capture_output=True, text=True
        ).stdout
        data = json.loads(out)
        nets = node_nets(data)
        if nets and len(nets) == len(data.get("items", [])):
            return nets
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes without a pod CIDR after {timeout:.0f} s: {out[-2000:]}")
        time.sleep(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m e2e.kind.network",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    nets = _wait_for_cidrs()
    for me in nets:
        script = node_script(me, nets)
        subprocess.run(["docker", "exec", me.name, "sh", "-c", script], check=True)
        print(f"[kind-network] {me.name}: {me.pod_cidr} via {me.address}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
