"""Pod created -> Running on the real local node, with one GPU claim and without any claim.

``.venv/bin/python bench/pod_startup.py [--runs 10]``

Brings up the local control plane, one real node (kubelet + containerd, profile ``h200x8``), the
kubelet plugin and the controller; then, alternating, creates a pod using the ``one-gpu``
scenario's ResourceClaimTemplate and the same pod without claims, and times each from the create
call to the first watch event showing it Running. Each pod is deleted (and, for the claim, its
CDI spec gone) before the next, so every run starts from the same state. The difference of the
medians is the share of DRA: the claim's creation by the resourceclaim controller, the
scheduler's allocation, and the kubelet's NodePrepareResources call into the plugin.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kubernetes import watch

from e2e.cluster import Cluster
from e2e.driver import Driver, PluginProcess, controller_process
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube, load_manifests, wait_for
from e2e.suite.runner import SCENARIOS_DIR

NAMESPACE = "bench"


def _manifests() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(claim template, pod with the claim, the same pod without claims)."""
    docs = load_manifests(SCENARIOS_DIR / "one-gpu")
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    with_claim = next(d for d in docs if d["kind"] == "Pod")
    plain = copy.deepcopy(with_claim)
    plain["metadata"]["name"] = "no-claim"
    plain["spec"].pop("resourceClaims")
    for container in plain["spec"]["containers"]:
        container.pop("resources", None)
    return template, with_claim, plain


def time_to_running(kube: Kube, pod: dict[str, Any], *, timeout: float = 120.0) -> float:
    name = pod["metadata"]["name"]
    stream = watch.Watch()
    start = time.monotonic()
    kube.create(NAMESPACE, pod)
    try:
        for event in stream.stream(
            kube.core.list_namespaced_pod,
            NAMESPACE,
            field_selector=f"metadata.name={name}",
            timeout_seconds=int(timeout),
        ):
            if event["object"].status.phase == "Running":
                return time.monotonic() - start
    finally:
        stream.stop()
    raise TimeoutError(f"pod {name} not Running within {timeout:.0f}s")


def delete_and_wait(kube: Kube, node: Node, name: str) -> None:
    kube.delete_pods(NAMESPACE, [name])
    gone = lambda: None if kube.pod_exists(NAMESPACE, name) else True  # noqa: E731
    wait_for(f"pod {name} deleted", gone, timeout=60)
    wait_for("CDI specs removed", lambda: None if node.cdi_specs() else True, timeout=60)


def summarize(label: str, samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return (
        f"{label:<24} median {statistics.median(ms):7.0f} ms   "
        f"min {ms[0]:6.0f}   max {ms[-1]:6.0f}   (n={len(ms)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    template, with_claim, plain = _manifests()
    with Cluster() as cluster:
        node = Node(cluster, name="bench-gpu").up()
        log = node.paths.logs
        controller = controller_process(kubeconfig=cluster.kubeconfig, log_path=log / "ctl.log")
        plugin = PluginProcess.for_node(node, kubeconfig=cluster.kubeconfig, profile="h200x8")
        try:
            controller.start()
            plugin.start()
            kube = Kube(cluster.api_client())
            Driver(controller, {node.name: plugin}).wait_ready(kube)
            kube.create_namespace(NAMESPACE)
            kube.create(NAMESPACE, template)
            # One unmeasured pod of each kind: the first pulls nothing but warms every cache.
            samples: dict[str, list[float]] = {"with one GPU claim": [], "without claims": []}
            for run in range(args.runs + 1):
                for label, pod in (("with one GPU claim", with_claim), ("without claims", plain)):
                    seconds = time_to_running(kube, pod)
                    delete_and_wait(kube, node, pod["metadata"]["name"])
                    if run:
                        samples[label].append(seconds)
            print(f"pod created -> Running on a real node ({args.runs} runs each, after a warm-up)")
            for label, values in samples.items():
                print(summarize(label, values))
            share = statistics.median(samples["with one GPU claim"]) - statistics.median(
                samples["without claims"]
            )
            print(f"{'DRA share (difference)':<24} {share * 1000:7.0f} ms")
        finally:
            plugin.stop()
            controller.stop()
            node.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
