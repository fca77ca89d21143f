"""What a container saw versus what its claims were allocated: pure parsing and comparison.

Every scenario container runs the same script (see ``e2e/scenarios/*/``): it prints ``== env``, its
sorted environment, ``== devices``, every ``/dev/nvidia*`` path it has, then ``== end``. From the
claim's ``status.allocation`` the suite derives what the container must see — no more, no less:

- ``GPU_DEVICE_<key>=<device name>`` for each allocated device of our driver (the CDI env edit;
  ``<key>`` is derived from the name, see ``dra_gpu.prepare.cdi.env_prefix``);
- ``/dev/nvidia<minor>`` for each device (a MIG device shows its parent GPU's node) plus the
  control nodes, which appear iff the container got at least one device.

MIG capability nodes (``/dev/nvidia-caps/...``) only exist on real GPUs; they are not required
but, when present, must belong to a claimed MIG device's GPU (checked by the real-GPU tests).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.prepare.cdi import env_prefix

CONTROL_NODES = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"})
_GPU_MINOR = re.compile(r"^gpu-(\d+)(?:-mig-|$)")


class LogIncomplete(ValueError):
    """The container has not printed its full report (yet)."""


@dataclass(frozen=True)
class ContainerView:
    env: Mapping[str, str]
    device_paths: frozenset[str]

    @property
    def device_names(self) -> frozenset[str]:
        """The devices the CDI environment announces (``GPU_DEVICE_<key>=<name>``)."""
        return frozenset(v for k, v in self.env.items() if k == env_prefix(v))

    @property
    def gpu_nodes(self) -> frozenset[str]:
        return frozenset(p for p in self.device_paths if re.fullmatch(r"/dev/nvidia\d+", p))


def parse_report(log: str) -> ContainerView:
    """Parse a container's report; raises ``LogIncomplete`` until ``== end`` was printed."""
    lines = log.splitlines()
    try:
        env_at, dev_at, end_at = (lines.index(m) for m in ("== env", "== devices", "== end"))
    except ValueError:
        raise LogIncomplete("the container's report is not complete") from None
    env: dict[str, str] = {}
    for line in lines[env_at + 1 : dev_at]:
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    paths = frozenset(p.strip() for p in lines[dev_at + 1 : end_at] if p.strip())
    return ContainerView(env=env, device_paths=paths)


def gpu_minor(device_name: str) -> int:
    """The GPU minor a device name carries (``gpu-3`` and ``gpu-3-mig-…`` -> 3)."""
    match = _GPU_MINOR.match(device_name)
    if match is None:
        raise ValueError(f"{device_name!r} is not a gpu.nvidia.com device name")
    return int(match.group(1))


def allocated_devices(
    claim: Mapping[str, Any], *, request: str | None = None, driver: str = DRIVER_NAME
) -> list[str]:
    """Device names of ``driver`` in a claim's allocation, for one request (or all of them)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    names = []
    for result in results:
        if result.get("driver") != driver:
            continue
        req = str(result.get("request", ""))
        # A request with subrequests (firstAvailable) is reported as "<request>/<subrequest>".
        if request is None or req == request or req.startswith(f"{request}/"):
            names.append(str(result["device"]))
    return names


def expected_paths(device_names: Iterable[str]) -> frozenset[str]:
    names = list(device_names)
    if not names:
        return frozenset()
    return frozenset({f"/dev/nvidia{gpu_minor(n)}" for n in names} | CONTROL_NODES)


def mismatches(view: ContainerView, device_names: Sequence[str]) -> list[str]:
    """Human-readable differences between what a container saw and what it was allocated."""
    problems = []
    expected = frozenset(device_names)
    if view.device_names != expected:
        problems.append(
            f"GPU_DEVICE_* env names {sorted(view.device_names)}, allocated {sorted(expected)}"
        )
    want = expected_paths(expected)
    seen = frozenset(p for p in view.device_paths if not p.startswith("/dev/nvidia-caps"))
    if seen != want:
        problems.append(
            f"device nodes {sorted(seen)}, expected {sorted(want)}"
            f" (missing {sorted(want - seen)}, unexpected {sorted(seen - want)})"
        )
    return problems


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod-level claim name -> ResourceClaim name (template claims via the pod's status)."""
    statuses = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: dict[str, str] = {}
    for ref in pod["spec"].get("resourceClaims") or []:
        claim = ref.get("resourceClaimName") or statuses.get(ref["name"])
        if claim:
            names[ref["name"]] = claim
    return names


def extended_requests(pod: Mapping[str, Any], container: str) -> tuple[str, list[str]]:
    """The claim the scheduler made for extended resources (``nvidia.com/gpu: 1`` served by a
    DeviceClass's ``extendedResourceName``; "" if none) and the requests of it that belong to
    ``container``."""
    status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    requests = [
        str(m["requestName"])
        for m in status.get("requestMappings") or []
        if m.get("containerName") == container
    ]
    return str(status.get("resourceClaimName") or ""), requests
