"""What this cluster's API server and kubelet support, detected once at start (one object to
branch on).

dra-gpu supports Kubernetes 1.34 to 1.37 (``resource.k8s.io/v1`` is GA from 1.34). Within that
range the features differ, and a disabled feature is silent: the API server drops the fields
of a feature gate that is off (a device's ``taints``, a slice's ``sharedCounters``) without an
error. So the facts are probed, not assumed from the version number alone:

- ``GET /version``: the server's version, named in every refusal message.
- ``GET /apis/resource.k8s.io``: the API versions served; without ``v1`` the driver refuses to
  start (:class:`Unsupported`), naming the version.
- dry-run creates (``?dryRun=All``, nothing is stored) of a ResourceSlice on this node, one with a
  tainted device and one with a counter set: what comes back says whether the server keeps device
  taints (health taints) and shared counters (partitionable devices).
- a dry-run create of a slice whose device carries ``bindingConditions`` and
  ``bindingFailureConditions`` (KEP-5007, ``DRADeviceBindingConditions``: alpha and off in 1.34
  and 1.35, beta and on from 1.36): whether dynamic MIG devices can be created before the pod
  binds (docs/concepts/dynamic-mig.md).
- the Node's ``kubeletVersion``: which ``DRAResourceHealth`` version the kubelet asks for, and
  whether it watches device health at all.

Layout facts that follow from the version alone (a slice holds devices or counters, not both,
from 1.35) are properties of :class:`Capabilities`. Pure parts (:func:`parse_version`,
:func:`from_answers`) are separate from the requests (:func:`detect`), so tests need no server.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import quote

from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import Node

log = logging.getLogger(__name__)

JSON = dict[str, Any]
GROUP: Final = "resource.k8s.io"
SLICES_PATH: Final = f"/apis/{GROUP}/v1/resourceslices"
CLASSES_PATH: Final = f"/apis/{GROUP}/v1/deviceclasses"
OLDEST: Final = (1, 34)  # resource.k8s.io/v1 is GA from 1.34
NEWEST_PROVEN: Final = (
    1,
    37,
)  # the newest minor the version matrix ran (docs/development/versions.md)
PROBE_DEVICE: Final = "capability-probe"


class Unsupported(Exception):
    """The cluster lacks something dra-gpu cannot work without; the message names the version."""


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int
    patch: int
    text: str = ""  # as the component reported it, e.g. ``v1.34.4-gke.1200``

    def __str__(self) -> str:
        return self.text or f"v{self.major}.{self.minor}.{self.patch}"

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> KubeVersion:
    """``v1.34.4``, ``v1.35.0-beta.0``, ``v1.36.3-eks-1a2b`` -> (1, 34, 4) etc."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes version: {text!r}")
    major, minor, patch = match.groups()
    return KubeVersion(int(major), int(minor), int(patch or 0), text.strip())


@dataclass(frozen=True)
class Capabilities:
    """What the API server (and this node's kubelet, when known) support."""

    server: KubeVersion
    resource_versions: tuple[str, ...]  # resource.k8s.io versions served, preferred first
    # ResourceSlice device taints are kept (DRADeviceTaints on); None: not probed (controller).
    device_taints: bool | None
    # sharedCounters are kept (DRAPartitionableDevices on); None: not probed (controller).
    partitionable_devices: bool | None
    kubelet: KubeVersion | None = None
    # DeviceClass extendedResourceName is kept (DRAExtendedResource on); None: not probed.
    extended_resources: bool | None = None
    # Device bindingConditions are kept (DRADeviceBindingConditions on, which needs
    # DRAResourceClaimDeviceStatus); None: not probed (controller).
    binding_conditions: bool | None = None

    @property
    def counters_in_own_slice(self) -> bool:
        """From 1.35 a slice holds devices or shared counters, not both."""
        return self.server.at_least(1, 35)

    @property
    def claim_driver_subresource(self) -> bool:
        """From 1.36 ``resourceclaims/driver`` (associated-node updates) exists."""
        return self.server.at_least(1, 36)

    @property
    def device_status_stage(self) -> str:
        """ResourceClaim device status (KEP-4817, ``DRAResourceClaimDeviceStatus``): GA from
        1.37, beta and on by default before (an API server with the gate off drops it; the
        writer finds that out at its first write)."""
        return "GA" if self.server.at_least(1, 37) else "beta"

    @property
    def device_status_permission(self) -> str:
        """What the API server checks before it stores a driver's ``status.devices`` entries."""
        if self.claim_driver_subresource:
            # DRAResourceClaimGranularStatusAuthorization (beta, on from 1.36)
            return (
                "resourceclaims/status patch and resourceclaims/driver associated-node:update "
                "for the driver's name (granular status authorization)"
            )
        return "resourceclaims/status patch"

    @property
    def kubelet_dra_service(self) -> str | None:
        """The ``DRAPlugin`` version this node's kubelet picks of the two the plugin offers."""
        if self.kubelet is None:
            return None
        return "v1" if self.kubelet.at_least(1, 34) else "v1beta1"

    @property
    def kubelet_health_service(self) -> str | None:
        """The ``DRAResourceHealth`` version this node's kubelet asks for (None: not known)."""
        if self.kubelet is None:
            return None
        return "v1" if self.kubelet.at_least(1, 37) else "v1alpha1"

    @property
    def kubelet_watches_health(self) -> bool | None:
        """Whether the kubelet reads the health stream by default (ResourceHealthStatus beta
        and on from 1.36; alpha and off before)."""
        return None if self.kubelet is None else self.kubelet.at_least(1, 36)

    def refusal(self, feature: str, *, gate: str, effect: str) -> str:
        """The message for a feature this cluster lacks: what, which version, which gate."""
        return (
            f"{feature} not available: Kubernetes {self.server} drops it "
            f"(feature gate {gate} is off on this API server); {effect}"
        )

    def summary(self) -> str:
        """One log line: the versions and every feature that differs between 1.34 and 1.37."""

        def on(flag: bool | None) -> str:
            return "not probed" if flag is None else ("on" if flag else "off")

        kubelet = (
            f"kubelet {self.kubelet} (DRAPlugin {self.kubelet_dra_service}, "
            f"DRAResourceHealth {self.kubelet_health_service}, "
            f"health in pod status {on(self.kubelet_watches_health)})"
            if self.kubelet is not None
            else "kubelet version unknown"
        )
        where = "their own slice" if self.counters_in_own_slice else "the devices' slice"
        return (
            f"Kubernetes API server {self.server}: {GROUP} {','.join(self.resource_versions)}; "
            f"device taints {on(self.device_taints)}, "
            f"partitionable devices {on(self.partitionable_devices)} "
            f"(counters in {where}); "
            f"binding conditions {on(self.binding_conditions)}; "
            f"claim device status {self.device_status_stage} "
            f"(needs {self.device_status_permission}); "
            f"{kubelet}"
        )

    def untested(self) -> str | None:
        """A warning when the server is newer than the newest version the matrix proved."""
        if self.server.at_least(NEWEST_PROVEN[0], NEWEST_PROVEN[1] + 1):
            newest = f"{NEWEST_PROVEN[0]}.{NEWEST_PROVEN[1]}"
            return f"Kubernetes {self.server} is newer than {newest}, the newest version tested"
        return None


def served_versions(group: Mapping[str, Any]) -> tuple[str, ...]:
    """The versions of an API group discovery document (``GET /apis/<group>``), preferred
    first."""
    preferred = str((group.get("preferredVersion") or {}).get("version") or "")
    listed = [str(v.get("version")) for v in group.get("versions") or [] if v.get("version")]
    return tuple(sorted(listed, key=lambda v: v != preferred))


def _kept_taints(answer: Mapping[str, Any] | None) -> bool:
    devices = ((answer or {}).get("spec") or {}).get("devices") or []
    return any(d.get("taints") for d in devices)


def _kept_counters(answer: Mapping[str, Any] | None) -> bool:
    return bool(((answer or {}).get("spec") or {}).get("sharedCounters"))


def _kept_binding_conditions(answer: Mapping[str, Any] | None) -> bool:
    devices = ((answer or {}).get("spec") or {}).get("devices") or []
    return any(d.get("bindingConditions") and d.get("bindingFailureConditions") for d in devices)


def from_answers(
    *,
    version: Mapping[str, Any],
    group: Mapping[str, Any] | None,
    taint_probe: Mapping[str, Any] | None,
    counter_probe: Mapping[str, Any] | None,
    node: Node | None = None,
    class_probe: Mapping[str, Any] | None = None,
    slices_probed: bool = True,
    binding_probe: Mapping[str, Any] | None = None,
) -> Capabilities:
    """Capabilities from the server's answers (pure). ``None`` for an answer that failed: a
    probe that failed counts as the feature being off; a missing group as no ``v1``.
    ``class_probe`` None: the DeviceClass probe was not made (a failed one is ``{}``);
    ``slices_probed`` False: the slice probes were not made (no node: the controller);
    ``binding_probe``: the answer to the binding-conditions slice (None: refused or failed)."""
    server = parse_version(str(version.get("gitVersion") or ""))
    served = served_versions(group or {})
    if not server.at_least(*OLDEST) or "v1" not in served:
        raise Unsupported(
            f"Kubernetes {server} does not serve {GROUP}/v1 (served: "
            f"{', '.join(served) or 'none'}); dra-gpu needs Kubernetes "
            f"{OLDEST[0]}.{OLDEST[1]} or later"
        )
    status = node.get("status") if node else None
    kubelet_text = str((status or {}).get("nodeInfo", {}).get("kubeletVersion"))
    try:
        kubelet: KubeVersion | None = parse_version(kubelet_text)
    except ValueError:
        kubelet = None  # not known (no node, or a simulated one)
    return Capabilities(
        server=server,
        resource_versions=served,
        device_taints=None if slices_probed is False else _kept_taints(taint_probe),
        partitionable_devices=None if slices_probed is False else _kept_counters(counter_probe),
        binding_conditions=(
            None if slices_probed is False else _kept_binding_conditions(binding_probe)
        ),
        kubelet=kubelet,
        extended_resources=(
            None
            if class_probe is None
            else bool((class_probe.get("spec") or {}).get("extendedResourceName"))
        ),
    )


def probe_slices(*, driver: str, node: str) -> tuple[JSON, JSON, JSON]:
    """Three slices for dry-run creates on ``node``: a device with a taint, a counter set (apart,
    as 1.35+ requires), and a device with binding conditions. They name this node, so a
    node-confinement policy admits them."""

    def body(suffix: str, spec: JSON) -> JSON:
        return {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{node}-{suffix}-"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": f"{node}-{suffix}", "generation": 0, "resourceSliceCount": 1},
                **spec,
            },
        }

    taint = {"key": f"{driver}/{PROBE_DEVICE}", "value": "probe", "effect": "NoSchedule"}
    counters = [{"name": PROBE_DEVICE, "counters": {"memory": {"value": "1"}}}]
    binding = {
        "name": PROBE_DEVICE,
        "bindingConditions": [f"{driver}/probe-ready"],
        "bindingFailureConditions": [f"{driver}/probe-failed"],
    }
    return (
        body("taint-probe", {"devices": [{"name": PROBE_DEVICE, "taints": [taint]}]}),
        body("counter-probe", {"sharedCounters": counters}),
        body("binding-probe", {"devices": [binding]}),
    )


def probe_class(extended_resource_name: str, *, labels: Mapping[str, str]) -> JSON:
    """A DeviceClass for a dry-run create: does the server keep ``extendedResourceName``?
    ``labels``: those a policy requires of the caller's classes (the controller's ownership)."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "DeviceClass",
        "metadata": {"generateName": f"{PROBE_DEVICE}-", "labels": dict(labels)},
        "spec": {"extendedResourceName": extended_resource_name},
    }


def _dry_run(client: KubeClient, path: str, body: JSON) -> JSON | None:
    try:
        return client.request("POST", path, query={"dryRun": "All"}, body=body)
    except errors.ApiError as err:
        # Refused or not understood: the feature is not usable either way; the cause is logged.
        log.info("dry-run probe %s refused: %s", body["metadata"]["generateName"], err)
        return None


def detect(
    client: KubeClient,
    *,
    driver: str,
    node: str | None,
    class_probe: JSON | None = None,
) -> Capabilities:
    """Ask the API server (see the module docstring). Raises ``errors.ApiError`` when the server
    does not answer ``/version``, :class:`Unsupported` when it is too old. Without ``node``
    (the controller) the slice probes and the kubelet are skipped; with
    ``class_probe`` (:func:`probe_class`) that DeviceClass is dry-run created."""
    version = client.request("GET", "/version")
    try:
        group: JSON | None = client.request("GET", f"/apis/{GROUP}")
    except errors.NotFound:
        group = None
    taint_probe = counter_probe = binding_probe = node_obj = None
    if node is not None and group is not None:
        taint_body, counter_body, binding_body = probe_slices(driver=driver, node=node)
        taint_probe = _dry_run(client, SLICES_PATH, taint_body)
        counter_probe = _dry_run(client, SLICES_PATH, counter_body)
        binding_probe = _dry_run(client, SLICES_PATH, binding_body)
        try:
            # The API boundary: the server's JSON is taken to be a Node, unchecked.
            node_obj = cast(Node, client.request("GET", f"/api/v1/nodes/{quote(node)}"))
        except errors.ApiError:
            node_obj = None
    class_answer: JSON | None = None
    if class_probe is not None and group is not None:
        class_answer = _dry_run(client, CLASSES_PATH, class_probe) or {}
    return from_answers(
        version=version,
        group=group,
        taint_probe=taint_probe,
        counter_probe=counter_probe,
        node=node_obj,
        class_probe=class_answer,
        slices_probed=node is not None,
        binding_probe=binding_probe,
    )


def detect_or_none(
    client: KubeClient,
    *,
    driver: str,
    node: str | None,
    class_probe: JSON | None = None,
) -> Capabilities | None:
    """:func:`detect`, or None (logged) when the API server does not answer: a plugin started
    during an outage must still serve unprepare from its checkpoint. Raises
    :class:`Unsupported` for a server too old."""
    try:
        return detect(client, driver=driver, node=node, class_probe=class_probe)
    except errors.ApiError as err:
        log.warning("cannot ask the API server what it supports (%s); features not checked", err)
        return None


def dynamic_mig_refusal(caps: Capabilities | None) -> str | None:
    """Why ``--mig-mode=dynamic`` cannot run on this cluster (None: it can, or not probed).

    Dynamic MIG publishes partitionable devices with their counter sets in slices of their own,
    the layout of 1.35 and later; an API server that drops the counters (gate off) or wants them
    beside the devices (1.34) would leave the scheduler free to over-commit a GPU.
    """
    if caps is None:
        return None
    if caps.partitionable_devices is False:
        return caps.refusal(
            "dynamic MIG (partitionable devices)",
            gate="DRAPartitionableDevices",
            effect="start the plugin with --mig-mode=static",
        )
    if not caps.counters_in_own_slice:
        return (
            f"dynamic MIG (partitionable devices) not available: Kubernetes {caps.server} keeps "
            "shared counters in the devices' slice, and dra-gpu publishes them in slices of "
            "their own (Kubernetes 1.35 and later); start the plugin with --mig-mode=static"
        )
    return None


def mig_before_binding(caps: Capabilities | None) -> bool:
    """Whether dynamic MIG devices are created before the pod binds: the API server keeps the
    devices' binding conditions (KEP-5007). False when not served or not probed."""
    return caps is not None and caps.binding_conditions is True


def binding_conditions_note(caps: Capabilities | None) -> str | None:
    """The one line a dynamic-MIG plugin logs where binding conditions are not served (None:
    they are, or the server was not asked)."""
    if caps is None or caps.binding_conditions is not False:
        return None
    return caps.refusal(
        "dynamic MIG before binding (device binding conditions)",
        gate="DRADeviceBindingConditions",
        effect=(
            "MIG devices are created at prepare, after the pod is bound to the node; a "
            "creation that fails leaves the pod on this node with the prepare failing"
        ),
    )


def plugin_report(caps: Capabilities | None) -> list[tuple[int, str]]:
    """The kubelet plugin's start-up lines (log level, text): the summary, then each feature
    the plugin uses that this cluster lacks, refused with the version named."""
    if caps is None:
        return []
    lines = [(logging.INFO, caps.summary())]
    if caps.device_taints is False:
        effect = (
            "GPUs with health errors are not tainted in the ResourceSlices, so the scheduler "
            "keeps allocating them"
        )
        lines.append(
            (
                logging.WARNING,
                caps.refusal("GPU health taints", gate="DRADeviceTaints", effect=effect),
            )
        )
    if caps.kubelet_watches_health is False:
        lines.append(
            (
                logging.INFO,
                f"kubelet {caps.kubelet} does not read the device health stream by default "
                "(ResourceHealthStatus is off before 1.36): pod status shows no device health",
            )
        )
    untested = caps.untested()
    if untested:
        lines.append((logging.WARNING, untested))
    return lines


def controller_report(
    caps: Capabilities | None, *, extended_resource_name: str | None
) -> list[tuple[int, str]]:
    """The controller's start-up lines: the summary, and the extended resource mapping refused
    with the version named when the server drops ``extendedResourceName``."""
    if caps is None:
        return []
    lines = [(logging.INFO, caps.summary())]
    if extended_resource_name is not None and caps.extended_resources is False:
        effect = (
            f"pods asking for {extended_resource_name} limits are not served through DRA; "
            "use a ResourceClaim"
        )
        lines.append(
            (
                logging.WARNING,
                caps.refusal(
                    f"extended resource {extended_resource_name} "
                    "(DeviceClass extendedResourceName)",
                    gate="DRAExtendedResource",
                    effect=effect,
                ),
            )
        )
    untested = caps.untested()
    if untested:
        lines.append((logging.WARNING, untested))
    return lines
