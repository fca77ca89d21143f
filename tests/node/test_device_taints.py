"""GPU health events taint devices, and the real scheduler, kubelet and control plane act on it.

The plugin of ``gpu-h200`` (eight simulated H200s) is restarted with a short quiet period;
events are injected through its command file (``dra-gpu health inject``). Then:
- an application XID (13) changes nothing; XID 92 taints its GPU NoSchedule (a restart of the
  plugin keeps the taint as it was), and a new claim that can only use that GPU is not
  allocated;
- XID 48 (double-bit ECC) taints the GPU of a running Deployment's pod NoExecute: the control
  plane (device-taint-eviction controller) evicts the pod, its claim is released, and the
  replacement lands on a healthy GPU;
- XID 94 (NoSchedule) under the running replacement leaves it running, and the kubelet shows
  its device Unhealthy in the pod's ``allocatedResourcesStatus``;
- after the quiet period the driver's taints are gone, but an administrator's DeviceTaintRule
  still keeps the waiting claim off gpu-1; once the rule is deleted the claim gets its GPU, and
  the replacement's device is Healthy again.
The node's usual plugin is restored afterwards.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from plugin_swap import replacing
from test_pod_device_health import device_health

from e2e.cluster import Cluster
from e2e.deployed.env import REAL_NODE_SELECTOR
from e2e.driver import Driver, PluginProcess
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube, wait_for

NODE = "gpu-h200"
QUIET_S = 25
IMAGE = "localhost/dra-gpu/busybox:1.35"
PIN = "test-pin-gpu-h200-gpu-1"


def inject(state_dir: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "dra_gpu", "health", "--state-dir", str(state_dir), *args],
        check=True,
        capture_output=True,
    )


def node_devices(kube: Kube) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in kube.slices()
        if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == "gpu.nvidia.com"
        for d in s["spec"].get("devices") or []
    }


def taints(kube: Kube) -> dict[str, list[tuple[str, str]]]:
    return {
        name: [(t["key"], t["effect"]) for t in d["taints"]]
        for name, d in node_devices(kube).items()
        if d.get("taints")
    }


def pin_rule(name: str, device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": device},
            "taint": {
                "key": "example.com/pinned",
                "value": "waiting-for-rma",
                "effect": "NoSchedule",
            },
        },
    }


def restored(plugin: PluginProcess) -> int:
    """How often the plugin restored taints at its start (the log is kept across restarts)."""
    return plugin.log_path.read_text(errors="replace").count("restored the taints")


def pod_spec(claim: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeSelector": {**REAL_NODE_SELECTOR, "kubernetes.io/hostname": NODE},
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "ctr",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 100000 & wait'],
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", **claim}],
    }


def claim_template(name: str, selector: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pods_of(kube: Kube, namespace: str, app: str) -> list[dict[str, Any]]:
    found = kube.core.list_namespaced_pod(namespace, label_selector=f"app={app}")
    return [
        kube.as_dict(p) for p in found.items if not (p.metadata and p.metadata.deletion_timestamp)
    ]


def allocated_device(kube: Kube, namespace: str, pod: dict[str, Any]) -> str | None:
    for status in pod.get("status", {}).get("resourceClaimStatuses") or []:
        claim = kube.claim(namespace, status.get("resourceClaimName") or "")
        results = ((claim or {}).get("status", {}).get("allocation") or {}).get("devices", {})
        for result in results.get("results") or []:
            return str(result["device"])
    return None


def test_taints_keep_new_claims_off_evict_pods_and_clear(
    driver: Driver, cluster: Cluster, real_nodes: dict[str, Node], kube: Kube, tmp_path: Path
) -> None:
    config = tmp_path / "health.yaml"
    config.write_text(f"quietPeriodSeconds: {QUIET_S}\n")
    usual = driver.plugins[NODE]
    plugin = PluginProcess.for_node(
        real_nodes[NODE],
        kubeconfig=cluster.kubeconfig,
        profile="h200x8",
        extra=["--health-config", str(config)],
    )
    state = plugin.dirs.state
    namespace = f"taints-{uuid.uuid4().hex[:6]}"
    pinned = False
    with replacing(usual, plugin), contextlib.ExitStack() as cleanup:
        kube.create_namespace(namespace)
        cleanup.callback(kube.delete_namespace, namespace)

        def unpin() -> None:
            if pinned:
                kube.custom.delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "devicetaintrules", PIN
                )

        cleanup.callback(unpin)
        devices = wait_for("gpu-h200's slices", lambda: node_devices(kube) or None, timeout=60)

        # application XID on gpu-0, then XID 92 on gpu-1: once gpu-1 shows, gpu-0 was handled
        inject(state, "inject", "gpu-0", "xid", "13")
        inject(state, "inject", "gpu-1", "xid", "92")
        seen = wait_for("gpu-1 tainted", lambda: taints(kube) or None, timeout=30)
        assert seen == {"gpu-1": [("gpu.nvidia.com/xid-92", "NoSchedule")]}

        # a restarted plugin keeps the taint as it was (restored from its slices)
        before = node_devices(kube)["gpu-1"]["taints"]
        registrations, restores = plugin.registrations(), restored(plugin)
        plugin.stop()
        plugin.start()
        plugin.wait_registered(after=registrations)
        assert restored(plugin) == restores + 1
        for _ in range(6):  # the new instance has published by now: nothing may change
            assert node_devices(kube)["gpu-1"]["taints"] == before
            time.sleep(0.5)

        uuid1 = devices["gpu-1"]["attributes"]["uuid"]["string"]
        kube.create(
            namespace,
            claim_template("gpu-1", f'device.attributes["gpu.nvidia.com"].uuid == "{uuid1}"'),
        )
        kube.create(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "wants-gpu-1"},
                "spec": pod_spec({"resourceClaimTemplateName": "gpu-1"}),
            },
        )

        # a Deployment's pod on some healthy GPU, then that GPU reports a double-bit ECC error
        kube.create(namespace, claim_template("any-gpu"))
        kube.create(
            namespace,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "worker"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "worker"}},
                    "template": {
                        "metadata": {"labels": {"app": "worker"}},
                        "spec": pod_spec({"resourceClaimTemplateName": "any-gpu"}),
                    },
                },
            },
        )

        def running_worker() -> tuple[str, str, str] | None:
            for pod in pods_of(kube, namespace, "worker"):
                device = allocated_device(kube, namespace, pod)
                if pod["status"].get("phase") == "Running" and device:
                    claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
                    return pod["metadata"]["name"], claim, device
            return None

        first, first_claim, bad = wait_for("the worker running", running_worker, timeout=120)
        assert bad != "gpu-1"
        assert kube.pod(namespace, "wants-gpu-1")["status"].get("phase") == "Pending"
        inject(state, "inject", bad, "xid", "48")
        wait_for(
            "the worker evicted",
            lambda: not kube.pod_exists(namespace, first) or None,
            timeout=60,
        )
        wait_for(
            "its claim released",
            lambda: kube.claim(namespace, first_claim) is None or None,
            timeout=60,
        )
        replacement, _, good = wait_for(
            "the replacement running",
            lambda: ((w := running_worker()) and w[0] != first and w) or None,
            timeout=120,
        )
        assert good not in (bad, "gpu-1"), good
        assert taints(kube)[bad] == [("gpu.nvidia.com/xid-48", "NoExecute")]
        assert kube.pod(namespace, "wants-gpu-1")["status"].get("phase") == "Pending"

        # a NoSchedule fault under a running pod: it stays, and the kubelet shows it Unhealthy
        inject(state, "inject", good, "xid", "94")

        def health_of_good() -> str | None:
            return device_health(kube.pod(namespace, replacement)).get(good) or None

        wait_for(
            f"{good} Unhealthy in the pod's status",
            lambda: health_of_good() == "Unhealthy" or None,
            timeout=60,
        )
        assert kube.pod(namespace, replacement)["status"]["phase"] == "Running"

        # an administrator pins gpu-1 with a DeviceTaintRule (docs/concepts/device-health.md)
        kube.custom.create_cluster_custom_object(
            "resource.k8s.io", "v1", "devicetaintrules", pin_rule(PIN, "gpu-1")
        )
        pinned = True

        # quiet period over: every taint of the driver goes, but the pin holds
        wait_for("the taints cleared", lambda: not taints(kube) or None, timeout=QUIET_S + 60)
        time.sleep(5)
        assert kube.pod(namespace, "wants-gpu-1")["status"].get("phase") == "Pending"
        kube.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules", PIN)
        pinned = False

        def on_gpu1() -> bool | None:
            pod = kube.pod(namespace, "wants-gpu-1")
            device = allocated_device(kube, namespace, pod)
            return (pod["status"].get("phase") == "Running" and device == "gpu-1") or None

        wait_for("wants-gpu-1 running on gpu-1", on_gpu1, timeout=120)
        wait_for(f"{good} Healthy again", lambda: health_of_good() == "Healthy" or None, timeout=60)
