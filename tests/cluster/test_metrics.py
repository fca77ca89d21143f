"""``/metrics`` of the real plugin and controller processes after real work, and the Events a
failed prepare leaves on the pod and the claim.

Plugin: a simulated node (``a100x4-mig``) runs the kubelet plugin with ``--metrics-address``;
the real scheduler allocates a claim on it; the test, acting as the kubelet, prepares it twice
(idempotent), prepares a claim whose UID does not match (fails), and unprepares. The scraped
series must count exactly those calls and claims, with the failure's error kind, and the
prepared/published gauges must say what the node holds.

Controller: one replica with leader election and the webhook; an AdmissionReview with an
invalid GpuConfig and a valid one are posted to the webhook. The scrape must show one refusal,
one allowed review, the lease held, and a DeviceClass reconcile pass.

Events: a claim whose MigDeviceConfig names an unknown sharing strategy is allocated (no webhook
here), and prepare refuses it; a ``PrepareFailed`` Warning naming the field appears on the
claim and on its pod, once however often the kubelet retries.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.controller import classes
from dra_gpu.kube.client import KubeClient, connect
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from e2e import procs, waiting
from e2e.cluster import Cluster
from e2e.driver import PluginDirs, plugin_argv
from e2e.probes import Series, scrape
from e2e.probes import sample as value

NS = "default"
WAIT_S = 60.0  # bounds a broken test only


def reachable(port: int) -> Series | None:
    try:
        return scrape(port)
    except OSError:
        return None


# --- plugin --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin(cluster: Cluster) -> Iterator[tuple[str, Path, int, KubeClient]]:
    node = f"mx-{uuid.uuid4().hex[:6]}"
    cluster.register_node(node)
    root = Path(tempfile.mkdtemp(prefix="mx-"))  # short: unix socket paths <= 107 bytes
    (port,) = procs.free_ports(1)
    argv = plugin_argv(
        node_name=node,
        kubeconfig=cluster.kubeconfig,
        profile="a100x4-mig",
        dirs=PluginDirs.under(root),
        extra=("--metrics-address", f"127.0.0.1:{port}"),
    )
    proc = procs.spawn(argv, log_path=root / "plugin.log", env={"PATH": "/usr/bin:/bin"})
    kube = connect(cluster.kubeconfig)
    try:
        for desired in classes.builtin_classes(extended_resource_name=None):
            cluster.kubectl("apply", "-f", "-", input=json.dumps(desired.body()))
        waiting.wait_for("the plugin's /metrics", lambda: reachable(port), timeout=WAIT_S)
        # /metrics is served before the DRA socket (the prepare state is restored in between).
        dra = PluginDirs.under(root).data / "dra.sock"
        waiting.wait_for("the plugin's DRA socket", dra.is_socket, timeout=WAIT_S)
        yield node, root, port, kube
    finally:
        procs.stop(proc)
        kube.close()
        shutil.rmtree(root, ignore_errors=True)


def allocated_claim(
    kube: KubeClient,
    node: str,
    name: str,
    config: dict[str, Any] | None = None,
    device_class: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    devices: dict[str, Any] = {"requests": [request]}
    if config is not None:
        devices["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": config}}]
    kube.request(
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": devices},
        },
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=pod)
    path = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{name}"

    def allocated() -> dict[str, Any] | None:
        claim = kube.request("GET", path)
        return claim if (claim.get("status") or {}).get("allocation") else None

    return waiting.wait_for(f"claim {name} allocated", allocated, timeout=WAIT_S)


def call(socket: Path, method: str, *claims: tuple[str, str]) -> dict[str, str]:
    refs = [dra_v1_pb2.Claim(uid=uid, namespace=NS, name=name) for uid, name in claims]
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response: Any
        if method == "prepare":
            response = stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=refs), timeout=30
            )
        else:
            response = stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=refs), timeout=30
            )
    return {uid: entry.error for uid, entry in response.claims.items()}


def test_plugin_metrics_count_what_the_kubelet_asked(
    plugin: tuple[str, Path, int, KubeClient],
) -> None:
    node, root, port, kube = plugin
    claim = allocated_claim(kube, node, f"{node}-gpu")
    good = (claim["metadata"]["uid"], claim["metadata"]["name"])
    wrong_uid = (str(uuid.uuid4()), claim["metadata"]["name"])
    socket = PluginDirs.under(root).data / "dra.sock"

    assert call(socket, "prepare", good) == {good[0]: ""}
    assert call(socket, "prepare", good) == {good[0]: ""}  # idempotent: counted again
    (error,) = call(socket, "prepare", wrong_uid).values()
    assert error, "a claim whose UID does not match must fail"

    s = scrape(port)
    assert value(s, "dra_gpu_plugin_calls_total", operation="prepare") == 3
    assert (
        value(s, "dra_gpu_plugin_claims_total", operation="prepare", result="ok", error_kind="")
        == 2
    )
    failed = {
        dict(labels)["error_kind"]: v
        for (name, labels), v in s.items()
        if name == "dra_gpu_plugin_claims_total" and dict(labels)["result"] == "error"
    }
    assert list(failed.values()) == [1] and "" not in failed, failed
    assert value(s, "dra_gpu_plugin_call_duration_seconds_count", operation="prepare") == 3
    assert value(s, "dra_gpu_plugin_calls_in_flight", operation="prepare") == 0
    assert value(s, "dra_gpu_plugin_prepared_claims") == 1
    assert value(s, "dra_gpu_plugin_prepared_devices") == 1
    published = {
        tuple(v for _, v in labels): n
        for (name, labels), n in s.items()
        if name == "dra_gpu_plugin_published_devices"
    }
    assert published == {("HEALTHY", "gpu"): 1, ("HEALTHY", "mig"): 9}, published
    # The driver's own series have bounded labels (the GPU telemetry series name devices).
    driver = [labels for name, labels in s if name.startswith("dra_gpu_plugin_")]
    assert driver and not any("uid" in k for labels in driver for k, _ in labels)

    assert call(socket, "unprepare", good) == {good[0]: ""}
    s = scrape(port)
    assert (
        value(s, "dra_gpu_plugin_claims_total", operation="unprepare", result="ok", error_kind="")
        == 1
    )
    assert value(s, "dra_gpu_plugin_prepared_claims") == 0
    assert value(s, "dra_gpu_plugin_prepared_devices") == 0


def events_about(kube: KubeClient, kind: str, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    items: list[dict[str, Any]] = (
        kube.request(
            "GET", f"/api/v1/namespaces/{NS}/events", query={"fieldSelector": selector}
        ).get("items")
        or []
    )
    return [e for e in items if e["reason"] == "PrepareFailed"]


def test_failed_prepare_is_an_event_on_the_pod_and_the_claim(
    plugin: tuple[str, Path, int, KubeClient],
) -> None:
    node, root, port, kube = plugin
    bad = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "Sometimes"},
    }
    # A MIG device: the node's one full GPU is held by the other test's claim.
    claim = allocated_claim(kube, node, f"{node}-bad", bad, "mig.nvidia.com")
    ref = (claim["metadata"]["uid"], claim["metadata"]["name"])
    socket = PluginDirs.under(root).data / "dra.sock"
    failed = {"operation": "prepare", "result": "error", "error_kind": "PlanError"}
    before = value(scrape(port), "dra_gpu_plugin_claims_total", **failed) or 0
    for _ in range(3):  # the kubelet retries
        (error,) = call(socket, "prepare", ref).values()
        assert "strategy" in error, error

    def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        on_claim = events_about(kube, "ResourceClaim", ref[1])
        on_pod = events_about(kube, "Pod", ref[1])
        return (on_claim, on_pod) if on_claim and on_pod else None

    on_claim, on_pod = waiting.wait_for("PrepareFailed events", both, timeout=WAIT_S)
    for event in on_claim + on_pod:
        assert event["type"] == "Warning"
        assert node in event["message"] and "strategy" in event["message"], event["message"]
    assert on_claim[0]["involvedObject"]["uid"] == ref[0]
    assert len(on_claim) == 1 and len(on_pod) == 1, "a retried failure is posted once"
    assert value(scrape(port), "dra_gpu_plugin_claims_total", **failed) == before + 3


# --- controller ----------------------------------------------------------------------------


def review(port: int, ca: Path, params: dict[str, Any]) -> dict[str, Any]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "probe", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}],
            }
        },
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "operation": "CREATE",
            "namespace": NS,
            "name": "probe",
            "object": claim,
        },
    }
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/validate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(request, timeout=10, context=context) as resp:
        answer: dict[str, Any] = json.loads(resp.read())["response"]
    return answer


def test_controller_metrics_count_reviews_reconciles_and_leadership(
    cluster: Cluster, tmp_path: Path
) -> None:
    webhook_port, metrics_port = procs.free_ports(2)
    lease = f"mx-{uuid.uuid4().hex[:6]}"
    argv = [
        *(sys.executable, "-m", "dra_gpu", "controller", "--kubeconfig", str(cluster.kubeconfig)),
        *("--webhook-port", str(webhook_port), "--webhook-address", "127.0.0.1"),
        *("--cert-dir", str(tmp_path / "certs"), "--lease-namespace", NS, "--lease-name", lease),
        *("--metrics-address", f"127.0.0.1:{metrics_port}"),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = procs.spawn(argv, log_path=tmp_path / "controller.log", env=env)
    try:

        def leading() -> Series | None:
            s = reachable(metrics_port)
            return s if s and value(s, "dra_gpu_controller_leader") == 1 else None

        waiting.wait_for("the controller to lead", leading, timeout=WAIT_S)
        ca = tmp_path / "certs" / "ca.crt"
        bad = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "x": 1}
        good = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
        assert review(webhook_port, ca, bad)["allowed"] is False
        assert review(webhook_port, ca, good)["allowed"] is True

        def reconciled() -> Series | None:
            s = scrape(metrics_port)
            return s if value(s, "dra_gpu_deviceclass_reconciles_total", result="ok") else None

        s = waiting.wait_for("a reconcile pass", reconciled, timeout=WAIT_S)
        reviews = "dra_gpu_webhook_reviews_total"
        assert value(s, reviews, kind="ResourceClaim", verdict="refused") == 1
        assert value(s, reviews, kind="ResourceClaim", verdict="allowed") == 1
        assert value(s, "dra_gpu_webhook_review_duration_seconds_count") == 2
    finally:
        procs.stop(proc)
    assert "Traceback" not in (tmp_path / "controller.log").read_text()
