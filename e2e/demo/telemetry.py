"""The demo's telemetry example: a busy and an idle GPU, ``dra-gpu top`` and a ``GpuIdle`` Event.

Every demo plugin serves ``/metrics`` with GPU telemetry, sampled every 2 s, and reports a claim
idle for 10 s (``env.telemetry_flags``). Two pods of the ``one-gpu`` scenario, ``busy`` and
``idle``, are pinned to ``demo-h200-shared`` (its GPUs are left free by the scenarios) as the
demo's first example, so that the idle one's 10 s pass while the others are applied. The GPUs
are simulated: what a device does is read from ``simulated-usage.json`` in the plugin's state
directory (docs/user/simulated-profiles.md), which the demo writes as the busy pod's workload would:
one process of that pod, at 85 % of the SMs with 12 GiB. At the end the section shows what a
user would run, ``dra-gpu top`` reading every plugin's ``/metrics``, and the ``GpuIdle`` Events:
on the idle claim and its pod, none on the busy one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu.devices import simulated_usage
from e2e.demo import pinned
from e2e.demo.env import IDLE_AFTER, SHARES_NODE, TELEMETRY_INTERVAL, DemoState, NodeInfo
from e2e.suite.kube import Kube, WaitTimeout, wait_for

NAMESPACE = "demo-telemetry"
SCENARIO = "one-gpu"
BUSY, IDLE = "busy", "idle"
BUSY_UTILIZATION = 0.85
BUSY_MEMORY = 12 << 30
WAIT_S = 60.0  # after the idle period: bounds a broken demo only
TOP_TIMEOUT_S = 60.0
COMMAND = ".venv/bin/python -m dra_gpu"  # how the demo's other lines name the CLI


# ----- pure ----------------------------------------------------------------------------------


def manifests(node: str) -> list[dict[str, Any]]:
    """The scenario's claim template, and its pod twice, as ``busy`` and ``idle``."""
    docs = pinned.manifests(SCENARIO, node)
    out = [d for d in docs if d["kind"] != "Pod"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    for name in (BUSY, IDLE):
        out.append({**pod, "metadata": {**pod["metadata"], "name": name}})
    return out


def busy_usage(device: str, pod_uid: str) -> dict[str, Any]:
    """The simulated usage file: ``device`` runs one process of pod ``pod_uid``."""
    process = {
        "pid": 4242,
        "podUID": pod_uid,
        "memoryBytes": BUSY_MEMORY,
        "utilization": BUSY_UTILIZATION,
    }
    return {
        "devices": {
            device: {
                "utilization": BUSY_UTILIZATION,
                "temperatureCelsius": 61,
                "powerWatts": 420,
                "processes": [process],
            }
        }
    }


def top_argv(urls: Sequence[str]) -> list[str]:
    """``dra-gpu top`` for the example's namespace, reading each plugin's ``/metrics``."""
    return ["top", "-n", NAMESPACE, *(a for url in urls for a in ("--metrics-url", url))]


def top_command(urls: Sequence[str]) -> str:
    """The same as a user would type it, one ``--metrics-url`` a line."""
    return " \\\n    ".join(
        [f"{COMMAND} top -n {NAMESPACE}", *(f"--metrics-url {url}" for url in urls)]
    )


def event_lines(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """``kubectl get events``-like lines: type, reason, object, message."""
    rows = [
        (
            str(e.get("type", "")),
            str(e.get("reason", "")),
            f"{str(e['involvedObject']['kind']).lower()}/{e['involvedObject']['name']}",
            str(e.get("message", "")),
        )
        for e in events
    ]
    rows.sort(key=lambda r: (r[2].startswith("pod/"), r[2]))
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]) for r in rows
    ]


@dataclass(frozen=True)
class Observed:
    top_command: str
    top_output: str
    events: tuple[Mapping[str, Any], ...]  # GpuIdle Events in the example's namespace
    busy_claim: str


def section(seen: Observed) -> str:
    """The demo's telemetry section."""
    idle_events = event_lines(seen.events) or ["  (none)"]
    on_busy = [e for e in seen.events if e["involvedObject"]["name"] in (BUSY, seen.busy_claim)]
    lines = [
        "GPU telemetry (docs/user/metrics.md): every plugin samples its GPUs every "
        f"{TELEMETRY_INTERVAL} s (--telemetry-interval)",
        f"and posts a GpuIdle Event for a claim idle for {IDLE_AFTER} (--idle-after). Pod "
        f"{NAMESPACE}/{BUSY}'s process",
        f"is written into {SHARES_NODE}'s simulated usage file (docs/user/simulated-profiles.md);",
        f"nothing uses pod {NAMESPACE}/{IDLE}'s GPU.",
        "",
        f"$ {seen.top_command}",
        seen.top_output.rstrip() or "(no output)",
        "",
        f"$ kubectl get events -n {NAMESPACE} --field-selector reason=GpuIdle",
        *idle_events,
        (
            f"(none on pod {BUSY} or its claim {seen.busy_claim}: its GPU is busy)"
            if not on_busy
            else f"UNEXPECTED: the busy pod {BUSY} or its claim got a GpuIdle Event"
        ),
        f"The other examples' claims are idle too: each gets its GpuIdle Events {IDLE_AFTER} "
        "after prepare",
        "(kubectl get events -A --field-selector reason=GpuIdle).",
    ]
    return "\n".join(lines)


# ----- I/O -----------------------------------------------------------------------------------


def _node(state: DemoState) -> NodeInfo:
    return next(n for n in state.nodes if n.name == SHARES_NODE)


def apply(kube: Kube) -> list[tuple[str, str]]:
    """Create the example; (namespace, pod name) of each pod to observe."""
    kube.create_namespace(NAMESPACE)
    for doc in manifests(SHARES_NODE):
        kube.create(NAMESPACE, doc)
    return [(NAMESPACE, BUSY), (NAMESPACE, IDLE)]


def _claim_of(kube: Kube, pod_name: str) -> dict[str, Any]:
    pod = kube.pod(NAMESPACE, pod_name)
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    names = [s["resourceClaimName"] for s in statuses if s.get("resourceClaimName")]
    return (kube.claim(NAMESPACE, names[0]) or {}) if names else {}


def make_busy(kube: Kube, state: DemoState) -> None:
    """Write the usage file as the busy pod's workload would (once its claim is allocated)."""
    claim = _claim_of(kube, BUSY)
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    devices = [r["device"] for r in results.get("results") or []]
    if not devices:
        return  # not allocated: its row says why, and the section shows no busy GPU
    uid = str(kube.pod(NAMESPACE, BUSY)["metadata"]["uid"])
    path = Path(_node(state).state_dir) / simulated_usage.FILE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(busy_usage(devices[0], uid)))
    os.replace(tmp, path)  # the plugin never reads half a file


def _gpu_idle(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    found = kube.core.list_namespaced_event(namespace, field_selector="reason=GpuIdle")
    return [kube.as_dict(e) for e in found.items]


def _idle_reported(kube: Kube, idle_claim: str) -> list[dict[str, Any]] | None:
    events = _gpu_idle(kube, NAMESPACE)
    named = {e["involvedObject"]["name"] for e in events}
    return events if {IDLE, idle_claim} <= named else None


def observe(kube: Kube, state: DemoState) -> Observed:
    """Wait for the idle claim's Events and the busy pod in the series, then run ``top``."""
    busy_claim = str(_claim_of(kube, BUSY).get("metadata", {}).get("name", ""))
    idle_claim = str(_claim_of(kube, IDLE).get("metadata", {}).get("name", ""))
    try:
        events = wait_for(
            "the idle claim's GpuIdle Events",
            lambda: _idle_reported(kube, idle_claim),
            timeout=WAIT_S,
        )
    except WaitTimeout:
        events = _gpu_idle(kube, NAMESPACE)
    urls = [n.metrics_url for n in state.nodes if n.metrics_url]
    argv = top_argv(urls)

    def top() -> str | None:
        done = subprocess.run(
            [sys.executable, "-m", "dra_gpu", *argv],
            capture_output=True,
            text=True,
            timeout=TOP_TIMEOUT_S,
            check=False,
        )
        # The busy pod's name is in the series once the plugin read its claim's reservedFor.
        return done.stdout if f" {BUSY} " in done.stdout else None

    try:
        output = wait_for("dra-gpu top to list the busy pod", top, timeout=WAIT_S)
    except WaitTimeout as exc:
        output = str(exc)
    return Observed(
        top_command=top_command(urls),
        top_output=output,
        events=tuple(events),
        busy_claim=busy_claim,
    )
