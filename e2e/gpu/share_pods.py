"""Consumable GPU shares enforced on a real GPU, under the kubelet (``e2e.gpu.demo``).

The plugin runs with ``--consumable-shares memory --mps-support true``. Two claims ask for
``capacity.requests.memory`` of 40Gi and 20Gi of one GPU; the scheduler puts both on it, each
with its ``shareID``. Each share's MPS server is limited to its memory before it starts. The pods
run ``gpucheck alloc``: allocate in steps until CUDA refuses, report, hold. The small share's pod
has a second container that asks, by environment, for the whole GPU
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``): a client can only lower its server's limit, never raise
it.

Checks: both claims on the one GPU with distinct share IDs and the consumed memory asked; every
container got about its share (at most ``slack`` MiB below it, never above) and was stopped by
CUDA's out-of-memory error, all holding at once; after the pods and claims are deleted no MPS
daemon is left.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.controller.classes import GPU_CLASS
from e2e.gpu import image
from e2e.suite.kube import RESOURCE, Kube, WaitTimeout, wait_for

GIB_MIB = 1024
SHARES = {"share-big": 40, "share-small": 20}  # pod (and claim) -> GiB of memory
GREEDY_ENV = {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=141G"}
_ALLOC_RE = re.compile(r"^alloc: allocated_mib=(\d+) stopped_by=(\S+) total_mib=(\d+)$", re.M)
LogOf = Callable[[str, str], str]  # (pod, container) -> its log
MPS_COMMANDS = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


@dataclass
class SharesReport:
    lines: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))
        print(f"[gpu-demo] {'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)


def share_claim(name: str, gib: int) -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": GPU_CLASS,
            "capacity": {"requests": {"memory": f"{gib}Gi"}},
        },
    }
    return {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def _container(name: str, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": image.CHECK_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", "gpucheck; exec gpucheck alloc 256"],
        "resources": {"claims": [{"name": "gpu"}]},
    }
    if env:
        c["env"] = env
    return c


def share_pod(name: str, *, greedy: bool) -> dict[str, Any]:
    containers = [_container("alloc")]
    if greedy:
        containers.append(_container("greedy", [GREEDY_ENV]))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": containers,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }


def consumable_published(kube: Kube, node: str) -> bool:
    return any(
        d.get("allowMultipleAllocations")
        for s in kube.slices()
        if s["spec"].get("nodeName") == node and s["spec"].get("driver") == DRIVER_NAME
        for d in s["spec"].get("devices", [])
    )


def mps_processes(proc: Path = Path("/proc")) -> list[str]:
    """``pid command`` of every MPS daemon process on the machine."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if Path(argv0).name in MPS_COMMANDS:
            found.append(f"{entry.name} {Path(argv0).name}")
    return found


def results(kube: Kube, namespace: str, claim: str) -> list[dict[str, Any]]:
    found = kube.claim(namespace, claim) or {}
    allocation = (found.get("status") or {}).get("allocation") or {}
    return [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == DRIVER_NAME
    ]


def _alloc_line(log: LogOf, pod: str, container: str) -> re.Match[str] | None:
    return _ALLOC_RE.search(log(pod, container))


def run(
    kube: Kube,
    *,
    namespace: str,
    wait_started: Callable[[list[str]], object],
    log: LogOf,
    timeout: float,
    slack_mib: int,
) -> SharesReport:
    """Create the claims and pods, check, delete them; ``wait_started(pods)`` and
    ``log(pod, container)`` are the demo's."""
    report = SharesReport()
    before = mps_processes()
    for name, gib in SHARES.items():
        kube.create(namespace, share_claim(name, gib))
        kube.create(namespace, share_pod(name, greedy=name == "share-small"))
    wait_started(list(SHARES))
    got = {name: results(kube, namespace, name) for name in SHARES}
    devices = {r["device"] for rs in got.values() for r in rs}
    share_ids = {r.get("shareID") for rs in got.values() for r in rs}
    consumed = {
        n: [r.get("consumedCapacity", {}).get("memory") for r in rs] for n, rs in got.items()
    }
    report.check(
        "both claims on the one GPU, distinct shareIDs, the memory each asked consumed",
        len(devices) == 1
        and None not in share_ids
        and len(share_ids) == 2
        and all(consumed[n] == [f"{gib}Gi"] for n, gib in SHARES.items()),
        f"devices {sorted(devices)}, shareIDs {sorted(map(str, share_ids))}, consumed {consumed}",
    )
    seen: dict[str, tuple[int, str, int]] = {}
    for pod in SHARES:
        containers = ["alloc", "greedy"] if pod == "share-small" else ["alloc"]
        for c in containers:
            match = wait_for(
                f"{pod}/{c} to report its allocation",
                functools.partial(_alloc_line, log, pod, c),
                timeout=timeout,
            )
            seen[f"{pod}/{c}"] = (int(match[1]), match[2], int(match[3]))
    for who, (mib, stopped_by, total) in seen.items():
        share = SHARES[who.split("/")[0]] * GIB_MIB
        report.lines.append(
            f"{who:<20} share {share} MiB  allocated {mib} MiB  stopped by {stopped_by}  "
            f"(CUDA's total {total} MiB)"
        )
        report.check(
            f"{who} got about its share and no more",
            share - slack_mib <= mib <= share and stopped_by == "CUDA_ERROR_OUT_OF_MEMORY",
            f"{mib} MiB of a {share} MiB share, stopped by {stopped_by}",
        )
    report.lines.append(f"MPS daemons while the pods run: {mps_processes()}")
    kube.delete_pods(namespace, list(SHARES))
    for name in SHARES:
        kube.custom.delete_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", name)
    wait_for(
        "the share pods' claims to be gone",
        lambda: all(kube.claim(namespace, n) is None for n in SHARES) or None,
        timeout=timeout,
    )

    def new_daemons() -> list[str]:
        return [p for p in mps_processes() if p not in before]

    with contextlib.suppress(WaitTimeout):  # a FAIL below, with what is left, not an exception
        wait_for("no MPS daemon of ours left", lambda: not new_daemons() or None, timeout=timeout)
    left = new_daemons()
    report.check("after both pods are gone no MPS daemon is left", not left, f"left: {left}")
    return report
