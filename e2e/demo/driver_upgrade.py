"""The demo's driver-upgrade step, after the table: one node's driver 580.159.04 -> 590.48.01.

The node is ``demo-h200-shared`` (its GPUs are the least used: the scenarios stay off it). Its
plugin runs on a profile *file* with the built-in ``h200x8`` GPUs (the same UUIDs, buses and NUMA
nodes: ``driver_profile``), so the step can do to it what the GPU
Operator does to a node's driver: the file first unloads the driver (``driverLoaded: false``),
then loads 590.48.01 (CUDA 13.1). Meanwhile it shows, from the API server and the plugin's
files: every device tainted ``gpu.nvidia.com/driver-unavailable``; a pod whose claim tolerates
the taint allocated, and its prepare refused naming the driver state (on a real node the
kubelet's attempt, in the pod's Events; on a simulated one NodePrepareResources called as the
kubelet would); the new versions published and the taint gone; the pod prepared on the
kubelet's retry; the prepared claims' CDI specs and checkpoint records unchanged; the Node's
``GpuDriverRestored`` Event. docs/concepts/device-health.md says what operators see and do.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.cluster import SIMULATED_TOLERATION
from e2e.demo.driver_profile import NEW, write_profile
from e2e.demo.env import DRIVER_UPGRADE_NODE, REAL_NODE_LABEL, DemoState, NodeInfo
from e2e.suite.kube import Kube, WaitTimeout, wait_for

NODE = DRIVER_UPGRADE_NODE
NAMESPACE = "demo-driver-upgrade"
POD = "through-the-upgrade"
DRIVER = "gpu.nvidia.com"
KEY = f"{DRIVER}/driver-unavailable"
WAIT_S = 90.0


def manifests(real: bool) -> list[dict[str, Any]]:
    """A claim template that tolerates the taint, and a pod pinned to the node."""
    toleration = {"key": KEY, "operator": "Exists", "effect": "NoSchedule"}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": POD},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {"deviceClassName": DRIVER, "tolerations": [toleration]},
                        }
                    ]
                }
            }
        },
    }
    placement: dict[str, Any] = {"nodeSelector": {"kubernetes.io/hostname": NODE}}
    if real:
        placement["nodeSelector"] |= dict([REAL_NODE_LABEL])
    else:
        placement["tolerations"] = [dict(SIMULATED_TOLERATION)]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            **placement,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "ctr",
                    "image": "localhost/dra-gpu/busybox:1.35",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 100000 & wait'],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": POD}],
        },
    }
    return [template, pod]


# ----- what is read back ----------------------------------------------------------------------


def node_devices(kube: Kube) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in kube.slices()
        if s["spec"].get("nodeName") == NODE and s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or []
    }


def _outage_taint(device: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((t for t in device.get("taints") or [] if t.get("key") == KEY), None)


def _versions(devices: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(driverVersion, cudaDriverVersion) as published; several joined when they differ."""

    def of(name: str) -> str:
        found = {str(d["attributes"][name]["version"]) for d in devices.values()}
        return ",".join(sorted(found))

    return of("driverVersion"), of("cudaDriverVersion")


def prepared_files(node: NodeInfo) -> dict[str, str]:
    """Each CDI spec's and the checkpoint's claim records' digest: what must not change."""
    out = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        for path in sorted(Path(node.cdi_root).glob("*.json"))
    }
    checkpoint = Path(node.state_dir) / "checkpoint.json"
    claims = json.loads(checkpoint.read_text()).get("claims", {}) if checkpoint.exists() else {}
    for uid, record in sorted(claims.items()):
        out[f"record {uid}"] = hashlib.sha256(
            json.dumps(record, sort_keys=True).encode()
        ).hexdigest()[:12]
    return out


@dataclass(frozen=True)
class Seen:
    """What the step saw, for :func:`section`."""

    node: str
    before: tuple[str, str]
    after: tuple[str, str]
    tainted: int
    devices: int
    taint: str  # key=value:effect
    refused: str
    after_taints: int
    retried: str
    kept: tuple[int, int]  # CDI specs, checkpoint records (of prepared claims) compared
    changed: tuple[str, ...]  # those that changed (none expected)
    restored_event: str
    seconds: float


def section(seen: Seen) -> str:
    """The lines printed after the table."""
    specs, records = seen.kept
    kept = (
        f"prepared claims kept: {specs} CDI specs and {records} checkpoint records unchanged"
        if not seen.changed
        else f"CHANGED: {', '.join(seen.changed)}"
    )
    return "\n".join(
        [
            f"Driver upgrade on {seen.node} (docs/concepts/device-health.md), {seen.seconds:.0f} "
            "s:",
            f"  published driverVersion {seen.before[0]} -> {seen.after[0]}, "
            f"cudaDriverVersion {seen.before[1]} -> {seen.after[1]}",
            f"  driver unloaded: {seen.tainted}/{seen.devices} devices tainted {seen.taint}",
            f"  prepare refused: {seen.refused}",
            f"  driver 590.48.01 loaded: {seen.after_taints} devices tainted; {seen.retried}",
            f"  {kept}",
            f"  Node Event {seen.restored_event}",
        ]
    )


# ----- the step -------------------------------------------------------------------------------


def _refused_on_real_node(kube: Kube) -> str:
    def refused() -> str | None:
        for event in kube.events(NAMESPACE, POD):
            if "driver is unavailable" in str(event.get("message")):
                return f"(pod Event {event.get('reason')}) {event.get('message')}"
        return None

    return wait_for("the prepare refused (pod Events)", refused, timeout=WAIT_S)


def _prepare_call(kube: Kube, node: NodeInfo) -> Callable[[], str]:
    """NodePrepareResources for the pod's claim, as the kubelet would: its error, or ""."""
    from e2e.demo import prepare as demo_prepare

    def call() -> str:
        pod = kube.pod(NAMESPACE, POD)
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = kube.claim(NAMESPACE, status["resourceClaimName"]) or {}
        uid = claim["metadata"]["uid"]
        answer = demo_prepare.prepare(
            Path(node.dra_socket), [(NAMESPACE, uid, status["resourceClaimName"])]
        )[uid]
        return answer if isinstance(answer, str) else ""

    return call


def _allocated(kube: Kube) -> bool | None:
    pod = kube.pod(NAMESPACE, POD)
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    if not statuses:
        return None
    claim = kube.claim(NAMESPACE, statuses[0].get("resourceClaimName") or "")
    return bool(claim and (claim.get("status") or {}).get("allocation")) or None


def _node_event(kube: Kube, reason: str) -> str | None:
    events = [e for e in kube.events("default", NODE) if e.get("reason") == reason]
    return f"{reason}: {events[-1].get('message')}" if events else None


def run(kube: Kube, state: DemoState) -> str:
    """Upgrade the node's driver; the section that says what was seen (or what did not come)."""
    try:
        return _run(kube, state)
    except WaitTimeout as exc:
        return f"Driver upgrade on {NODE} (docs/concepts/device-health.md): FAILED: {exc}"


def _run(kube: Kube, state: DemoState) -> str:
    node = next(n for n in state.nodes if n.name == NODE)
    path = Path(node.profile_file)
    started = time.monotonic()
    before = _versions(node_devices(kube))
    kept_before = prepared_files(node)

    write_profile(path, loaded=False)

    def tainted() -> dict[str, dict[str, Any]] | None:
        devices = node_devices(kube)
        return devices if devices and all(_outage_taint(d) for d in devices.values()) else None

    devices = wait_for(f"{NODE}'s devices tainted", tainted, timeout=WAIT_S)
    taint = _outage_taint(devices["gpu-0"]) or {}
    kube.create_namespace(NAMESPACE)
    for doc in manifests(node.real):
        kube.create(NAMESPACE, doc)
    wait_for("the tolerating claim allocated", lambda: _allocated(kube), timeout=WAIT_S)
    call = _prepare_call(kube, node)
    refused = _refused_on_real_node(kube) if node.real else call()

    write_profile(path, driver=NEW, loaded=True)

    def upgraded() -> dict[str, dict[str, Any]] | None:
        devices = node_devices(kube)
        done = devices and all(
            not _outage_taint(d) and d["attributes"]["driverVersion"]["version"] == "590.48.1"
            for d in devices.values()
        )
        return devices if done else None

    after = wait_for("the new driver published", upgraded, timeout=WAIT_S)
    if node.real:
        wait_for(
            "the pod running",
            lambda: kube.pod(NAMESPACE, POD)["status"].get("phase") == "Running" or None,
            timeout=WAIT_S,
        )
        retried = f"pod {NAMESPACE}/{POD} Running (the kubelet retried its prepare)"
    else:
        error = call()
        retried = f"prepare of {NAMESPACE}/{POD}'s claim " + (
            "succeeded (as the kubelet's retry would)" if not error else f"failed: {error}"
        )
    restored = wait_for(
        "the Node's GpuDriverRestored Event",
        lambda: _node_event(kube, "GpuDriverRestored"),
        timeout=WAIT_S,
    )
    kept_after = prepared_files(node)
    changed = tuple(k for k, v in kept_before.items() if kept_after.get(k) != v)
    return section(
        Seen(
            node=NODE,
            before=before,
            after=_versions(after),
            tainted=len(devices),
            devices=len(devices),
            taint=f"{taint.get('key')}={taint.get('value')}:{taint.get('effect')}",
            refused=refused,
            after_taints=sum(1 for d in after.values() if d.get("taints")),
            retried=retried,
            kept=(
                sum(1 for k in kept_before if not k.startswith("record ")),
                sum(1 for k in kept_before if k.startswith("record ")),
            ),
            changed=changed,
            restored_event=restored,
            seconds=time.monotonic() - started,
        )
    )
