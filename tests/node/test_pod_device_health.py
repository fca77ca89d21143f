"""Device health reaches the pod's status through the real kubelet.

The plugin of ``gpu-h200`` is restarted on a profile *file* with the same eight H200s. A pod takes
all eight; then the file loses the last GPU, as if it stopped answering NVML. The kubelet,
listening to the plugin's health stream, must show that device Unhealthy in the pod's
``allocatedResourcesStatus`` (feature ResourceHealthStatus, on by default since 1.36), and
Healthy again once the GPU is back. The node's usual plugin is restored afterwards.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from plugin_swap import replacing

from e2e.cluster import Cluster
from e2e.driver import Driver, PluginProcess
from e2e.node.kubelet_node import Node
from e2e.suite import runner
from e2e.suite.kube import wait_for
from e2e.suite.runner import Context
from e2e.suite.scenarios import BY_NAME

NODE = "gpu-h200"
PROFILE = "gpus:\n  - product: H200-141GB\n    count: {count}\n"


def device_health(pod: dict[str, Any]) -> dict[str, str]:
    """Device name -> health, over the pod's containers.

    The kubelet names a device by its first CDI device ID (``<kind>=<claim UID>-<device>``).
    """
    found: dict[str, str] = {}
    for status in pod["status"].get("containerStatuses") or []:
        for claim in status.get("allocatedResourcesStatus") or []:
            for resource in claim.get("resources") or []:
                device = resource["resourceID"].split("=", 1)[-1].split("-", 5)[-1]
                found[device] = resource.get("health", "")
    return found


def test_lost_gpu_shows_unhealthy_in_the_pod_status(
    suite: Context,
    driver: Driver,
    cluster: Cluster,
    real_nodes: dict[str, Node],
    tmp_path: Path,
) -> None:
    ctx = dataclasses.replace(
        suite, node_selector={**suite.node_selector, "kubernetes.io/hostname": NODE}
    )
    usual = driver.plugins[NODE]
    profile = tmp_path / "h200x8.yaml"
    profile.write_text(PROFILE.format(count=8))
    watched = PluginProcess.for_node(
        real_nodes[NODE], kubeconfig=cluster.kubeconfig, profile=str(profile)
    )
    run = None
    with replacing(usual, watched):
        try:
            run, problems = runner.start(ctx, BY_NAME["all-gpus-reusable"])
            assert not problems, problems
            pod = next(iter(run.pods))
            lost = "gpu-7"

            def health_of_lost() -> str | None:
                return device_health(ctx.kube.pod(run.namespace, pod)).get(lost) or None

            assert wait_for("the health of gpu-7", health_of_lost, timeout=60) == "Healthy"
            profile.write_text(PROFILE.format(count=7) + "# gpu-7 stopped answering\n")

            def unhealthy() -> bool | None:
                return health_of_lost() == "Unhealthy" or None

            wait_for("gpu-7 Unhealthy in the pod's status", unhealthy, timeout=60)
            others = device_health(ctx.kube.pod(run.namespace, pod))
            assert {k: v for k, v in others.items() if k != lost} == {
                f"gpu-{i}": "Healthy" for i in range(7)
            }

            profile.write_text(PROFILE.format(count=8))

            def healthy_again() -> bool | None:
                return health_of_lost() == "Healthy" or None

            wait_for("gpu-7 Healthy again", healthy_again, timeout=60)
        finally:
            problems = runner.finish(ctx, run) if run is not None else []
    assert not problems, problems
