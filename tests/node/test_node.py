"""The real node itself: it registers and is Ready, and runs a plain pod from the local image."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from e2e.cluster import Cluster
from e2e.node import kubelet_node as node_module
from e2e.node.binaries import ensure_node_binaries
from e2e.node.cleanup import NodeRecord, process_identity, reap_stale, register, registered
from e2e.node.kubelet_node import Node
from e2e.suite import views
from e2e.suite.kube import Kube, load_manifests, wait_for
from e2e.suite.runner import SCENARIOS_DIR


def _plain_pod(node: str) -> dict[str, object]:
    # The scenario pod's script, without any claim: it reports an empty device list.
    (template,) = [d for d in load_manifests(SCENARIOS_DIR / "one-gpu") if d["kind"] == "Pod"]
    container = {k: v for k, v in template["spec"]["containers"][0].items() if k != "resources"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [container],
        },
    }


def test_real_nodes_are_ready_and_report_their_runtime(
    real_nodes: dict[str, Node], kube: Kube
) -> None:
    for name in real_nodes:
        node = kube.as_dict(kube.core.read_node(name))
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")


def test_a_pod_without_claims_runs_and_sees_no_gpu(real_nodes: dict[str, Node], kube: Kube) -> None:
    name = next(iter(real_nodes))
    namespace = "plain-pod"
    kube.create_namespace(namespace)
    try:
        kube.create(namespace, _plain_pod(name))
        view = wait_for(
            "the plain pod's report",
            lambda: _report(kube, namespace),
            timeout=120,
        )
        assert view.device_paths == frozenset()
        assert view.device_names == frozenset()
        assert kube.pod(namespace, "plain")["status"]["phase"] == "Running"
    finally:
        kube.delete_namespace(namespace)


def _report(kube: Kube, namespace: str) -> views.ContainerView | None:
    pod = kube.pod(namespace, "plain")
    if (pod.get("status") or {}).get("phase") != "Running":
        return None
    try:
        return views.parse_report(kube.log(namespace, "plain", "ctr"))
    except views.LogIncomplete:
        return None


def test_a_node_left_by_a_killed_run_is_reaped_and_a_live_one_is_not(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    registry = tmp_path / "registry"
    roots = {}
    for name, pid in (("dead", dead.pid), ("live", os.getpid())):
        root = tmp_path / f"dg-{name}" / "h200"  # the deployed kit's layout
        (root / "kubelet").mkdir(parents=True)
        record = NodeRecord(
            root=str(root),
            containerd_socket=str(root / "c.sock"),
            cgroup=f"/dra-gpu-test-{name}",
            links=(f"dragpunone{name}",),
            owner_pid=pid,
            owner_started=process_identity(pid),
            remove_root=True,
        )
        register(record, registry)
        roots[name] = root
    assert reap_stale(registry) == [str(roots["dead"])]
    assert not roots["dead"].exists()
    assert [r.root for r in registered(registry)] == [str(roots["live"])]


def test_a_build_longer_than_the_budget_leaves_the_whole_budget_to_the_node(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first ``make demo`` built the kubelet for minutes inside the node's 120 s budget,
    then waited 0 s for the node and fell back to simulated nodes. Here the build (the real one,
    already cached) is made to take longer than the whole budget, by moving the clock past it
    while it runs; the node must still come up, with the full budget for its start."""
    budget = 90.0
    skew = 0.0
    real_monotonic = time.monotonic

    def slow_build() -> object:
        nonlocal skew
        skew += budget + 1
        return ensure_node_binaries()

    monkeypatch.setattr(time, "monotonic", lambda: real_monotonic() + skew)
    monkeypatch.setattr(node_module, "ensure_node_binaries", slow_build)
    node = Node(cluster, name="slow-build")
    try:
        node.up(timeout=budget)  # the bug: WaitTimeout "timed out after 0s waiting for node ..."
        assert skew > budget  # the slow build did run inside up()
    finally:
        node.down()
