"""The GPU demo's node-label and validate steps (``e2e.gpu.demo``), run here on a real node with
simulated GPUs: the code a GPU run takes, short of NVML.

Cases: on ``gpu-h200`` (eight simulated H200, its plugin with ``--node-labels true`` and
``/readyz``) the demo's label checks pass (the labels equal the slices and are
``node_labels``'s computation from the devices; the wanted labels come from the simulated
backend where the demo asks NVML) and print the ``kubectl get nodes -L`` row and every
``nvidia.com/`` label; the demo's validate step runs ``dra-gpu validate`` with the demo's check
image and reads its real output: exit 0, PASS for the five steps in order, the Node labelled,
nothing of validate left; only the UUID check fails, as it must without a GPU: the check image
has no ``nvidia-smi`` of its own, and a simulated GPU's CDI spec mounts no driver files.
"""

from __future__ import annotations

import argparse
from typing import Any

from dra_gpu.devices import node_labels as compute
from dra_gpu.plugin import inventory, platforms
from e2e.cluster import Cluster
from e2e.gpu import demo, gfd_labels, image, validate_node
from e2e.images import node_images
from e2e.node.kubelet_node import Node
from e2e.suite import node_labels
from e2e.suite.kube import Kube

NODE = "gpu-h200"
PROFILE = "h200x8"  # conftest.NODE_PROFILES[NODE]


def test_the_gpu_demos_label_and_validate_steps_on_a_real_node(
    cluster: Cluster, real_nodes: dict[str, Node], kube: Kube, driver: Any
) -> None:
    node = real_nodes[NODE]
    plugin = driver.plugins[NODE]
    node.import_archives({image.CHECK_IMAGE: image.ensure_check_image(node_images.cache_dir())})
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=PROFILE, node_name=NODE))
    )
    wanted = gfd_labels.Wanted(
        compute.node_labels(devices), {d.name: d.uuid or "" for d in devices}
    )
    # The plugin labelled the Node when the session started: what it had before is the Node's
    # labels outside nvidia.com/ (so the "added outside" check is not tested here; unit tests).
    now = node_labels.node_labels_of(kube, NODE)
    before = {k: v for k, v in now.items() if not k.startswith(compute.PREFIX)}
    args = argparse.Namespace(wait=120.0)
    report = demo.Report()
    published = demo.published_devices(kube, NODE)
    kube.create_namespace(demo.NAMESPACE)
    try:
        demo.check_labels(report, kube, node, published, before=before, wanted=wanted, args=args)
        demo.check_validate(
            report, kube, node, plugin, published, kubeconfig=cluster.kubeconfig, args=args
        )
    finally:
        cluster.kubectl("label", "node", NODE, f"{validate_node.LABEL}-")
        kube.delete_namespace(demo.NAMESPACE)
    verdicts = {what: (ok, detail) for what, ok, detail in report.checks}
    uuid_check = "validate's check pod saw its one device, nvidia-smi -L naming that GPU's UUID"
    assert not verdicts.pop(uuid_check)[0]
    assert all(ok for ok, _detail in verdicts.values()), report.checks
    assert len(verdicts) == 6, report.checks

    labels = report.sections[f"GFD node labels of {NODE} (the plugin, --node-labels true)"]
    assert labels[2].split() == [NODE, "NVIDIA-H200", "8", "143771", "equal"]
    assert "nvidia.com/gpu.count=8" in labels
    shown = report.sections[f"dra-gpu validate --node {NODE}"]
    assert shown[0].startswith(f"$ dra-gpu validate --node {NODE} ")
    assert [line.split(":")[0] for line in shown[1:6]] == [
        "PASS  node",
        "PASS  plugin",
        "PASS  slices",
        "PASS  pod",
        "PASS  cdi",
    ], shown
