"""A GPU driver upgrade under the running plugin, with the real kubelet, scheduler and API server.

The plugin of ``gpu-h200`` is restarted on a profile *file* (eight H200s, driver 580.159.04); a
pod takes one GPU and runs. Then the file unloads the driver (``driverLoaded: false``, what NVML
answers while the GPU Operator has the kernel modules out), and:
- every device of the node is tainted ``gpu.nvidia.com/driver-unavailable`` (NoSchedule) in the
  ResourceSlices, still published;
- a pod whose claim tolerates that taint is allocated a GPU, and the kubelet's prepare is
  refused naming the driver state (the plugin's ``PrepareFailed`` Event on the pod); the pod
  waits;
- the running pod's claim keeps its checkpoint record and its CDI spec, byte for byte.
Then the file loads driver 590.48.01 (CUDA 13.1): the devices are published with the new
``driverVersion`` and ``cudaDriverVersion`` and without the taint, the kubelet's retry prepares
the waiting pod and it runs, the first pod's record and spec are still as they were, and the
Node has the outage's two Events. The node's usual plugin is restored afterwards.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

from plugin_swap import replacing

from dra_gpu.prepare.checkpoint import FILE_NAME as CHECKPOINT
from e2e.cluster import Cluster
from e2e.deployed.env import REAL_NODE_SELECTOR
from e2e.driver import Driver, PluginProcess
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube, wait_for

NODE = "gpu-h200"
DRIVER = "gpu.nvidia.com"
KEY = f"{DRIVER}/driver-unavailable"
IMAGE = "localhost/dra-gpu/busybox:1.35"
PROFILE = (
    'driverVersion: "{version}"\ncudaDriverVersion: "{cuda}"\ndriverLoaded: {loaded}\n'
    "gpus:\n  - product: H200-141GB\n    count: 8\n"
)
WAIT_S = 120.0


def node_devices(kube: Kube) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in kube.slices()
        if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or []
    }


def taint_keys(device: dict[str, Any]) -> list[str]:
    return [t["key"] for t in device.get("taints") or []]


def version(device: dict[str, Any], name: str) -> str:
    return str(device["attributes"][name]["version"])


def claim_template(name: str, *, tolerates: bool) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if tolerates:
        exactly["tolerations"] = [{"key": KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
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
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


def running_claim(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The pod's claim once the pod runs."""
    found = kube.pod(namespace, name)
    if found["status"].get("phase") != "Running":
        return None
    (status,) = found["status"]["resourceClaimStatuses"]
    return kube.claim(namespace, status["resourceClaimName"])


def prepared(plugin: PluginProcess, uid: str) -> tuple[Any, bytes]:
    """The claim's checkpoint record and its CDI spec's bytes."""
    records = json.loads((plugin.dirs.state / CHECKPOINT).read_text())["claims"]
    (spec,) = [p for p in plugin.dirs.cdi_root.iterdir() if uid in p.name]
    return records[uid], spec.read_bytes()


def messages(kube: Kube, namespace: str, involved: str) -> list[str]:
    return [f"{e.get('reason')}: {e.get('message')}" for e in kube.events(namespace, involved)]


def test_a_driver_upgrade_taints_refuses_keeps_and_publishes_the_new_version(
    driver: Driver, cluster: Cluster, real_nodes: dict[str, Node], kube: Kube, tmp_path: Path
) -> None:
    profile = tmp_path / "h200x8.yaml"
    profile.write_text(PROFILE.format(version="580.159.04", cuda="13.0", loaded="true"))
    plugin = PluginProcess.for_node(
        real_nodes[NODE], kubeconfig=cluster.kubeconfig, profile=str(profile)
    )
    namespace = f"reload-{uuid.uuid4().hex[:6]}"
    with replacing(driver.plugins[NODE], plugin), contextlib.ExitStack() as cleanup:
        kube.create_namespace(namespace)
        cleanup.callback(kube.delete_namespace, namespace)
        kube.create(namespace, claim_template("any-gpu", tolerates=False))
        kube.create(namespace, claim_template("through-the-upgrade", tolerates=True))
        kube.create(namespace, pod("before", "any-gpu"))
        claim = wait_for(
            "the first pod running",
            lambda: running_claim(kube, namespace, "before"),
            timeout=WAIT_S,
        )
        uid = claim["metadata"]["uid"]
        kept = prepared(plugin, uid)

        # the driver unloaded: every device tainted, still published
        profile.write_text(PROFILE.format(version="580.159.04", cuda="13.0", loaded="false"))

        def all_tainted() -> dict[str, dict[str, Any]] | None:
            devices = node_devices(kube)
            return (
                devices if devices and all(KEY in taint_keys(d) for d in devices.values()) else None
            )

        devices = wait_for("every device tainted", all_tainted, timeout=60)
        assert len(devices) == 8
        (taint,) = devices["gpu-0"]["taints"]
        assert taint["effect"] == "NoSchedule"
        assert taint["value"].startswith("nvmlinit-driver-not-loaded.")

        # a claim that tolerates the taint is allocated; its prepare is refused, naming why
        kube.create(namespace, pod("during", "through-the-upgrade"))

        def refused(reason: str) -> str | None:
            return next(
                (
                    m
                    for m in messages(kube, namespace, "during")
                    if m.startswith(f"{reason}: ") and "driver is unavailable" in m
                ),
                None,
            )

        # the kubelet's own Event, then the plugin's
        wait_for(
            "the kubelet's refusal",
            lambda: refused("FailedPrepareDynamicResources"),
            timeout=WAIT_S,
        )
        message = wait_for("the plugin's Event", lambda: refused("PrepareFailed"), timeout=WAIT_S)
        assert "(nvmlInit: Driver Not Loaded)" in message and "the kubelet retries" in message
        assert kube.pod(namespace, "during")["status"].get("phase") == "Pending"
        assert kube.pod(namespace, "before")["status"]["phase"] == "Running"
        assert prepared(plugin, uid) == kept

        # driver 590.48.01 loaded: the new versions published, the taint gone
        profile.write_text(PROFILE.format(version="590.48.01", cuda="13.1", loaded="true"))

        def upgraded() -> dict[str, dict[str, Any]] | None:
            devices = node_devices(kube)
            done = devices and all(
                version(d, "driverVersion") == "590.48.1" and not taint_keys(d)
                for d in devices.values()
            )
            return devices if done else None

        devices = wait_for("the new version published, untainted", upgraded, timeout=60)
        assert len(devices) == 8
        assert {version(d, "cudaDriverVersion") for d in devices.values()} == {"13.1.0"}

        # the kubelet's retry prepares the waiting pod; the first pod's claim as it was
        wait_for(
            "the waiting pod running",
            lambda: running_claim(kube, namespace, "during"),
            timeout=WAIT_S,
        )
        assert prepared(plugin, uid) == kept
        node_events = messages(kube, "default", NODE)
        assert any(m.startswith("GpuDriverUnavailable: ") for m in node_events), node_events
        restored = [m for m in node_events if m.startswith("GpuDriverRestored: ")]
        assert restored and "580.159.04 -> 590.48.01 (CUDA 13.1)" in restored[-1], node_events
