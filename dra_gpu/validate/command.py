"""``dra-gpu validate --node NODE``: the checks a platform engineer makes by hand, in order.

One line per check with its verdict (``validate.steps`` judges, this module reads and acts):

1. ``node``: the Node exists;
2. ``plugin``: the driver's kubelet plugin pod on it runs and is Ready (its readiness probe is
   ``/readyz``: registered with the kubelet, slices written); for a plugin that is not a pod
   (started by hand, the local harness), ``--plugin-readyz URL`` asks its ``/readyz`` instead;
3. ``slices``: the node's ResourceSlices of the driver are published, complete, and agree with
   the plugin's discovery (its node labels ``nvidia.com/gpu.count`` and ``gpu.product``);
4. ``pod``: a pod with a claim of one device, on that node, starts, and its container sees
   exactly its device (the CDI environment and device nodes; on real GPUs ``nvidia-smi -L``).
   The claim asks for admin access, so a device that workloads hold will do (a busy node is
   validated without taking a GPU from them); where the API server does not grant it (the
   namespace lacks the label ``resource.kubernetes.io/admin-access=true``, or the feature is
   off) the claim is an ordinary one, needs a free device, and the line says why;
5. ``cdi``: once the pod is deleted, the claim's CDI spec is gone from the node's CDI root (a
   pod listing it, read-only).

A failed check names the layer at fault and what to look at; the checks after it are skipped.
The result is recorded where a rollout can gate on it: on success the Node gets the label
``<driver>/validated=<plugin version>`` (the plugin image's tag), on failure it loses it, and
an Event on the Node (``GpuNodeValidated`` / ``GpuNodeValidationFailed``) says why. Exit code 0
when every check passed, 1 otherwise (a node that does not exist, has no plugin or no GPUs
included), 2 for a usage error. The pods and the claim are deleted however it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import dra_gpu
from dra_gpu import DRIVER_NAME
from dra_gpu.kube.objects import node_path
from dra_gpu.validate import steps
from dra_gpu.validate.steps import Verdict

if TYPE_CHECKING:
    from dra_gpu.kube.client import KubeClient

T = TypeVar("T")
POLL_S = 1.0
# How long a new namespace may lack its default ServiceAccount (the controller-manager adds it).
SERVICE_ACCOUNT_WAIT_S = 30.0
DEFAULT_IMAGE = "busybox:1.36"
DEFAULT_CDI_ROOT = "/var/run/cdi"
STEPS = ("node", "plugin", "slices", "pod", "cdi")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "validate",
        help="check that a GPU node is ready: plugin, slices, a pod with a claim, its CDI spec",
        description="Run the checks of a GPU node in order, one line each, and record the result "
        "on the Node (label <driver>/validated=<plugin version>, and an Event).",
    )
    parser.add_argument("--node", required=True, help="the node to validate")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="default: kubectl's")
    parser.add_argument("--driver-name", default=DRIVER_NAME, help=f"default {DRIVER_NAME}")
    parser.add_argument(
        "--namespace",
        default=None,
        help="where the check pods and claim go (default: the plugin pod's namespace, which "
        "admits the CDI pod's read-only hostPath; else default); labelled "
        "resource.kubernetes.io/admin-access=true, the claim gets admin access and may share a "
        "device with workloads, else it needs a free device",
    )
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"the check pods' image: a shell, find, ls; nvidia-smi where it has it "
        f"(default {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--device-class",
        default=DRIVER_NAME,
        help=f"the claim's DeviceClass (default {DRIVER_NAME})",
    )
    parser.add_argument(
        "--cdi-root",
        default=DEFAULT_CDI_ROOT,
        help=f"the node's CDI directory (kubeletPlugin.cdiRoot; default {DEFAULT_CDI_ROOT})",
    )
    parser.add_argument(
        "--plugin-readyz",
        default=None,
        metavar="URL",
        help="a plugin that does not run as a pod: its /readyz URL instead of a pod's readiness",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for each pod (default 180)"
    )
    parser.add_argument(
        "--no-record", action="store_true", help="leave the Node's label and Events alone"
    )
    parser.set_defaults(func=run)


@dataclass
class Options:
    node: str
    driver: str = DRIVER_NAME
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    device_class: str = DRIVER_NAME
    cdi_root: str = DEFAULT_CDI_ROOT
    plugin_readyz: str | None = None
    timeout_s: float = 180.0
    record: bool = True


@dataclass
class Outcome:
    verdicts: list[Verdict] = field(default_factory=list)
    version: str = dra_gpu.__version__

    @property
    def ok(self) -> bool:
        return len(self.verdicts) == len(STEPS) and all(v.ok for v in self.verdicts)

    def lines(self) -> list[str]:
        done = [v.line() for v in self.verdicts]
        skipped = [f"SKIP  {s}" for s in STEPS[len(self.verdicts) :]]
        return done + skipped


def run(args: argparse.Namespace) -> int:
    from dra_gpu.kube import errors
    from dra_gpu.kube.client import connect

    options = Options(
        node=args.node,
        driver=args.driver_name,
        namespace=args.namespace,
        image=args.image,
        device_class=args.device_class,
        cdi_root=args.cdi_root,
        plugin_readyz=args.plugin_readyz,
        timeout_s=args.timeout,
        record=not args.no_record,
    )
    try:
        client = connect(args.kubeconfig, default_kubeconfig=True)
    except errors.ApiError as err:
        print(f"dra-gpu validate: {err}", file=sys.stderr)
        return 1
    outcome = Validation(client, options, say=print).run()
    verdict = "passed" if outcome.ok else "FAILED"
    print(f"node {options.node}: validation {verdict} (plugin version {outcome.version})")
    return 0 if outcome.ok else 1


class Validation:
    """One run of the checks against one node."""

    def __init__(self, client: KubeClient, options: Options, *, say: Callable[[str], None]) -> None:
        self._client = client
        self._o = options
        self._say = say
        suffix = secrets.token_hex(3)
        self._claim = f"dra-gpu-validate-{suffix}"
        self._pod = f"dra-gpu-validate-{suffix}"
        self._cdi_pod = f"dra-gpu-validate-cdi-{suffix}"
        self._namespace = options.namespace or "default"
        self._node: Mapping[str, Any] = {}
        self._slices: list[Mapping[str, Any]] = []
        self._claim_uid = ""
        self._ordinary_because: str | None = None  # why the check claim lacks admin access
        self._created: list[str] = []  # paths of the objects this run created

    def run(self) -> Outcome:
        from dra_gpu.kube import errors

        outcome = Outcome()
        checks: list[Callable[[Outcome], Verdict]] = [
            self._check_node,
            self._check_plugin,
            self._check_slices,
            self._check_pod,
            self._check_cdi,
        ]
        try:
            for check in checks:
                try:
                    verdict = check(outcome)
                except errors.ApiError as err:
                    step = STEPS[len(outcome.verdicts)]
                    verdict = steps.failed(
                        step,
                        f"API error: {err}",
                        layer="0. the API server",
                        look="your credentials",
                    )
                outcome.verdicts.append(verdict)
                self._say(verdict.line())
                if not verdict.ok:
                    break
        finally:
            self._clean_up()
        for line in outcome.lines()[len(outcome.verdicts) :]:
            self._say(line)
        if self._o.record and self._node:
            self._record(outcome)
        return outcome

    # --- the checks ---------------------------------------------------------------------------

    def _check_node(self, _: Outcome) -> Verdict:
        from dra_gpu.kube import errors

        try:
            self._node = self._client.request("GET", node_path(self._o.node))
        except errors.NotFound:
            return steps.failed(
                "node",
                f"node {self._o.node} does not exist",
                layer="0. the cluster",
                look="kubectl get nodes",
            )
        return steps.passed("node", f"node {self._o.node} exists")

    def _check_plugin(self, outcome: Outcome) -> Verdict:
        if self._o.plugin_readyz is not None:
            status, body = _get_url(self._o.plugin_readyz)
            return steps.judge_readyz(self._o.plugin_readyz, status, body)
        listed = self._client.request(
            "GET",
            "/api/v1/pods",
            query={
                "labelSelector": steps.PLUGIN_SELECTOR,
                "fieldSelector": f"spec.nodeName={self._o.node}",
            },
        )
        pods = list(listed.get("items") or [])
        verdict = steps.judge_plugin_pods(pods, self._o.node)
        if pods:
            pod = pods[0]
            if self._o.namespace is None:
                self._namespace = str(pod["metadata"]["namespace"])
            containers = pod["spec"].get("containers") or [{}]
            outcome.version = steps.version_of(str(containers[0].get("image", ""))) or (
                outcome.version
            )
        return verdict

    def _check_slices(self, _: Outcome) -> Verdict:
        listed = self._client.request(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            query={"fieldSelector": f"spec.nodeName={self._o.node}"},
        )
        self._slices = [
            s for s in listed.get("items") or [] if s["spec"].get("driver") == self._o.driver
        ]
        labels = dict((self._node.get("metadata") or {}).get("labels") or {})
        return steps.judge_slices(self._slices, labels, self._o.node, self._o.driver)

    def _check_pod(self, _: Outcome) -> Verdict:
        ns = self._namespace
        claims = f"/apis/resource.k8s.io/v1/namespaces/{quote(ns)}/resourceclaims"
        self._ordinary_because = self._create_claim(claims)
        pod = steps.check_pod(self._pod, self._o.node, self._claim, self._o.image)
        self._create(f"/api/v1/namespaces/{quote(ns)}/pods", pod)
        report = self._wait_log(self._pod, steps.parse_report)
        name = f"{ns}/{self._pod}"
        if report is None:
            return self._pending(self._pod)
        claim = self._client.request("GET", f"{claims}/{self._claim}")
        allocated = steps.allocated_devices(claim, self._o.driver)
        self._claim_uid = str(claim["metadata"]["uid"])
        published = steps.published(self._slices)
        uuids = {
            name_: _attr(device, "uuid")
            for name_, device in published.devices.items()
            if _attr(device, "uuid")
        }
        verdict = steps.judge_container(
            report, allocated, uuids, name, ordinary_because=self._ordinary_because
        )
        self._delete_pod(self._pod)
        return verdict

    def _check_cdi(self, _: Outcome) -> Verdict:
        ns = self._namespace
        verdict: Verdict | None = None
        for _attempt in range(3):  # unprepare may follow the pod's deletion by a moment
            pod = steps.cdi_pod(self._cdi_pod, self._o.node, self._o.image, self._o.cdi_root)
            self._create(f"/api/v1/namespaces/{quote(ns)}/pods", pod)
            listing = self._wait_log(self._cdi_pod, steps.cdi_listing)
            if listing is None:
                verdict = self._pending(self._cdi_pod)
                self._delete_pod(self._cdi_pod)
                return verdict
            self._delete_pod(self._cdi_pod)
            verdict = steps.judge_cdi(listing, self._claim_uid, self._o.cdi_root)
            if verdict.ok:
                return verdict
            time.sleep(2.0)
        assert verdict is not None
        return verdict

    # --- helpers ------------------------------------------------------------------------------

    def _create_claim(self, claims: str) -> str | None:
        """Create the check claim, with admin access where the API server grants it, else an
        ordinary one. Returns why it is an ordinary one, None when it has admin access."""
        from dra_gpu.kube import errors

        body = steps.claim(self._claim, self._o.device_class)
        try:
            created = self._client.request("POST", claims, body=body)
        except errors.ApiError as err:
            if not steps.admin_access_refused(err.status, err.message):
                raise
            ordinary = steps.claim(self._claim, self._o.device_class, admin_access=False)
            self._create(claims, ordinary)
            return steps.admin_access_missing_label(self._namespace)
        self._created.append(f"{claims}/{self._claim}")
        if not steps.admin_access_kept(created):
            return steps.ADMIN_ACCESS_NOT_SERVED
        return None

    def _create(self, collection: str, obj: Mapping[str, Any]) -> None:
        from dra_gpu.kube import errors

        # A namespace created a moment ago has no default ServiceAccount yet (the
        # controller-manager adds it), and the API server refuses its pods until it has.
        deadline = time.monotonic() + min(self._o.timeout_s, SERVICE_ACCOUNT_WAIT_S)
        while True:
            try:
                self._client.request("POST", collection, body=obj)
                break
            except errors.ApiError as err:
                if not steps.service_account_pending(err.status, err.message):
                    raise
                if time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_S)
        self._created.append(f"{collection}/{obj['metadata']['name']}")

    def _wait_log(self, pod: str, parse: Callable[[str], T | None]) -> T | None:
        """The pod's log parsed, once it is complete; None when the pod did not get there."""
        from dra_gpu.kube import errors

        ns = self._namespace
        deadline = time.monotonic() + self._o.timeout_s
        while time.monotonic() < deadline:
            obj = self._client.request("GET", f"/api/v1/namespaces/{quote(ns)}/pods/{pod}")
            phase = (obj.get("status") or {}).get("phase")
            if phase in ("Running", "Succeeded", "Failed"):
                try:
                    text = self._client.get_text(
                        f"/api/v1/namespaces/{quote(ns)}/pods/{pod}/log", accept="*/*"
                    )
                except errors.ApiError:
                    text = ""  # the container is starting: no log yet
                parsed = parse(text)
                if parsed is not None or phase == "Failed":
                    return parsed
            time.sleep(POLL_S)
        return None

    def _pending(self, pod: str) -> Verdict:
        ns = self._namespace
        obj = self._client.request("GET", f"/api/v1/namespaces/{quote(ns)}/pods/{pod}")
        events = self._client.request(
            "GET",
            f"/api/v1/namespaces/{quote(ns)}/events",
            query={"fieldSelector": f"involvedObject.name={pod}"},
        )
        return steps.judge_pending(
            obj,
            list(events.get("items") or []),
            self._o.timeout_s,
            ordinary_because=self._ordinary_because,
        )

    def _delete_pod(self, pod: str) -> None:
        """Delete the pod and wait until it is gone (the kubelet unprepared its claim)."""
        from dra_gpu.kube import errors

        path = f"/api/v1/namespaces/{quote(self._namespace)}/pods/{pod}"
        try:
            self._client.request("DELETE", path)
        except errors.NotFound:
            return
        deadline = time.monotonic() + self._o.timeout_s
        while time.monotonic() < deadline:
            try:
                self._client.request("GET", path)
            except errors.NotFound:
                return
            time.sleep(POLL_S)

    def _clean_up(self) -> None:
        """Delete what this run created and is still there."""
        from dra_gpu.kube import errors

        for path in reversed(self._created):
            with contextlib.suppress(errors.ApiError):  # gone already
                self._client.request("DELETE", path)

    def _record(self, outcome: Outcome) -> None:
        """The label a rollout gates on, and an Event on the Node."""
        from dra_gpu.kube import errors
        from dra_gpu.kube.client import MERGE_PATCH
        from dra_gpu.kubeletplugin import events

        label = steps.validated_label(self._o.driver)
        value = outcome.version if outcome.ok else None
        node = self._o.node
        body = {"metadata": {"labels": {label: value}}}
        failed = next((v for v in outcome.verdicts if not v.ok), None)
        message = (
            f"dra-gpu validate passed: {', '.join(STEPS)} (plugin version {outcome.version})"
            if failed is None
            else f"dra-gpu validate failed: {failed.line()}"
        )
        try:
            self._client.request(
                "PATCH",
                node_path(node),
                body=body,
                content_type=MERGE_PATCH,
            )
            uid = str((self._node.get("metadata") or {}).get("uid") or node)
            event = events.warning_event(
                {"kind": "Node", "name": node, "uid": uid},
                namespace="default",
                reason="GpuNodeValidated" if failed is None else "GpuNodeValidationFailed",
                message=message,
                host=node,
                source="dra-gpu-validate",
                event_type="Normal" if failed is None else "Warning",
            )
            self._client.request("POST", "/api/v1/namespaces/default/events", body=event)
        except errors.ApiError as err:
            self._say(f"could not record the result on node {node}: {err}")
            return
        state = f"{label}={value}" if value else f"{label} removed"
        self._say(f"recorded on node {node}: label {state}, Event {event['reason']}")


def _attr(device: Mapping[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name) or {}
    return str(value.get("string") or "") if isinstance(value, Mapping) else ""


def _get_url(url: str) -> tuple[int | None, str]:
    """GET a plugin's /readyz: (status, body), (None, why) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=5.0) as answer:
            return int(answer.status), answer.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError) as err:
        return None, str(err)
