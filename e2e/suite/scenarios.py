"""The scenario catalog: one entry per folder of ``e2e/scenarios/``, with its own checks.

The suite expects the driver's simulated profiles on the cluster's nodes: at least one node with
``h200x8`` (8 full H200 GPUs) and one with ``a100x4-mig`` (A100 40GB with pre-created MIG devices),
which is what the local harness and ``e2e/kind/`` set up. Every check reads device facts from the
ResourceSlices (never from what the container printed), so a container cannot vouch for itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.config.quantity import to_bytes as parse_quantity
from dra_gpu.prepare.cdi import env_prefix
from e2e.suite import needs
from e2e.suite.kube import WaitTimeout, wait_for
from e2e.suite.runner import Check, Context, Run, Scenario


def device_facts(ctx: Context, pool: str, device: str) -> Mapping[str, Any]:
    """The published device (attributes, capacity) of ``pool``/``device``, from the slices."""
    newest: dict[str, Any] = {}
    generation = -1
    for item in ctx.kube.slices():
        spec = item["spec"]
        if spec["driver"] != DRIVER_NAME or spec["pool"]["name"] != pool:
            continue
        for dev in spec.get("devices") or []:
            if dev["name"] == device and spec["pool"]["generation"] > generation:
                newest, generation = dev, spec["pool"]["generation"]
    return newest


def _attribute(facts: Mapping[str, Any], name: str) -> object:
    value = (facts.get("attributes") or {}).get(name) or {}
    return next(iter(value.values()), None) if value else None


def _each_device(
    ctx: Context, run: Run, judge: Callable[[str, Mapping[str, Any]], str | None]
) -> list[str]:
    problems = []
    for container in run.containers:
        for device in container.devices:
            facts = device_facts(ctx, container.pools[device], device)
            problem = judge(device, facts)
            if problem:
                problems.append(f"{container.pod}/{container.container}: {device} {problem}")
    return problems


def device_count(n: int) -> Check:
    def check(ctx: Context, run: Run) -> list[str]:
        return [
            f"{c.pod}/{c.container} got {len(c.devices)} devices, wanted {n}"
            for c in run.containers
            if c.devices and len(set(c.devices)) != n
        ]

    return check


def attribute_is(name: str, expected: object) -> Check:
    def check(ctx: Context, run: Run) -> list[str]:
        def judge(_: str, facts: Mapping[str, Any]) -> str | None:
            got = _attribute(facts, name)
            return None if got == expected else f"has {name}={got!r}, wanted {expected!r}"

        return _each_device(ctx, run, judge)

    return check


def one_known_value_of(name: str) -> Check:
    """All devices of each container share one value of ``name`` (from the slices), and have it."""

    def check(ctx: Context, run: Run) -> list[str]:
        problems = []
        for c in run.containers:
            values = {d: _attribute(device_facts(ctx, c.pools[d], d), name) for d in set(c.devices)}
            if None in values.values() or len(set(values.values())) > 1:
                problems.append(f"{c.pod}/{c.container}: {name} of its devices: {values}")
        return problems

    return check


def _published(facts: Mapping[str, Any]) -> dict[str, object]:
    return {
        "uuid": _attribute(facts, "uuid"),
        "productName": _attribute(facts, "productName"),
        "pciBusID": _attribute(facts, "resource.kubernetes.io/pciBusID"),
    }


def metadata_names_its_devices(ctx: Context, run: Run) -> list[str]:
    """The device metadata file the container printed (after ``== metadata``) names each of its
    devices with the UUID, product and PCI bus ID its slice publishes."""
    problems = []
    for c in run.containers:
        lines = ctx.kube.log(run.namespace, c.pod, c.container).splitlines()
        try:
            body = json.loads(lines[lines.index("== metadata") + 1])
            listed = {d["name"]: d["attributes"] for r in body["requests"] for d in r["devices"]}
        except (ValueError, IndexError, KeyError, TypeError) as e:
            problems.append(f"{c.pod}/{c.container}: no readable metadata file ({e!r})")
            continue
        for device in c.devices:
            attrs = listed.get(device) or {}
            got = {
                "uuid": next(iter((attrs.get("uuid") or {}).values()), None),
                "productName": next(iter((attrs.get("productName") or {}).values()), None),
                "pciBusID": next(
                    iter((attrs.get("resource.kubernetes.io/pciBusID") or {}).values()), None
                ),
            }
            wanted = _published(device_facts(ctx, c.pools[device], device))
            if got != wanted:
                problems.append(
                    f"{c.pod}/{c.container}: metadata of {device} {got}, slice {wanted}"
                )
    return problems


def status_names_its_devices(ctx: Context, run: Run) -> list[str]:
    """Each claim's ``status.devices`` (written after prepare, so waited for) has our driver's
    entry for each allocated device, Ready, with the UUID its slice publishes."""
    problems = []
    for name, claim in run.claims.items():
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        ours = [r for r in results.get("results") or [] if r["driver"] == DRIVER_NAME]

        def entries(name: str = name, want: int = len(ours)) -> dict[str, Any] | None:
            got = ctx.kube.claim(run.namespace, name) or {}
            found = {
                e["device"]: e
                for e in (got.get("status") or {}).get("devices") or []
                if e["driver"] == DRIVER_NAME
            }
            return found if len(found) >= want else None

        try:
            found = wait_for(f"status.devices of {name}", entries, timeout=ctx.timeout)
        except WaitTimeout as e:
            problems.append(str(e))
            continue
        for r in ours:
            entry = found.get(r["device"]) or {}
            uuid = (entry.get("data") or {}).get("uuid")
            wanted = _attribute(device_facts(ctx, r["pool"], r["device"]), "uuid")
            ready = [c for c in entry.get("conditions") or [] if c.get("type") == "Ready"]
            if uuid != wanted or [c.get("status") for c in ready] != ["True"]:
                problems.append(f"claim {name}: status of {r['device']}: {entry}")
    return problems


def memory_at_least(minimum: int) -> Check:
    def check(ctx: Context, run: Run) -> list[str]:
        def judge(_: str, facts: Mapping[str, Any]) -> str | None:
            raw = ((facts.get("capacity") or {}).get("memory") or {}).get("value", "0")
            got = parse_quantity(str(raw))
            return None if got >= minimum else f"has memory {raw}, wanted >= {minimum}"

        return _each_device(ctx, run, judge)

    return check


def device_env_has(**expected: str) -> Check:
    """Each device a container got is described by ``GPU_DEVICE_<key>_<NAME>=<value>``."""

    def check(ctx: Context, run: Run) -> list[str]:
        problems = []
        for c in run.containers:
            for device in c.devices:
                for suffix, value in expected.items():
                    key = f"{env_prefix(device)}_{suffix}"
                    if c.view.env.get(key) != value:
                        problems.append(f"{c.pod}/{c.container}: {key}={c.view.env.get(key)!r}")
        return problems

    return check


def sharing_by_type(**strategy: str) -> Check:
    """Each device's ``_SHARING_STRATEGY`` is ``strategy[<its type>]`` (type from the slices)."""

    def check(ctx: Context, run: Run) -> list[str]:
        def judge(device: str, facts: Mapping[str, Any]) -> str | None:
            wanted = strategy[str(_attribute(facts, "type"))]
            key = f"{env_prefix(device)}_SHARING_STRATEGY"
            got = {c.view.env.get(key) for c in run.containers if device in c.devices}
            return (
                None if got == {wanted} else f"has {key}={sorted(map(str, got))}, wanted {wanted}"
            )

        return _each_device(ctx, run, judge)

    return check


def one_device_shared(ctx: Context, run: Run) -> list[str]:
    """Every container with a claim saw the same single device, all on one node."""
    users = [c for c in run.containers if c.devices]
    seen = {frozenset(c.view.device_names) for c in users}
    nodes = {c.node for c in users}
    problems = []
    if len(users) < 2:
        problems.append(f"expected at least two containers sharing the claim, got {len(users)}")
    if len(seen) != 1 or len(next(iter(seen), frozenset())) != 1:
        problems.append(f"containers saw different devices: {[sorted(s) for s in seen]}")
    if len(nodes) != 1:
        problems.append(f"sharing pods ran on several nodes: {sorted(nodes)}")
    return problems


def some_container_without_devices(ctx: Context, run: Run) -> list[str]:
    bare = [c for c in run.containers if not c.devices]
    if not bare:
        return ["expected a container without a claim"]
    return [
        f"{c.pod}/{c.container} has no claim but saw {sorted(c.view.device_paths)}"
        for c in bare
        if c.view.device_paths
    ]


def _asked_memory(claim: Mapping[str, Any], request: str) -> int | None:
    """The memory ``request`` of ``claim`` asks with ``capacity.requests`` (None: nothing)."""
    for r in (claim.get("spec") or {}).get("devices", {}).get("requests") or []:
        if r["name"] == request:
            raw = (((r.get("exactly") or {}).get("capacity") or {}).get("requests") or {}).get(
                "memory"
            )
            return parse_quantity(str(raw)) if raw is not None else None
    return None


def memory_requests_met(ctx: Context, run: Run) -> list[str]:
    """Each claim that asks memory of a GPU got one with at least that much (from the slices).
    Where the GPU is published for several claims (``allowMultipleAllocations``: a node in
    consumable-shares mode), its allocation result must also carry a shareID of its own and
    what it consumed, at least the memory asked; elsewhere the request only filters."""
    problems = []
    share_ids: dict[str, str] = {}
    asking = 0
    for name, claim in run.claims.items():
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
        for r in results.get("results") or []:
            asked = _asked_memory(claim, r["request"])
            if r["driver"] != DRIVER_NAME or asked is None:
                continue
            asking += 1
            facts = device_facts(ctx, r["pool"], r["device"])
            raw = ((facts.get("capacity") or {}).get("memory") or {}).get("value", "0")
            if parse_quantity(str(raw)) < asked:
                problems.append(f"claim {name}: {r['device']} has memory {raw}, asked {asked}")
            if not facts.get("allowMultipleAllocations"):
                continue
            consumed = (r.get("consumedCapacity") or {}).get("memory")
            share = str(r.get("shareID") or "")
            if not share or share in share_ids:
                problems.append(f"claim {name}: shareID {share!r} (others: {share_ids})")
            share_ids[share] = name
            if consumed is None or parse_quantity(str(consumed)) < asked:
                problems.append(f"claim {name}: consumed memory {consumed}, asked {asked}")
    if asking < 2:
        problems.append(f"expected two allocated claims asking memory, got {asking}")
    return problems


GI = 2**30

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("one-gpu", "one GPU", checks=(device_count(1),)),
    Scenario("two-gpus", "two GPUs in one claim", checks=(device_count(2),)),
    Scenario(
        "two-gpus-one-numa-node",
        "two GPUs on the same NUMA node (matchAttribute on resource.kubernetes.io/numaNode)",
        checks=(device_count(2), one_known_value_of("resource.kubernetes.io/numaNode")),
    ),
    Scenario(
        "extended-resource",
        "a device-plugin style nvidia.com/gpu: 1 limit, served through DRA",
        checks=(device_count(1), device_env_has(TYPE="gpu")),
        needs=(needs.extended_resource_mapping,),
    ),
    Scenario(
        "two-claims",
        "one container with two claims sees both GPUs",
        checks=(device_count(2), device_env_has(TYPE="gpu")),
    ),
    Scenario(
        "device-status-and-metadata",
        "the claim's status.devices and the container's device metadata file name the GPU",
        checks=(device_count(1), status_names_its_devices, metadata_names_its_devices),
    ),
    Scenario(
        "gpu-by-product",
        "a GPU by product name",
        checks=(device_count(1), attribute_is("productName", "NVIDIA H200")),
    ),
    Scenario(
        "gpu-by-memory",
        "a GPU with at least 100Gi (CEL capacity selector)",
        checks=(device_count(1), memory_at_least(100 * GI)),
    ),
    Scenario(
        "mig-by-profile",
        "a MIG device by profile",
        checks=(
            device_count(1),
            attribute_is("type", "mig"),
            attribute_is("profile", "3g.20gb"),
            device_env_has(TYPE="mig", MIG_PROFILE="3g.20gb"),
        ),
    ),
    Scenario(
        "shared-by-containers",
        "one claim shared by two containers of a pod",
        checks=(one_device_shared, some_container_without_devices),
    ),
    Scenario("shared-by-pods", "one claim shared by two pods", checks=(one_device_shared,)),
    Scenario(
        "shared-by-memory",
        "two claims asking 40Gi and 20Gi of a GPU; on a consumable-shares node, a share each",
        checks=(device_count(1), memory_requests_met),
        needs=(needs.consumable_capacity,),
    ),
    Scenario(
        "gpu-config",
        "a claim with a GpuConfig (time-slicing)",
        checks=(device_env_has(SHARING_STRATEGY="TimeSlicing", TIMESLICE_INTERVAL="Long"),),
    ),
    Scenario(
        "gpu-and-mig-one-config",
        "a GPU and a MIG device with one claim-wide GpuConfig: the GPU gets it, the MIG device not",
        checks=(device_count(2), sharing_by_type(gpu="MPS", mig="TimeSlicing")),
    ),
    Scenario(
        "unsatisfiable",
        "an unsatisfiable request stays Pending with the scheduler's reason",
        expect="pending",
    ),
    Scenario(
        "invalid-config",
        "an invalid GpuConfig fails to prepare, the pod says why",
        expect="prepare-fails",
        problem="mpsConfig",
    ),
    Scenario(
        "all-gpus-reusable",
        "deleting pods frees their devices for the next claim",
        checks=(device_count(8),),
        repeat=2,
    ),
)

BY_NAME = {s.name: s for s in SCENARIOS}
