"""ResourceClaim JSON as the API server returns it, a fake ClaimFetcher and a simulated node."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from dra_gpu.devices.model import Device
from dra_gpu.devices.naming import build_devices
from dra_gpu.devices.profiles import resolve_profile
from dra_gpu.devices.simulated import SimulatedBackend
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import node_facts
from dra_gpu.prepare.plan import ClaimRef
from dra_gpu.prepare.state import DeviceState, StateSettings

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
API = "resource.nvidia.com/v1beta1"


def inventory(profile: str = "a100x4-mig", node: str = NODE) -> dict[str, Device]:
    gpus = SimulatedBackend(profile=resolve_profile(profile), node_name=node).discover().gpus
    return {d.name: d for d in build_devices(gpus)}


def result(
    device: str,
    request: str = "gpu",
    *,
    driver: str = DRIVER,
    pool: str = NODE,
    share_id: str | None = None,
    admin: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        out["shareID"] = share_id
    if admin:
        out["adminAccess"] = True
    return out


def config(
    parameters: Mapping[str, Any],
    *,
    source: str = "FromClaim",
    requests: Sequence[str] = (),
    driver: str = DRIVER,
) -> dict[str, Any]:
    out: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        out["requests"] = list(requests)
    return out


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def mig_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


def claim(
    uid: str,
    results: Sequence[Mapping[str, Any]] | None,
    *,
    name: str | None = None,
    namespace: str = "default",
    configs: Sequence[Mapping[str, Any]] = (),
    requests: Sequence[str] = (),
) -> dict[str, Any]:
    """A claim; ``results=None`` means not allocated. Its spec has the requests its results
    name (``req/sub``: request ``req`` with subrequest ``sub``), and ``requests`` besides; the
    ``FromClaim`` configs as written, which the allocation repeats as the Kubernetes 1.37.2
    scheduler does: without their ``requests``."""
    spec_requests: dict[str, list[dict[str, str]]] = {}
    for request in [*(str(r["request"]) for r in results or ()), *requests]:
        main, _, sub = request.partition("/")
        spec_requests.setdefault(main, []).extend([{"name": sub}] if sub else [])
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name or f"claim-{uid}", "namespace": namespace, "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {"name": n, "firstAvailable": subs} if subs else {"name": n}
                    for n, subs in spec_requests.items()
                ],
                "config": [
                    {k: v for k, v in c.items() if k != "source"}
                    for c in configs
                    if c.get("source") == "FromClaim"
                ],
            }
        },
        "status": {},
    }
    allocated = [
        {k: v for k, v in c.items() if k != "requests" or c.get("source") != "FromClaim"}
        for c in configs
    ]
    if results is not None:
        body["status"]["allocation"] = {"devices": {"results": list(results), "config": allocated}}
    return body


def ref(uid: str) -> ClaimRef:
    """A claim of the default namespace, named after its UID."""
    return ClaimRef(uid=ClaimUID(uid), namespace="default", name=f"claim-{uid}")


class FakeFetcher:
    """``state.ClaimFetcher`` over a dict; counts calls so tests can see cache hits."""

    def __init__(self, *claims: Mapping[str, Any]) -> None:
        self.claims: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.calls = 0
        for c in claims:
            self.add(c)

    def add(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = body

    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        self.calls += 1
        found = self.claims.get((namespace, name))
        # Test bodies, malformed ones included: typed as what the API server would send.
        return cast(ResourceClaim, copy.deepcopy(found)) if found is not None else None


def device_state(
    root: Path,
    *,
    devices: Mapping[str, Device],
    claims: FakeFetcher,
    simulated: bool = True,
    driver_root: Path = Path("/"),
    boot_id: Callable[[], str] = lambda: "boot",
    report: Callable[[str, str], None] = lambda reason, message: None,
    **kwargs: Any,
) -> DeviceState:
    """A DeviceState of node ``NODE`` with its CDI and state directories under ``root``."""
    settings = StateSettings(
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=root / "cdi",
        state_dir=root / "state",
    )
    return DeviceState(
        settings=settings,
        inventory=lambda: devices,
        claims=claims,
        node_facts=(
            node_facts.simulated
            if simulated
            else node_facts.HostNode(driver_root=driver_root, host_driver_root=None)
        ),
        boot_id=boot_id,
        report=report,
        **kwargs,
    )
