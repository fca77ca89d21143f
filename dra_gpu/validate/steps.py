"""``dra-gpu validate``'s judgements: each check's verdict from what the API server said (pure).

The command (``validate.command``) reads the objects and runs the pods; every decision about them
is here, so each is tested without a cluster. A :class:`Verdict` is one line of the report: the
step, pass or fail, what was seen and, on a failure, the layer at fault and what to look at
(the layers of docs/user/troubleshooting.md, numbered as there).

The check pod prints a report that :func:`parse_report` reads::

    == env          its environment, sorted
    == devices      every /dev/nvidia* path it has
    == nvidia-smi   nvidia-smi -L, where the image has it (real GPUs)
    == end

and :func:`judge_container` holds it against the claim's allocation: the CDI environment names
exactly the allocated devices (``GPU_DEVICE_<key>=<name>``), the device nodes are exactly those
of their GPUs plus the control nodes, and on a real GPU ``nvidia-smi -L`` lists exactly the
allocated GPU's UUID.

The check claim asks for admin access (:func:`claim`): the scheduler then allocates a device
that workloads hold, and the plugin prepares it next to them, so a node whose every GPU is
busy is validated without taking one from a workload. The API server grants it (feature
DRAAdminAccess: beta and on by default from Kubernetes 1.34, GA from 1.36) only in a namespace
labelled :data:`ADMIN_NAMESPACE_LABEL` ``"true"`` (required since 1.33); elsewhere the claim is
an ordinary one (:func:`admin_access_refused`, :func:`admin_access_kept`) and needs a free
device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu.devices import node_labels

JSON = dict[str, Any]
PLUGIN_SELECTOR = "app.kubernetes.io/name=dra-gpu,app.kubernetes.io/component=kubelet-plugin"
CONTROL_NODES = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"})
_GPU_MINOR = re.compile(r"^gpu-(\d+)(?:-mig-|$)")
# The Namespace label under which the API server admits claims with admin access.
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
_SMI_UUID = re.compile(r"\(UUID: (?P<uuid>(?:GPU|MIG)-[^)\s]+)\)")
REPORT_SCRIPT = (
    'echo "== env"; env | sort; '
    'echo "== devices"; find /dev -name "nvidia*" | sort; '
    'echo "== nvidia-smi"; if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi; '
    'echo "== end"'
)


@dataclass(frozen=True)
class Verdict:
    step: str
    ok: bool
    said: str
    layer: str = ""  # on a failure: the layer at fault
    look: str = ""  # on a failure: what to look at

    def line(self) -> str:
        if self.ok:
            return f"PASS  {self.step}: {self.said}"
        where = (
            f" [layer {self.layer}, docs/user/troubleshooting.md; look at: {self.look}]"
            if self.layer
            else ""
        )
        return f"FAIL  {self.step}: {self.said}{where}"


def passed(step: str, said: str) -> Verdict:
    return Verdict(step, True, said)


def failed(step: str, said: str, *, layer: str, look: str) -> Verdict:
    return Verdict(step, False, said, layer, look)


# --- the node and its plugin ----------------------------------------------------------------


def judge_plugin_pods(pods: Sequence[Mapping[str, Any]], node: str) -> Verdict:
    """The plugin's pod on ``node`` runs and is Ready (its readiness is ``/readyz``: registered
    with the kubelet and its slices written)."""
    step = "plugin"
    if not pods:
        return failed(
            step,
            f"no kubelet plugin pod on node {node} (pods labelled {PLUGIN_SELECTOR})",
            layer="1. the plugin pod (its DaemonSet)",
            look="kubectl get ds -A -l " + PLUGIN_SELECTOR + "; the node's labels and taints "
            "against the DaemonSet's nodeSelector (nvidia.com/gpu.present=true) and tolerations",
        )
    pod = pods[0]
    name = f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
    phase = (pod.get("status") or {}).get("phase")
    conditions = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    ready = conditions.get("Ready", {})
    if phase == "Running" and ready.get("status") == "True":
        return passed(step, f"pod {name} running, registered with the kubelet (ready)")
    why = ready.get("message") or ready.get("reason") or "not ready"
    return failed(
        step,
        f"pod {name} is {phase}, {why}",
        layer="1. the plugin pod",
        look=f"kubectl logs {_logs_of(name)}; docs/user/troubleshooting.md (registration)",
    )


def _logs_of(name: str) -> str:
    namespace, _, pod = name.partition("/")
    return f"-n {namespace} {pod}"


def judge_readyz(url: str, status: int | None, body: str) -> Verdict:
    """A plugin that does not run as a pod, judged by its ``/readyz`` (``--plugin-readyz``)."""
    step = "plugin"
    if status == 200:
        return passed(step, f"{url}: registered with the kubelet, slices written")
    return failed(
        step,
        f"{url} answered {status if status is not None else 'nothing'}: {body.strip()[:200]}",
        layer="1. the plugin pod",
        look="the plugin's log; docs/user/troubleshooting.md (registration)",
    )


# --- the slices -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """What a node's slices of the driver say."""

    devices: Mapping[str, Mapping[str, Any]]  # device name -> its entry
    gpus: Mapping[str, str]  # physical GPU UUID -> product name
    complete: bool  # every slice of the pool's newest generation is there


def published(slices: Iterable[Mapping[str, Any]]) -> Published:
    """The devices of a node's slices (the pool's newest generation only)."""
    items = list(slices)
    newest = max((int(s["spec"]["pool"].get("generation", 0)) for s in items), default=0)
    current = [s for s in items if int(s["spec"]["pool"].get("generation", 0)) == newest]
    expected = max(
        (int(s["spec"]["pool"].get("resourceSliceCount", 1)) for s in current), default=0
    )
    devices: dict[str, Mapping[str, Any]] = {}
    gpus: dict[str, str] = {}
    for s in current:
        for device in s["spec"].get("devices") or []:
            devices[device["name"]] = device
            attrs = device.get("attributes") or {}
            uuid = _string(attrs, "parentUUID") or _string(attrs, "uuid")
            if uuid:
                gpus[uuid] = _string(attrs, "productName")
    return Published(devices, gpus, len(current) == expected)


def _string(attrs: Mapping[str, Any], name: str) -> str:
    value = attrs.get(name) or {}
    return str(value.get("string") or "") if isinstance(value, Mapping) else ""


def judge_slices(
    slices: Sequence[Mapping[str, Any]], labels: Mapping[str, str], node: str, driver: str
) -> Verdict:
    """Slices are published, complete, and agree with what the plugin discovered (its labels:
    the GPUs' count and product, written from the same discovery)."""
    step = "slices"
    look = f"kubectl get resourceslices --field-selector spec.nodeName={node}; the plugin's log"
    seen = published(slices)
    if not seen.devices:
        return failed(
            step,
            f"node {node} publishes no devices of {driver}: it has no GPUs the plugin can use",
            layer="2. discovery and publishing",
            look=look + "; nvidia-smi on the node; docs/user/troubleshooting.md (no devices)",
        )
    if not seen.complete:
        return failed(
            step,
            f"node {node}'s pool is incomplete (a slice of its newest generation is missing)",
            layer="2. discovery and publishing",
            look=look,
        )
    said = f"{len(seen.devices)} devices on {len(seen.gpus)} GPUs"
    count = labels.get(node_labels.COUNT)
    if count is None:
        return passed(step, said + " (no node labels to hold them against: --node-labels off)")
    product = labels.get(node_labels.PRODUCT, "")
    of_product = [p for p in seen.gpus.values() if node_labels.label_value(p) == product]
    if str(len(of_product)) != count:
        return failed(
            step,
            f"{said}, {len(of_product)} of them {product}, but discovery found {count} "
            f"(label {node_labels.COUNT})",
            layer="2. discovery and publishing",
            look=look,
        )
    return passed(step, f"{said}, matching discovery ({count} x {product})")


# --- the check pod --------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    env: Mapping[str, str]
    device_paths: frozenset[str]
    smi_uuids: tuple[str, ...]


def parse_report(log: str) -> Report | None:
    """The check pod's report, or None while it is incomplete."""
    lines = log.splitlines()
    marks = ("== env", "== devices", "== nvidia-smi", "== end")
    if not all(m in lines for m in marks):
        return None
    env_at, dev_at, smi_at, end_at = (lines.index(m) for m in marks)
    env = {}
    for line in lines[env_at + 1 : dev_at]:
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    paths = frozenset(p.strip() for p in lines[dev_at + 1 : smi_at] if p.strip())
    uuids = tuple(m["uuid"] for line in lines[smi_at + 1 : end_at] if (m := _SMI_UUID.search(line)))
    return Report(env, paths, uuids)


def gpu_minor(device: str) -> int | None:
    match = _GPU_MINOR.match(device)
    return int(match.group(1)) if match else None


def judge_container(
    report: Report,
    allocated: Sequence[str],
    uuids: Mapping[str, str],
    pod: str,
    *,
    ordinary_because: str | None = None,
) -> Verdict:
    """The container saw exactly its allocated devices. ``ordinary_because``: why the check
    claim is an ordinary one (None: it had admin access); the line says which."""
    from dra_gpu.prepare.cdi import env_prefix  # loads pydantic: not at --help

    step = "pod"
    problems = []
    announced = {v for k, v in report.env.items() if k == env_prefix(v)}
    if announced != set(allocated):
        problems.append(f"CDI environment names {sorted(announced)}, allocated {sorted(allocated)}")
    minors = {m for d in allocated if (m := gpu_minor(d)) is not None}
    want = {f"/dev/nvidia{m}" for m in minors} | (set(CONTROL_NODES) if minors else set())
    have = {p for p in report.device_paths if not p.startswith("/dev/nvidia-caps")}
    if have != want:
        problems.append(
            f"device nodes missing {sorted(want - have)}, unexpected {sorted(have - want)}"
        )
    expected_uuids = {uuids[d] for d in allocated if d in uuids}
    if report.smi_uuids and set(report.smi_uuids) != expected_uuids:
        problems.append(
            f"nvidia-smi -L lists {list(report.smi_uuids)}, allocated {sorted(expected_uuids)}"
        )
    if problems:
        return failed(
            step,
            f"pod {pod}: " + "; ".join(problems),
            layer="5. CDI in the runtime",
            look="the CDI spec under the node's CDI root; the runtime's CDI setting "
            "(docs/user/troubleshooting.md: container sees no GPU)",
        )
    smi = f", nvidia-smi -L: {report.smi_uuids[0]}" if len(report.smi_uuids) == 1 else ""
    access = claim_access(ordinary_because)
    return passed(step, f"pod {pod} saw exactly {', '.join(allocated)}{smi}; {access}")


def claim_access(ordinary_because: str | None) -> str:
    """How the check claim reached its device, for the pod line."""
    if ordinary_because is None:
        return "its claim had admin access"
    return f"its claim was an ordinary one ({ordinary_because})"


def judge_pending(
    pod: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    waited_s: float,
    *,
    ordinary_because: str | None = None,
) -> Verdict:
    """The check pod did not run in time: where it stopped, from its status and Events.
    ``ordinary_because``: why the check claim had no admin access (None: it had)."""
    status = pod.get("status") or {}
    name = f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
    scheduled = any(
        c.get("type") == "PodScheduled" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    said = "; ".join(
        f"{e.get('reason')}: {str(e.get('message') or '')[:300]}"
        for e in events
        if e.get("type") == "Warning"
    )
    if not scheduled:
        if ordinary_because is None:
            # Admin access takes a device that workloads hold: busy devices are not the cause,
            # except where devices consume shared counters (MIG placements of dynamic MIG): the
            # scheduler still wants the counters free (kubernetes/kubernetes#140729).
            why = (
                "the check claim had admin access, so a device held by workloads would do: no "
                "device of its class on the node matches, or it is tainted, or (dynamic MIG) "
                "its counters are taken (Kubernetes issue 140729)"
            )
        else:
            # An ordinary claim needs a device of its class free on the node: a node whose
            # devices are all allocated to workloads cannot be validated (seen in an upgrade).
            why = (
                "validate needs one free device of its class on the node: its claim was an "
                f"ordinary one ({ordinary_because})"
            )
        return failed(
            "pod",
            f"pod {name} not scheduled after {waited_s:.0f}s: {said or 'no Events'}",
            layer="3. allocation",
            look=f"kubectl describe pod {_logs_of(name)}; dra-gpu explain on the claim; {why}",
        )
    return failed(
        "pod",
        f"pod {name} scheduled but not running after {waited_s:.0f}s "
        f"({status.get('phase')}): {said or 'no Events'}",
        layer="4. prepare" if "Prepare" in said else "5. CDI in the runtime",
        look=f"kubectl describe pod {_logs_of(name)}; the plugin's log",
    )


def allocated_devices(claim: Mapping[str, Any], driver: str) -> list[str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [str(r["device"]) for r in results if r.get("driver") == driver]


# --- the CDI spec after the pod -------------------------------------------------------------


def judge_cdi(listing: str, claim_uid: str, cdi_root: str) -> Verdict:
    """The claim's CDI spec is gone once its pod is."""
    left = [f for f in listing.split() if claim_uid in f]
    if left:
        return failed(
            "cdi",
            f"{cdi_root} still holds {', '.join(left)} after the pod was deleted",
            layer="4. prepare (unprepare)",
            look="the plugin's log for NodeUnprepareResources; the kubelet's log",
        )
    return passed("cdi", f"the claim's CDI spec is gone from {cdi_root} after the pod")


# --- the objects ----------------------------------------------------------------------------


def claim(name: str, device_class: str, *, admin_access: bool = True) -> JSON:
    """The check claim: one device of ``device_class``; with ``admin_access`` one that
    workloads may hold too (the claim's namespace must carry :data:`ADMIN_NAMESPACE_LABEL`)."""
    exactly: JSON = {"deviceClassName": device_class}
    if admin_access:
        exactly["adminAccess"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-gpu-validate"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def admin_access_refused(status: int | None, message: str) -> bool:
    """Whether the API server refused the claim only for its admin access: the namespace
    lacks the label (``admin access to devices requires the `resource.kubernetes.io/admin-access:
    true` label on the containing namespace``, a 422 Invalid)."""
    return status in (403, 422) and ADMIN_NAMESPACE_LABEL in message


def admin_access_kept(created: Mapping[str, Any]) -> bool:
    """Whether the claim the API server created still asks for admin access: one with the
    DRAAdminAccess feature off (Kubernetes 1.32-1.33 by default, or switched off on 1.34-1.35)
    drops the field without a word, and the claim is an ordinary one."""
    requests = ((created.get("spec") or {}).get("devices") or {}).get("requests") or []
    return any(bool((r.get("exactly") or {}).get("adminAccess")) for r in requests)


def admin_access_missing_label(namespace: str) -> str:
    """Why the check claim is an ordinary one when its namespace lacks the label."""
    return (
        f"no admin access: namespace {namespace} lacks the label {ADMIN_NAMESPACE_LABEL}=true; "
        f"kubectl label namespace {namespace} {ADMIN_NAMESPACE_LABEL}=true"
    )


ADMIN_ACCESS_NOT_SERVED = (
    "no admin access: the API server dropped it (feature gate DRAAdminAccess off; on by "
    "default from Kubernetes 1.34)"
)


def _on_node(node: str) -> JSON:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }


def _pod(name: str, container: JSON, **spec: Any) -> JSON:
    """A validate pod: never restarted, quick to delete, tolerating every taint (a tainted
    GPU node is still to be validated), its one container ``container``, the rest ``spec``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-gpu-validate"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"imagePullPolicy": "IfNotPresent", **container}],
            **spec,
        },
    }


def check_pod(name: str, node: str, claim_name: str, image: str) -> JSON:
    """A pod on ``node`` with the claim, printing its report and waiting to be deleted."""
    script = REPORT_SCRIPT + '; trap "exit 0" TERM; sleep 3600 & wait'
    container = {"name": "check", "image": image, "command": ["sh", "-c", script]}
    return _pod(
        name,
        {**container, "resources": {"claims": [{"name": "gpu"}]}},
        affinity=_on_node(node),
        resourceClaims=[{"name": "gpu", "resourceClaimName": claim_name}],
    )


def cdi_pod(name: str, node: str, image: str, cdi_root: str) -> JSON:
    """A pod on ``node`` listing its CDI root (read-only)."""
    container = {
        "name": "cdi",
        "image": image,
        "command": ["sh", "-c", 'echo "== cdi"; ls /cdi; echo "== end"'],
        "volumeMounts": [{"name": "cdi", "mountPath": "/cdi", "readOnly": True}],
    }
    return _pod(
        name,
        container,
        nodeName=node,
        volumes=[{"name": "cdi", "hostPath": {"path": cdi_root, "type": "Directory"}}],
    )


def cdi_listing(log: str) -> str | None:
    """The names the CDI pod listed, or None while its log is incomplete."""
    lines = log.splitlines()
    if "== cdi" not in lines or "== end" not in lines:
        return None
    return "\n".join(lines[lines.index("== cdi") + 1 : lines.index("== end")])


def service_account_pending(status: int | None, message: str) -> bool:
    """Whether the API server refused a pod only because its namespace's ServiceAccount is not
    there yet (``error looking up service account NS/default: serviceaccount "default" not
    found``): a namespace created a moment ago gets it from the controller-manager shortly."""
    return (
        status == 403 and "error looking up service account" in message and "not found" in (message)
    )


def validated_label(driver: str) -> str:
    """The Node label a passed validation sets: ``<driver>/validated``."""
    return f"{driver}/validated"


def version_of(image: str) -> str:
    """The tag of an image reference, as a label value (``repo/dra-gpu:0.2.0`` -> ``0.2.0``)."""
    last = image.rsplit("/", 1)[-1]
    tag = last.split("@", 1)[0].partition(":")[2]
    return node_labels.label_value(tag)
