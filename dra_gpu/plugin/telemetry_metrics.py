"""The telemetry loop's last snapshot as Prometheus series (docs/user/metrics.md#gpu-telemetry).

A collector registered on the plugin's registry: each scrape reads the loop's current
:class:`telemetry.Snapshot` (one attribute read; the loop replaces it whole) and never calls
NVML. Unlike the driver's own series these carry device, claim and pod labels: their number is
bounded by the devices of one node and the pods that use them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from dra_gpu.plugin.telemetry import Snapshot

DEVICE_LABELS = (
    "node",
    "device",
    "uuid",
    "product",
    "mig_profile",
    "claim_namespace",
    "claim_name",
)
POD_LABELS = (
    "node",
    "device",
    "uuid",
    "claim_namespace",
    "claim_name",
    "pod_namespace",
    "pod_name",
    "pod_uid",
)
CLAIM_LABELS = ("node", "claim_namespace", "claim_name")
POD_IDLE_LABELS = ("node", "claim_namespace", "claim_name", "pod_namespace", "pod_name", "pod_uid")

# name -> help, for every series this module exports (docs and chart tests read it).
SERIES: dict[str, str] = {
    "dra_gpu_device_utilization_ratio": "SM utilization of the device (0..1), whole GPU",
    "dra_gpu_device_memory_used_bytes": "Device memory in use",
    "dra_gpu_device_memory_total_bytes": "Device memory in total",
    "dra_gpu_device_temperature_celsius": "GPU temperature",
    "dra_gpu_device_power_watts": "GPU power draw",
    "dra_gpu_device_ecc_uncorrected_errors": "Uncorrected ECC errors since the driver loaded",
    "dra_gpu_device_processes": "Compute processes on the device",
    "dra_gpu_device_telemetry_up": "1 when the device's last sample was read, 0 when it failed",
    "dra_gpu_pod_memory_used_bytes": "Device memory used by the pod's processes",
    "dra_gpu_pod_utilization_ratio": "SM share of the pod's processes (0..1); absent under MPS",
    "dra_gpu_pod_processes": "Compute processes of the pod on the device",
    "dra_gpu_pod_compute_share_ratio": "MPS: the SM share each client of the pod's claim may use",
    "dra_gpu_claim_idle_seconds": "Seconds the claim's devices have been idle (0: busy)",
    "dra_gpu_pod_idle_seconds": "Seconds a pod of a shared claim has been idle (0: busy)",
    "dra_gpu_telemetry_pass_cpu_seconds": "CPU time of the last telemetry pass",
}


# Counted by the health monitor (XID, ECC and the other NVML health events), not sampled.
HEALTH_EVENTS = "dra_gpu_device_health_events"
HEALTH_EVENT_LABELS = ("node", "device", "uuid", "kind")


class TelemetryCollector(Collector):
    def __init__(
        self,
        current: Callable[[], Snapshot],
        health_events: Callable[[], Mapping[tuple[str, str], int]] = dict,
    ) -> None:
        self._current, self._health_events = current, health_events

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        snap = self._current()
        node = snap.view.node
        family = {
            name: GaugeMetricFamily(name, text, labels=_labels_of(name))
            for name, text in SERIES.items()
        }
        for row in snap.view.devices:
            labels = [node, *row.labels.values()]
            u = row.usage
            for name, value in (
                ("dra_gpu_device_utilization_ratio", u.utilization_ratio),
                ("dra_gpu_device_memory_used_bytes", u.memory_used_bytes),
                ("dra_gpu_device_memory_total_bytes", u.memory_total_bytes),
                ("dra_gpu_device_temperature_celsius", u.temperature_celsius),
                ("dra_gpu_device_power_watts", u.power_watts),
                ("dra_gpu_device_ecc_uncorrected_errors", u.ecc_uncorrected),
                ("dra_gpu_device_processes", None if u.error else len(u.processes)),
            ):
                if value is not None:
                    family[name].add_metric(labels, float(value))
            family["dra_gpu_device_telemetry_up"].add_metric(labels, 0.0 if u.error else 1.0)
        for pod in snap.view.pods:
            labels = [node, *pod.labels.values()]
            if pod.memory_bytes is not None:
                family["dra_gpu_pod_memory_used_bytes"].add_metric(labels, float(pod.memory_bytes))
            if pod.utilization_ratio is not None:
                family["dra_gpu_pod_utilization_ratio"].add_metric(labels, pod.utilization_ratio)
            family["dra_gpu_pod_processes"].add_metric(labels, float(pod.processes))
            if pod.compute_share is not None:
                family["dra_gpu_pod_compute_share_ratio"].add_metric(labels, pod.compute_share)
        for idle in snap.idle:
            claim = idle.activity.claim
            if idle.subject.pod_uid:
                ref = idle.activity.pod
                family["dra_gpu_pod_idle_seconds"].add_metric(
                    [
                        node,
                        claim.namespace,
                        claim.name,
                        ref.namespace if ref else "",
                        ref.name if ref else "",
                        idle.subject.pod_uid,
                    ],
                    idle.seconds,
                )
            else:
                family["dra_gpu_claim_idle_seconds"].add_metric(
                    [node, claim.namespace, claim.name], idle.seconds
                )
        family["dra_gpu_telemetry_pass_cpu_seconds"].add_metric([node], snap.last_pass_s)
        events = CounterMetricFamily(
            HEALTH_EVENTS,
            "XID, ECC and other NVML health events seen since the plugin started, by GPU and kind",
            labels=HEALTH_EVENT_LABELS,
        )
        # A MIG device's events are its GPU's: named by the full GPU's device, when published.
        names = {r.device.uuid: r.device.name for r in snap.view.devices if r.device.mig is None}
        for (uuid, kind), count in sorted(self._health_events().items()):
            events.add_metric([node, names.get(uuid, ""), uuid, kind], count)
        return [*family.values(), events]


def _labels_of(name: str) -> tuple[str, ...]:
    if name == "dra_gpu_claim_idle_seconds":
        return CLAIM_LABELS
    if name == "dra_gpu_pod_idle_seconds":
        return POD_IDLE_LABELS
    if name == "dra_gpu_telemetry_pass_cpu_seconds":
        return ("node",)
    return POD_LABELS if name.startswith("dra_gpu_pod_") else DEVICE_LABELS
