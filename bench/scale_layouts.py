"""The scale benchmark's pure parts: slice layouts, the workload's claim, and figures from samples.

A layout is what every simulated node publishes and what each pod's claim asks for:

- ``static``: 8 full GPUs (simulated ``h200x8``), a claim for one GPU by product name;
- ``minimal``: the same 8 devices with only the ``type`` attribute and no capacity (the control
  that isolates what our attributes cost), a claim whose one selector tests ``type``, so it
  evaluates as many CEL expressions as ``static``'s;
- ``mig``: ``a100x4-mig`` (one full GPU, 9 MIG devices), a claim for a ``3g.20gb`` MIG device;
- ``dynamic-mig``: ``h100x8-mig`` as ``--mig-mode dynamic`` publishes it (``DynamicMigBackend``:
  every profile at every placement, consuming shared counters), a claim for ``1g.10gb``;
- ``dynamic-mig-bound``: ``dynamic-mig`` where the API server serves binding conditions: every
  partition carries ``mig-created`` / ``mig-failed``, and each node runs the plugin's binder
  (``plugin.mig_binding``: the watch on pods nominated to the node, a GET of their claims, the
  MIG device made on simulated GPUs, the condition applied); not in the default run;
- ``dynamic-mig-bound-small``: ``dynamic-mig-bound`` on one H100 per node (``h100x8-mig``'s
  first GPU: 25 placements, one counter set, about an eighth of the slices' bytes), the same
  claim; the binder's cost per pod does not depend on the slices, and this one publishes at
  1,000 nodes on a 2-core machine where the eight-GPU layout does not; not in the default run;
- ``no-versions``: ``static`` without its three version attributes (``cudaComputeCapability``,
  ``driverVersion``, ``cudaDriverVersion``), the same claim: not a layout the driver could
  publish (claims written for NVIDIA's driver compare those attributes with ``semver``), but the
  one that shows what their parsing costs the scheduler (``bench/cel_match.py``); not in the
  default run;
- ``consumable``: the same 8 H200 as a node with ``--consumable-shares memory`` publishes them
  (``allowMultipleAllocations``, a ``requestPolicy`` for memory in 1Mi steps), a claim for one
  GPU by product name that asks ``capacity.requests: {memory: 40Gi}``: three such shares fit
  one H200, so the scheduler places 24 claims per node.

Devices come from the driver's own discovery path (``SimulatedBackend`` -> ``naming``), and
slices from the driver's own builder (``published.node_slices`` / ``slices``).
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS
from dra_gpu.devices import model, naming, partitions, shares, simulated
from dra_gpu.kubeletplugin import slices
from dra_gpu.plugin import published

JSON = dict[str, Any]
# node name, node UID -> the node's slice bodies (what the plugin's renderer returns)
Render = Callable[[str, str], list[JSON]]


@dataclass(frozen=True)
class Layout:
    name: str
    render: Render
    device_class: str
    selector: str  # CEL on the device: the workload claim's one selector
    per_node: int  # allocations per node that the claim's request can get
    summary: str
    requests: Mapping[str, str] = field(default_factory=dict)  # the claim's capacity.requests
    binds: bool = False  # each node runs the binder (dynamic MIG before binding)
    profile: str | None = None  # a binding layout's simulated profile (its binder's devices)


@dataclass(frozen=True)
class _TypeOnly:
    """A device reduced to its name and ``type`` (the ``minimal`` control)."""

    name: str
    attributes: Mapping[str, slices.AttributeValue]
    capacity: Mapping[str, int] = field(default_factory=dict)
    partition: slices.CounterUse | None = None


# One H100 with MIG on: ``h100x8-mig``'s first GPU (the binding layout that fits 1,000 nodes).
H100X1_MIG = simulated.SimProfile(
    name="h100x1-mig", gpus=simulated.BUILTIN_PROFILES["h100x8-mig"].gpus[:1]
)
PROFILES: Mapping[str, simulated.SimProfile] = {
    **simulated.BUILTIN_PROFILES,
    H100X1_MIG.name: H100X1_MIG,
}


def devices_of(layout: Layout, node: str) -> list[Any]:
    """The devices a binding layout's node publishes (what its binder creates MIG devices of)."""
    assert layout.profile is not None
    return _devices(layout.profile, node, dynamic=True)


def _devices(profile: str, node: str, *, dynamic: bool) -> list[Any]:
    backend: Any = simulated.SimulatedBackend(profile=PROFILES[profile], node_name=node)
    if dynamic:
        backend = partitions.DynamicMigBackend(backend)
    return list(naming.build_devices(backend.discover().gpus))


def _product(
    profile: str, *, dynamic: bool, mode: shares.ShareMode | None = None, binds: bool = False
) -> Render:
    binding = published.mig_binding_conditions(DRIVER_NAME) if binds else None

    def render(node: str, uid: str) -> list[JSON]:
        devices = _devices(profile, node, dynamic=dynamic)
        return published.node_slices(
            devices,
            driver_name=DRIVER_NAME,
            node_name=node,
            node_uid=uid,
            shares=mode,
            binding=binding,
        )

    return render


def _minimal(node: str, uid: str) -> list[JSON]:
    devices = [
        _TypeOnly(d.name, {"type": str(d.type)}) for d in _devices("h200x8", node, dynamic=False)
    ]
    return slices.build_resource_slices(
        devices=devices,
        driver_name=DRIVER_NAME,
        node_name=node,
        pool_generation=0,
        node_owner=(node, uid),
    )


# What the driver publishes as versions, by the device model's own account of its attributes.
VERSION_ATTRIBUTES = tuple(
    name for name, kind in model.ATTRIBUTE_KINDS.items() if kind is model.Version
)


def without_attributes(rendered: list[JSON], names: Sequence[str]) -> list[JSON]:
    """Slice bodies whose devices lack the attributes ``names`` (a copy)."""
    out = copy.deepcopy(rendered)
    for body in out:
        for device in body["spec"].get("devices") or []:
            for name in names:
                device.get("attributes", {}).pop(name, None)
    return out


def _no_versions(node: str, uid: str) -> list[JSON]:
    return without_attributes(_product("h200x8", dynamic=False)(node, uid), VERSION_ATTRIBUTES)


def _attr(name: str) -> str:
    return f"device.attributes['{DRIVER_NAME}'].{name}"


LAYOUTS: Mapping[str, Layout] = {
    "static": Layout(
        "static",
        _product("h200x8", dynamic=False),
        GPU_CLASS,
        f"{_attr('productName')} == 'NVIDIA H200'",
        8,
        "8 H200 (h200x8)",
    ),
    "minimal": Layout(
        "minimal", _minimal, GPU_CLASS, f"{_attr('type')} == 'gpu'", 8, "8 GPUs, `type` only"
    ),
    "mig": Layout(
        "mig",
        _product("a100x4-mig", dynamic=False),
        MIG_CLASS,
        f"{_attr('profile')} == '3g.20gb'",
        3,
        "a100x4-mig (1 GPU + 9 MIG)",
    ),
    "dynamic-mig": Layout(
        "dynamic-mig",
        _product("h100x8-mig", dynamic=True),
        MIG_CLASS,
        f"{_attr('profile')} == '1g.10gb'",
        56,
        "h100x8-mig, dynamic (200 placements, counters)",
    ),
    "dynamic-mig-bound": Layout(
        "dynamic-mig-bound",
        _product("h100x8-mig", dynamic=True, binds=True),
        MIG_CLASS,
        f"{_attr('profile')} == '1g.10gb'",
        56,
        "h100x8-mig, dynamic, made before binding",
        binds=True,
        profile="h100x8-mig",
    ),
    "dynamic-mig-bound-small": Layout(
        "dynamic-mig-bound-small",
        _product(H100X1_MIG.name, dynamic=True, binds=True),
        MIG_CLASS,
        f"{_attr('profile')} == '1g.10gb'",
        7,  # 1g.10gb placements of one H100
        "one H100 (h100x8-mig's first GPU), dynamic, made before binding",
        binds=True,
        profile=H100X1_MIG.name,
    ),
    "no-versions": Layout(
        "no-versions",
        _no_versions,
        GPU_CLASS,
        f"{_attr('productName')} == 'NVIDIA H200'",
        8,
        "8 H200 without version attributes",
    ),
    "consumable": Layout(
        "consumable",
        _product("h200x8", dynamic=False, mode=shares.parse_mode("memory")),
        GPU_CLASS,
        f"{_attr('productName')} == 'NVIDIA H200'",
        8 * 3,  # 40Gi shares of a 140Gi H200
        "8 H200, consumable shares (memory), 40Gi claims",
        requests={"memory": "40Gi"},
    ),
}


def parse_layouts(text: str) -> list[Layout]:
    """``static,mig`` -> the layouts, in that order; an unknown layout is an error."""
    out: list[Layout] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        if name not in LAYOUTS:
            raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
        out.append(LAYOUTS[name])
    if not out:
        raise ValueError("no layout given")
    return out


def claim_template(layout: Layout, *, name: str, namespace: str) -> JSON:
    """The ResourceClaimTemplate every pod of the workload names: one device of the layout
    (a share of it, where the layout's claim asks for capacity)."""
    exactly: JSON = {
        "deviceClassName": layout.device_class,
        "selectors": [{"cel": {"expression": layout.selector}}],
    }
    if layout.requests:
        exactly["capacity"] = {"requests": dict(layout.requests)}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}},
    }


def pod(name: str, *, namespace: str, template: str) -> JSON:
    """A pod for the simulated nodes: tolerates kwok's taint, never runs a container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "c", "image": "scale.invalid/none", "resources": {}}],
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "nodeSelector": {"type": "kwok"},
        },
    }


# ----- figures ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


Sample = tuple[Mapping[str, str], float]  # (labels, value) of one metric sample


def counter_by(
    families: Mapping[str, Sequence[Sample]], metric: str, keys: Sequence[str]
) -> dict[tuple[str, ...], float]:
    """Sum of ``metric``'s samples grouped by the values of the labels ``keys``."""
    out: dict[tuple[str, ...], float] = {}
    for labels, value in families.get(metric, ()):
        key = tuple(labels.get(k, "") for k in keys)
        out[key] = out.get(key, 0.0) + value
    return out


def deltas(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> dict[tuple[str, ...], float]:
    """``after - before`` per key; keys that did not grow are left out."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v > 0}


def per_node_minute(
    counts: Mapping[tuple[str, ...], float], *, nodes: int, seconds: float
) -> dict[tuple[str, ...], float]:
    """Counts over a window -> per node per minute."""
    scale = 60.0 / (seconds * nodes)
    return {k: v * scale for k, v in counts.items()}


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("nan")


# ----- repeated runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One measurement of a layout: its ``round`` (from 1) of ``--repeat``."""

    layout: Layout
    round: int = 1

    @property
    def label(self) -> str:
        return self.layout.name if self.round == 1 else f"{self.layout.name} ({self.round})"

    @property
    def namespace(self) -> str:
        base = f"scale-{self.layout.name}"
        return base if self.round == 1 else f"{base}-{self.round}"


def schedule(layouts: Sequence[Layout], repeat: int) -> list[Run]:
    """The runs of ``repeat`` rounds, every other round in reverse order (``a b``, ``b a``,
    ``a b``): what comes first or last in a round, after the publishers' start or beside a
    slow clean-up, falls to each layout alike."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    runs: list[Run] = []
    for r in range(repeat):
        order = layouts if r % 2 == 0 else list(reversed(layouts))
        runs += [Run(layout, r + 1) for layout in order]
    return runs


def median_run(values: Mapping[int, float]) -> int:
    """Of a layout's rounds and their pods/s, the round whose value is the median (the lower
    middle one for an even count); rounds without a figure (NaN) are left out."""
    known = sorted((v, r) for r, v in values.items() if not math.isnan(v))
    if not known:
        raise ValueError("no round has a figure")
    return known[(len(known) - 1) // 2][1]


def round_ratios(values: Mapping[int, float], control: Mapping[int, float]) -> dict[int, float]:
    """A layout's pods/s against the control layout's, round by round (both measured in the same
    round, a few minutes apart); a round where either has no figure (absent or NaN) is NaN."""
    return {
        r: v / control[r] if r in control and control[r] > 0 else math.nan
        for r, v in sorted(values.items())
    }
