"""A run of the harness to be stopped mid-way by ``test_interrupted_run.py``.

``python tests/node/interrupted_run.py WORKDIR``: a control plane and one real node whose root is
where the deployed kit puts its nodes (``e2e.deployed.env.node_root``), with a pod running on it;
then ``WORKDIR/node-root`` names the node's root, and the run waits to be stopped. It tears down
as the kits do (``with``), so a SIGTERM takes the same path as the end of a normal run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from e2e.cluster import Cluster
from e2e.deployed.env import RELEASES, node_root, nodes_root
from e2e.images import node_images
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube, wait_for

POD = "held"


def pod(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "ctr",
                    "image": node_images.TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "sleep 100000"],
                }
            ],
        },
    }


def main(workdir: Path) -> None:
    release = RELEASES[0]
    root = node_root(nodes_root(workdir), release)
    with (
        Cluster(workdir=workdir / "cluster") as cluster,
        Node(cluster, name=release.node, workdir=root) as node,
    ):
        kube = Kube(cluster.api_client())
        kube.create("default", pod(node.name))

        def running() -> bool | None:
            return kube.pod("default", POD).get("status", {}).get("phase") == "Running" or None

        wait_for(f"pod {POD} to run", running, timeout=120)
        (workdir / "node-root").write_text(str(node.paths.root))
        time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
