"""``dra-gpu validate`` on a real node (kubelet + containerd), its plugin started as the demo and
the chart start it: every check passes, one line each, and the result is recorded on the Node.

Cases: on ``gpu-h200`` (eight simulated H200, GFD's labels on) validate prints PASS for node,
plugin (its /readyz: registered with the kubelet), slices (matching the node labels), pod (the
check pod saw exactly its device; its claim an ordinary one, since ``default`` lacks the
admin-access label, the line saying how to add it) and cdi (the claim's spec gone after the
pod), exits 0, labels the node ``gpu.nvidia.com/validated=<version>`` and posts a
``GpuNodeValidated`` Event; nothing it created is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import dra_gpu
from e2e.cluster import Cluster
from e2e.images import node_images
from e2e.node.kubelet_node import Node

NODE = "gpu-h200"


def test_validate_passes_step_by_step_on_a_real_node(
    cluster: Cluster, real_nodes: dict[str, Node], driver: Any
) -> None:
    plugin = driver.plugins[NODE]
    node = real_nodes[NODE]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "dra_gpu", "validate", "--node", NODE),
            *("--kubeconfig", str(cluster.kubeconfig), "--namespace", "default"),
            *("--plugin-readyz", f"http://127.0.0.1:{plugin.healthz_port}/readyz"),
            *("--image", node_images.TEST_IMAGE, "--cdi-root", str(node.cdi_root)),
            *("--timeout", "120"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    print(done.stdout)  # the report, for -rP (docs/user/node-pools.md quotes it)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split(":")[0] for line in lines[:5]] == [
        "PASS  node",
        "PASS  plugin",
        "PASS  slices",
        "PASS  pod",
        "PASS  cdi",
    ], done.stdout
    assert "matching discovery (8 x NVIDIA-H200)" in lines[2]
    assert "saw exactly gpu-" in lines[3]
    # ``default`` lacks the admin-access label: an ordinary claim, and the line says how to fix it.
    assert lines[3].endswith(
        "its claim was an ordinary one (no admin access: namespace default lacks the label "
        "resource.kubernetes.io/admin-access=true; "
        "kubectl label namespace default resource.kubernetes.io/admin-access=true)"
    ), lines[3]
    assert lines[-1] == f"node {NODE}: validation passed (plugin version {dra_gpu.__version__})"

    labels = json.loads(cluster.kubectl("get", "node", NODE, "-o", "json"))["metadata"]["labels"]
    assert labels["gpu.nvidia.com/validated"] == dra_gpu.__version__
    events = json.loads(
        cluster.kubectl(
            "get",
            "events",
            "-n",
            "default",
            "-o",
            "json",
            f"--field-selector=involvedObject.name={NODE},reason=GpuNodeValidated",
        )
    )["items"]
    assert events and events[-1]["type"] == "Normal"
    left = json.loads(
        cluster.kubectl(
            "get",
            "pods,resourceclaims",
            "-n",
            "default",
            "-o",
            "json",
            "-l",
            "app.kubernetes.io/name=dra-gpu-validate",
        )
    )["items"]
    assert left == []
    cluster.kubectl("label", "node", NODE, "gpu.nvidia.com/validated-")
