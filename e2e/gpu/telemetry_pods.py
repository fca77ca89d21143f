"""GPU telemetry by pod on a real GPU, under the kubelet (``e2e.gpu.demo``).

Two pods share one claim, so the GPU is time-sliced between their processes (the GPU's own
scheduling: no time-slice setting is changed): ``shared-a`` keeps the SMs busy
(``gpucheck load``), ``shared-b`` holds memory and launches nothing (``gpucheck hold``). The
plugin runs with ``--metrics-address``, a short ``--telemetry-interval`` and ``--idle-after``.
Read from the plugin's ``/metrics`` as Prometheus would, and from the API server:

- each pod's memory is its own process's (``dra_gpu_pod_memory_used_bytes``), attributed by the
  kubelet's pod cgroup;
- the busy pod has an SM share (``dra_gpu_pod_utilization_ratio`` > 0), the idle pod none;
- the idle pod gets one ``GpuIdle`` Warning Event, the busy pod and the claim none (the claim
  is in use: one of its pods works);
- ``dra-gpu top`` lists both pods.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dra_gpu.top.rows import Sample
from dra_gpu.top.source import from_urls
from e2e.suite.kube import Kube, wait_for

BUSY_MIB = 776
IDLE_MIB = 1544
MIB = 1 << 20


@dataclass(frozen=True)
class PodUsage:
    memory_bytes: float | None
    utilization: float | None
    processes: float | None


@dataclass
class TelemetryReport:
    lines: list[str] = field(default_factory=list)  # what was seen, for the printed report
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    top: str = ""

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append((what, ok, detail))
        print(f"[gpu-demo] {'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)


def pods_usage(samples: Iterable[Sample], namespace: str) -> dict[str, PodUsage]:
    """Pod name -> its series, for the pods of ``namespace``."""
    values: dict[str, dict[str, float]] = {}
    for name, labels, value in samples:
        if name.startswith("dra_gpu_pod_") and labels.get("pod_namespace") == namespace:
            values.setdefault(labels.get("pod_name", ""), {})[name] = value
    return {
        pod: PodUsage(
            v.get("dra_gpu_pod_memory_used_bytes"),
            v.get("dra_gpu_pod_utilization_ratio"),
            v.get("dra_gpu_pod_processes"),
        )
        for pod, v in values.items()
    }


def idle_events(kube: Kube, namespace: str, involved: str) -> list[str]:
    return [
        str(e.get("message", ""))
        for e in kube.events(namespace, involved)
        if e.get("reason") == "GpuIdle"
    ]


def observe(
    kube: Kube,
    *,
    url: str,
    namespace: str,
    claim: str,
    busy: str,
    idle: str,
    idle_after_s: float,
    interval_s: float,
) -> TelemetryReport:
    report = TelemetryReport()

    def both_seen() -> dict[str, PodUsage] | None:
        usage = pods_usage(from_urls([url]), namespace)
        got = {p: usage.get(p) for p in (busy, idle)}
        if all(u is not None and u.memory_bytes for u in got.values()):
            return usage
        return None

    wait_for("both pods' memory in the plugin's metrics", both_seen, timeout=60.0 + interval_s)
    # The busy pod's SM share, over a few passes (NVML's per-process samples vary).
    busy_util: list[float] = []
    idle_util: list[float] = []
    usage: Mapping[str, PodUsage] = {}
    for _ in range(4):
        usage = pods_usage(from_urls([url]), namespace)
        report.lines.append(
            "  ".join(
                f"{p}: memory {(u.memory_bytes or 0) / MIB:.0f} MiB, "
                f"utilization {u.utilization}, processes {u.processes}"
                for p, u in sorted(usage.items())
            )
        )
        busy_util.append(usage[busy].utilization or 0.0)
        idle_util.append(usage[idle].utilization or 0.0)
        time.sleep(interval_s)
    b, i = usage[busy], usage[idle]
    report.check(
        "each pod's GPU memory is its own process's",
        b.memory_bytes is not None
        and i.memory_bytes is not None
        and BUSY_MIB * MIB <= b.memory_bytes < i.memory_bytes
        and i.memory_bytes >= IDLE_MIB * MIB,
        f"{busy} {(b.memory_bytes or 0) / MIB:.0f} MiB (holds {BUSY_MIB} + context), "
        f"{idle} {(i.memory_bytes or 0) / MIB:.0f} MiB (holds {IDLE_MIB} + context)",
    )
    # NVML's per-process samples may give the idle pod's context a percent as it starts.
    report.check(
        "the busy pod has most of the SMs in every sample, the idle pod about none",
        all(b > i for b, i in zip(busy_util, idle_util, strict=True))
        and statistics.median(busy_util) > 0.5
        and statistics.median(idle_util) <= 0.05,
        f"{busy} {busy_util}, {idle} {idle_util}",
    )
    started = time.monotonic()
    messages = wait_for(
        f"a GpuIdle Event on {idle}",
        lambda: idle_events(kube, namespace, idle) or None,
        timeout=idle_after_s + 6 * interval_s + 30.0,
    )
    report.lines.append(f"GpuIdle on pod {idle} (after {time.monotonic() - started:.0f} s more)")
    report.lines += [f"  {m}" for m in messages]
    others = {name: idle_events(kube, namespace, name) for name in (busy, claim)}
    report.check(
        "the idle pod got GpuIdle; the busy pod and the claim none",
        len(messages) == 1 and not any(others.values()),
        f"{idle}: {messages}; {others}",
    )
    top = subprocess.run(
        [sys.executable, "-m", "dra_gpu", "top", "--metrics-url", url, "-n", namespace],
        capture_output=True,
        text=True,
        timeout=30,
    )
    report.top = top.stdout + top.stderr
    report.check(
        "dra-gpu top lists both pods",
        top.returncode == 0 and busy in top.stdout and idle in top.stdout,
        f"rc {top.returncode}",
    )
    return report
