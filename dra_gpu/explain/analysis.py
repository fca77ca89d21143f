"""Why a claim does (not) fit: the scheduler's allocation checks, counted per node and pool.

Pure: the inputs are the API objects (DeviceClasses, ResourceSlices, ResourceClaims) as dicts,
the output a :class:`Report`. For each request and node it counts the devices that pass the
class selectors, then each claim selector in turn, then those neither allocated to another
claim nor tainted (without a toleration), and decides whether the whole claim fits on the node
as the scheduler would: every request gets its count of distinct devices, under the claim's
``matchAttribute`` / ``distinctAttribute`` constraints and ``firstAvailable`` alternatives.

Consumable capacity (``dra_gpu.explain.capacity``): a request's ``capacity.requests`` filter the
devices; a device with ``allowMultipleAllocations`` stays free for the claim while what the
claims allocated on it consumed leaves enough; the report then names the most any matching
device has left.

``adminAccess`` requests (``dra-gpu validate``'s check claim is one) get devices other claims
hold, as the scheduler gives them; a device allocated with admin access is not held for others.

Not modelled (named in the report when they matter): shared counters (partitionable devices),
pools with a ``nodeSelector`` (treated as reaching every node).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gpu.explain import capacity
from dra_gpu.explain.cel import DRIVER_REF, CelError, DeviceView, Selector, compiled, plain_value
from dra_gpu.kube.objects import (
    DeviceClassSpec,
    DeviceConstraint,
    DeviceRequest,
    DeviceTaint,
    DeviceToleration,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceSlice,
)

DeviceKey = tuple[str, str, str]  # (driver, pool, device)
ALL_NODES = "(all nodes)"
MAX_SHOWN_VALUES = 5


@dataclass(frozen=True)
class Device:
    key: DeviceKey
    node: str  # ALL_NODES for a pool that every node reaches
    view: DeviceView
    taints: tuple[DeviceTaint, ...]
    shared: bool = False  # allowMultipleAllocations: several claims at once, by capacity


@dataclass(frozen=True)
class Need:
    """One request (or one ``firstAvailable`` alternative) as the allocator sees it."""

    name: str  # "gpu" or "gpu/alt" for a subrequest
    device_class: str
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    tolerations: tuple[DeviceToleration, ...]
    capacity: Mapping[str, Any] = field(default_factory=dict)  # capacity.requests
    admin_access: bool = False  # may take a device other claims hold


@dataclass
class Failure:
    """The first check that rules devices out, with what those devices have."""

    stage: str  # "class selector 1", "selector 2", "allocated", "tainted"
    expression: str | None
    devices: int = 0
    values: dict[str, list[Any]] = field(default_factory=dict)  # name -> distinct values
    error: str | None = None


@dataclass
class NodeCount:
    node: str
    pools: list[str]
    devices: int = 0
    stages: list[int] = field(default_factory=list)  # after class, then after each selector
    allocated: int = 0
    tainted: int = 0
    free: list[DeviceKey] = field(default_factory=list)
    matching: list[DeviceKey] = field(default_factory=list)  # pass every selector

    @property
    def available(self) -> int:
        return len(self.free)


@dataclass
class NeedReport:
    need: Need
    nodes: list[NodeCount]
    failures: list[Failure]
    problem: str | None = None  # the class is missing, a selector does not compile
    # Capacity name -> (asked, the most a matching device has left, that device, its node),
    # for a capacity some matching device could not leave to the request.
    short: dict[str, tuple[int, int, DeviceKey, str]] = field(default_factory=dict)


@dataclass
class Report:
    claim: str
    requests: list[NeedReport]
    constraints: list[DeviceConstraint]
    fits: list[str]  # nodes where the whole claim fits
    suggestions: list[str]
    notes: list[str]

    @property
    def satisfiable(self) -> bool:
        return bool(self.fits)


# --- inputs -------------------------------------------------------------------------------


def current_slices(slices: Iterable[ResourceSlice]) -> list[ResourceSlice]:
    """Only the newest generation of each pool (the scheduler ignores older slices)."""
    newest: dict[tuple[str, str], int] = {}
    listed = list(slices)
    for s in listed:
        spec = s["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        newest[key] = max(newest.get(key, 0), int(spec["pool"].get("generation", 0)))
    return [
        s
        for s in listed
        if int(s["spec"]["pool"].get("generation", 0))
        == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
    ]


def devices_of(slices: Iterable[ResourceSlice]) -> list[Device]:
    out = []
    for s in current_slices(slices):
        spec = s["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        node = spec.get("nodeName") or ALL_NODES
        for d in spec.get("devices") or ():
            view = DeviceView(driver, d.get("attributes") or {}, d.get("capacity") or {})
            taints = tuple(d.get("taints") or ())
            shared = bool(d.get("allowMultipleAllocations"))
            out.append(Device((driver, pool, d["name"]), node, view, taints, shared))
    return out


def allocations(claims: Iterable[ResourceClaim], *, except_uid: str | None) -> dict[DeviceKey, str]:
    """Device -> ``namespace/name`` of the claim it is allocated to (an allocation with admin
    access holds nothing: others may still get the device)."""
    out: dict[DeviceKey, str] = {}
    for c in claims:
        meta = c.get("metadata") or {}
        if except_uid is not None and meta.get("uid") == except_uid:
            continue
        alloc = ((c.get("status") or {}).get("allocation") or {}).get("devices") or {}
        for r in alloc.get("results") or ():
            if r.get("adminAccess"):
                continue
            owner = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            out[(r["driver"], r["pool"], r["device"])] = owner
    return out


def needs_of(request: DeviceRequest) -> list[Need]:
    """The alternatives of one request, in the order the scheduler tries them."""
    if "firstAvailable" in request:
        subs = request["firstAvailable"]
        return [_need(f"{request['name']}/{s['name']}", s) for s in subs]
    return [_need(request["name"], request.get("exactly") or request)]


def _need(name: str, spec: ExactDeviceRequest) -> Need:
    mode = spec.get("allocationMode") or "ExactCount"
    return Need(
        name=name,
        device_class=spec.get("deviceClassName", ""),
        selectors=tuple(s["cel"]["expression"] for s in spec.get("selectors") or () if "cel" in s),
        all_devices=mode == "All",
        count=int(spec.get("count") or 1),
        tolerations=tuple(spec.get("tolerations") or ()),
        capacity=dict((spec.get("capacity") or {}).get("requests") or {}),
        admin_access=bool(spec.get("adminAccess")),
    )


# --- per-device checks -------------------------------------------------------------------


def _tolerated(taint: DeviceTaint, tolerations: Sequence[DeviceToleration]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _blocking_taint(device: Device, tolerations: Sequence[DeviceToleration]) -> bool:
    return any(
        t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations)
        for t in device.taints
    )


def _record(failure: Failure, device: Device, selector: Selector | None) -> None:
    failure.devices += 1
    if selector is None or not selector.references:
        return
    for ref in selector.references:
        name = "driver" if ref == DRIVER_REF else f"{ref[0]}['{ref[1]}'].{ref[2]}"
        raw = device.view.raw(ref)
        value = raw if ref == DRIVER_REF else plain_value(raw)
        seen = failure.values.setdefault(name, [])
        if value not in seen and len(seen) < MAX_SHOWN_VALUES:
            seen.append(value)


def _capacity_left(
    need: Need, device: Device, used: Mapping[DeviceKey, Mapping[str, int]]
) -> tuple[bool, dict[str, tuple[int, int]]]:
    """Whether the device can take the request by capacity (even when empty), and the
    capacities it has too little of now: name -> (asked or consumed, left)."""
    driver = device.key[0]
    totals = capacity.values(device.view.capacity, driver)
    want = capacity.asked(need.capacity, driver)
    if not device.shared:
        name = capacity.shortfall(want, totals)
        return name is None, {}
    consumes = capacity.consumption(device.view.capacity, want, driver)
    if consumes is None or capacity.shortfall(consumes, totals) is not None:
        return False, {}
    free = capacity.left(totals, used.get(device.key, {}))
    return True, {n: (a, free.get(n, 0)) for n, a in consumes.items() if a > free.get(n, 0)}


def _count_need(
    need: Need,
    class_selectors: Sequence[str],
    devices: Sequence[Device],
    pools_of_node: Mapping[str, list[str]],
    allocated: Mapping[DeviceKey, str],
    used: Mapping[DeviceKey, Mapping[str, int]] | None = None,
) -> NeedReport:
    try:
        stages = [("class selector", e, compiled(e)) for e in class_selectors] + [
            ("selector", e, compiled(e)) for e in need.selectors
        ]
    except CelError as err:
        return NeedReport(need, [], [], problem=f"a selector {err}")
    by_node: dict[str, NodeCount] = {
        n: NodeCount(n, pools, stages=[0] * (len(need.selectors) + 1))
        for n, pools in pools_of_node.items()
    }
    failures: dict[tuple[str, int], Failure] = {}
    short: dict[str, tuple[int, int, DeviceKey, str]] = {}
    n_class = len(class_selectors)
    for device in devices:
        counts = by_node[device.node]
        counts.devices += 1
        passed = True
        for i, (kind, expression, selector) in enumerate(stages):
            verdict = selector.check(device.view)
            if not verdict.matches:
                number = i + 1 if i < n_class else i - n_class + 1
                label = f"{kind} {number}"
                failure = failures.setdefault(
                    (label, int(verdict.error is not None)),
                    Failure(label, expression, error=verdict.error),
                )
                _record(failure, device, selector)
                passed = False
                break
            if i >= n_class - 1:
                counts.stages[i - n_class + 1] += 1
        if not passed:
            continue
        can, lacking = _capacity_left(need, device, used or {})
        if not can:
            label = "capacity request"
            failure = failures.setdefault((label, 0), Failure(label, None))
            _record(failure, device, None)
            continue
        counts.matching.append(device.key)
        for name, (amount, free) in lacking.items():
            if name not in short or free > short[name][1]:
                short[name] = (amount, free, device.key, device.node)
        if device.shared and not lacking and not _blocking_taint(device, need.tolerations):
            counts.free.append(device.key)  # allocated to others, with enough left for this
        elif (device.key in allocated and not need.admin_access) or lacking:
            counts.allocated += 1
            _record(failures.setdefault(("allocated", 0), Failure("allocated", None)), device, None)
        elif _blocking_taint(device, need.tolerations):
            counts.tainted += 1
            _record(failures.setdefault(("tainted", 0), Failure("tainted", None)), device, None)
        else:
            counts.free.append(device.key)
    if n_class == 0:  # no class selectors: every device passes the class stage
        for counts in by_node.values():
            counts.stages[0] = counts.devices
    return NeedReport(need, list(by_node.values()), list(failures.values()), short=short)


# --- fitting one node --------------------------------------------------------------------


def _attribute(view: DeviceView, qualified: str) -> Any:
    domain, _, name = qualified.rpartition("/")
    raw = view.raw(("attributes", domain or view.driver, name))
    return None if raw is None else tuple(sorted(raw.items()))


def _assign(slots: Sequence[list[Any]]) -> bool:
    """Whether each slot gets its own target (Kuhn's augmenting paths)."""
    owner: dict[Any, int] = {}

    def place(slot: int, seen: set[Any]) -> bool:
        for target in slots[slot]:
            if target in seen:
                continue
            seen.add(target)
            if target not in owner or place(owner[target], seen):
                owner[target] = slot
                return True
        return False

    return all(place(i, set()) for i in range(len(slots)))


def _fits_node(
    needs: Sequence[Need],
    reports: Mapping[str, NodeCount],
    constraints: Sequence[DeviceConstraint],
    views: Mapping[DeviceKey, DeviceView],
) -> bool:
    candidates: dict[str, list[DeviceKey]] = {}
    for need in needs:
        counts = reports[need.name]
        if need.all_devices and (not counts.matching or counts.available != len(counts.matching)):
            return False
        candidates[need.name] = list(counts.free)
    wanted = {n.name: (len(reports[n.name].matching) if n.all_devices else n.count) for n in needs}
    base = {n.name.split("/")[0]: n.name for n in needs}

    def scope(c: DeviceConstraint) -> list[str]:
        return [base[r] for r in (c.get("requests") or base) if r in base]

    matches = [c for c in constraints if c.get("matchAttribute")]
    distinct = [c for c in constraints if c.get("distinctAttribute")]
    choices: list[list[tuple[DeviceConstraint, Any]]] = []
    for c in matches:
        attr = c["matchAttribute"]
        values = {_attribute(views[k], attr) for r in scope(c) for k in candidates[r]} - {None}
        choices.append([(c, v) for v in values])
    for picked in itertools.product(*choices):
        allowed = {n: list(ks) for n, ks in candidates.items()}
        for c, value in picked:
            for r in scope(c):
                allowed[r] = [
                    k for k in allowed[r] if _attribute(views[k], c["matchAttribute"]) == value
                ]
        slots: list[list[Any]] = []
        distinct_scope = {r: c["distinctAttribute"] for c in distinct for r in scope(c)}
        for name, keys in allowed.items():
            if name in distinct_scope:
                attr = distinct_scope[name]
                targets = list(
                    dict.fromkeys(
                        ("value", attr, _attribute(views[k], attr))
                        for k in keys
                        if _attribute(views[k], attr) is not None
                    )
                )
            else:
                targets = list(keys)
            slots.extend([targets] * wanted[name])
        if _assign(slots):
            return True
    return False


# --- the report -------------------------------------------------------------------------


def explain_claim(
    claim: ResourceClaim,
    *,
    classes: Mapping[str, DeviceClassSpec],
    slices: Iterable[ResourceSlice],
    claims: Iterable[ResourceClaim],
) -> Report:
    meta = claim.get("metadata") or {}
    title = f"{meta.get('namespace', '')}/{meta.get('name', '(from file)')}"
    spec = (claim.get("spec") or {}).get("devices") or {}
    requests = spec.get("requests") or []
    constraints = list(spec.get("constraints") or [])
    devices = devices_of(slices)
    views = {d.key: d.view for d in devices}
    pools_of_node: dict[str, list[str]] = {}
    for d in devices:
        pools = pools_of_node.setdefault(d.node, [])
        if d.key[1] not in pools:
            pools.append(d.key[1])
    claims = list(claims)
    allocated = allocations(claims, except_uid=meta.get("uid"))
    used = capacity.consumed(claims, except_uid=meta.get("uid"))
    notes: list[str] = []
    if ALL_NODES in pools_of_node:
        notes.append("pools without a nodeName are counted as reaching every node")

    alternatives: list[list[Need]] = [needs_of(r) for r in requests]
    reports: dict[str, NeedReport] = {}
    for need in itertools.chain.from_iterable(alternatives):
        device_class = classes.get(need.device_class)
        if device_class is None:
            reports[need.name] = NeedReport(
                need, [], [], problem=f"DeviceClass {need.device_class!r} does not exist"
            )
            continue
        class_selectors = [
            s["cel"]["expression"] for s in device_class.get("selectors") or () if "cel" in s
        ]
        reports[need.name] = _count_need(
            need, class_selectors, devices, pools_of_node, allocated, used
        )

    node_names = sorted(n for n in pools_of_node if n != ALL_NODES)
    fits = []
    for node in node_names or [ALL_NODES]:
        for combo in itertools.product(*alternatives):
            if any(reports[n.name].problem for n in combo):
                continue
            merged = {n.name: _merged(reports[n.name], node) for n in combo}
            if _fits_node(combo, merged, constraints, views):
                fits.append(node)
                break
    report = Report(title, list(reports.values()), constraints, fits, [], notes)
    if not fits:
        report.suggestions.extend(_suggestions(report, allocated))
        if constraints and not report.suggestions:
            report.suggestions.append(
                "every request fits alone, but not together under the constraints "
                f"{constraints}: relax a matchAttribute/distinctAttribute or lower a count"
            )
    return report


def _merged(report: NeedReport, node: str) -> NodeCount:
    """The node's own pools plus those that reach every node."""
    parts = [c for c in report.nodes if c.node in (node, ALL_NODES)]
    out = NodeCount(node, [p for c in parts for p in c.pools])
    for c in parts:
        out.devices += c.devices
        out.allocated += c.allocated
        out.tainted += c.tainted
        out.free += c.free
        out.matching += c.matching
    return out


def _suggestions(report: Report, allocated: Mapping[DeviceKey, str]) -> Iterator[str]:
    for r in report.requests:
        need = r.need
        if r.problem:
            yield f"request {need.name}: {r.problem}"
            continue
        best = max(r.nodes, key=lambda c: c.available, default=None)
        matching = max((len(c.matching) for c in r.nodes), default=0)
        for f in r.failures:
            if f.error:
                yield (
                    f"request {need.name}: {f.stage} fails with a CEL error on {f.devices} "
                    f"device(s): {f.error}; fix the expression {f.expression!r}"
                )
        if matching == 0 and any(f.stage == "capacity request" for f in r.failures):
            asked = ", ".join(f"{k}: {v}" for k, v in sorted(need.capacity.items()))
            yield (
                f"request {need.name}: no device that passes its selectors has the capacity it "
                f"asks for ({asked}) even when no other claim uses it"
            )
            continue
        if matching == 0:
            first = next((f for f in r.failures if f.expression and not f.error), None)
            if first is not None:
                shown = ", ".join(f"{k} = {v}" for k, v in first.values.items())
                yield (
                    f"request {need.name}: no device passes {first.stage} "
                    f"({first.expression}); the devices have {shown}"
                )
            continue
        if best is None:
            continue
        if need.all_devices:
            if best.allocated or best.tainted:
                yield f"request {need.name}: allocationMode All needs every matching device free"
            continue
        if best.available < need.count and r.short:
            for name, (amount, free, key, node) in sorted(r.short.items()):
                yield (
                    f"request {need.name}: asks {_amount(name, amount)} {name}, the most any "
                    f"matching device has left is {_amount(name, free)} ({key[2]} on {node}, "
                    "shared with other claims); wait for a share to be released or ask for "
                    f"at most {_amount(name, free)}"
                )
            continue
        if best.available < need.count:
            if matching >= need.count:
                used = {k for c in r.nodes for k in c.matching}
                owners = sorted({o for k, o in allocated.items() if k in used})[:MAX_SHOWN_VALUES]
                yield (
                    f"request {need.name}: {matching} devices match on some node but only "
                    f"{best.available} are free (allocated to {', '.join(owners) or 'none'}, "
                    f"or tainted); wait for those claims to be released"
                )
            else:
                yield (
                    f"request {need.name}: count {need.count} is more than any node offers "
                    f"(at most {best.available} matching free devices, on {best.node}); "
                    f"ask for {best.available} or fewer"
                )


def _amount(name: str, value: int) -> str:
    """Memory as Kubernetes prints it (``40Gi``); other capacities as numbers."""
    if name.rpartition("/")[2] != "memory":
        return str(value)
    for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value and value % size == 0:
            return f"{value // size}{suffix}"
    return str(value)
