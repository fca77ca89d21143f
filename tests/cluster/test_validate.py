"""``dra-gpu validate``'s bad input against a real API server: it says what is wrong, stops,
exits 1, and records the failure on a node that exists.

Cases: a node that does not exist fails the first check naming it, the other checks skipped,
nothing recorded; a node without the plugin fails the ``plugin`` check naming the node and the
DaemonSet to look at, its ``validated`` label is removed and a ``GpuNodeValidationFailed``
Warning Event on the Node says why; the check claim, as the API server takes it: in a namespace
without the label ``resource.kubernetes.io/admin-access=true`` the claim with admin access is
refused and validate makes an ordinary one, saying how to label the namespace; with the label
the claim keeps its admin access.
"""

from __future__ import annotations

import json
import subprocess
import sys

from dra_gpu.kube.client import connect
from dra_gpu.validate import steps
from dra_gpu.validate.command import Options, Validation
from e2e.cluster import Cluster


def validate(cluster: Cluster, node: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "dra_gpu", "validate", "--node", node),
            *("--kubeconfig", str(cluster.kubeconfig), "--timeout", "10"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_a_node_that_does_not_exist(cluster: Cluster) -> None:
    done = validate(cluster, "no-such-node")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "FAIL  node: node no-such-node does not exist "
        "[layer 0. the cluster, docs/user/troubleshooting.md; look at: kubectl get nodes]",
        "SKIP  plugin",
        "SKIP  slices",
        "SKIP  pod",
        "SKIP  cdi",
        f"node no-such-node: validation FAILED (plugin version {_version()})",
    ]


def test_a_node_without_the_plugin_fails_naming_it(cluster: Cluster) -> None:
    node = "validate-bare"
    cluster.register_node(node)
    cluster.kubectl("label", "--overwrite", "node", node, "gpu.nvidia.com/validated=0.1.0")
    done = validate(cluster, node)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"PASS  node: node {node} exists"
    assert lines[1].startswith(
        f"FAIL  plugin: no kubelet plugin pod on node {node} "
        "(pods labelled app.kubernetes.io/name=dra-gpu,app.kubernetes.io/component=kubelet-plugin) "
        "[layer 1. the plugin pod (its DaemonSet), docs/user/troubleshooting.md; "
        "look at: kubectl get ds -A"
    ), lines[1]
    assert lines[2:5] == ["SKIP  slices", "SKIP  pod", "SKIP  cdi"]
    assert (
        f"recorded on node {node}: label gpu.nvidia.com/validated removed, "
        "Event GpuNodeValidationFailed" in lines
    )
    labels = json.loads(cluster.kubectl("get", "node", node, "-o", "json"))["metadata"]["labels"]
    assert "gpu.nvidia.com/validated" not in labels
    events = json.loads(
        cluster.kubectl(
            "get",
            "events",
            "-n",
            "default",
            "-o",
            "json",
            f"--field-selector=involvedObject.name={node},reason=GpuNodeValidationFailed",
        )
    )["items"]
    (event,) = events
    assert event["type"] == "Warning"
    assert f"no kubelet plugin pod on node {node}" in event["message"]


def _version() -> str:
    import dra_gpu

    return dra_gpu.__version__


def test_the_check_claim_has_admin_access_only_in_a_labelled_namespace(cluster: Cluster) -> None:
    namespace = "validate-admin"
    cluster.create_namespace(namespace)
    client = connect(cluster.kubeconfig)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"

    def create() -> tuple[str | None, dict[str, object]]:
        validation = Validation(client, Options(node="n1", namespace=namespace), say=print)
        because = validation._create_claim(claims)
        (made,) = client.request("GET", claims)["items"]
        validation._clean_up()
        return because, made

    because, made = create()
    assert because == (
        f"no admin access: namespace {namespace} lacks the label "
        f"resource.kubernetes.io/admin-access=true; "
        f"kubectl label namespace {namespace} resource.kubernetes.io/admin-access=true"
    )
    assert not steps.admin_access_kept(made), "an ordinary claim in its place"

    cluster.kubectl("label", "namespace", namespace, "resource.kubernetes.io/admin-access=true")
    because, made = create()
    assert because is None
    assert steps.admin_access_kept(made)
    assert client.request("GET", claims)["items"] == [], "validate deletes its claim"
