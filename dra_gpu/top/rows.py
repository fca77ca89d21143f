"""Telemetry samples (from the plugins' ``/metrics`` or Prometheus) -> the rows of ``dra-gpu
top`` and their table or JSON (pure).

A sample is ``(series name, labels, value)`` as the plugin exports it (docs/user/metrics.md): the
device series give one row per (device, claim holding it) -- a device several claims hold
(consumable shares, admin access) is exported once per claim --, the pod series the row's pods,
``dra_gpu_claim_idle_seconds`` its idle time. On a device several claims hold, a row's
``claim_utilization`` and ``claim_memory_used_bytes`` are the sums of its own pods' series,
and the table shows those instead of the whole GPU's. Pods that no claim names (processes
outside Kubernetes) are listed on every row of their device. Two plugin instances of one node
(a rolling update) export the same device: the later sample wins.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

Sample = tuple[str, Mapping[str, str], float]


@dataclass
class TopRow:
    node: str
    device: str
    claim_namespace: str = ""
    claim_name: str = ""
    product: str = ""
    pods: list[str] = field(default_factory=list)
    utilization: float | None = None  # the whole GPU's
    memory_used_bytes: float | None = None  # the whole GPU's
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    idle_seconds: float | None = None
    claims_on_device: int = 1  # claims holding the device (0: free)
    # The claim's own pods on the device: their SM share (None under MPS, where NVML gives
    # none, or without processes reporting one) and memory.
    claim_utilization: float | None = None
    claim_memory_used_bytes: float | None = None

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}" if self.claim_name else ""


_DEVICE_VALUES = {
    "dra_gpu_device_utilization_ratio": "utilization",
    "dra_gpu_device_memory_used_bytes": "memory_used_bytes",
    "dra_gpu_device_memory_total_bytes": "memory_total_bytes",
    "dra_gpu_device_temperature_celsius": "temperature_celsius",
    "dra_gpu_device_power_watts": "power_watts",
}
_POD_VALUES = {
    "dra_gpu_pod_utilization_ratio": "claim_utilization",
    "dra_gpu_pod_memory_used_bytes": "claim_memory_used_bytes",
}
Key = tuple[str, str, str, str]  # node, device, claim namespace, claim name


def _key(labels: Mapping[str, str]) -> Key:
    return (
        labels.get("node", ""),
        labels.get("device", ""),
        labels.get("claim_namespace", ""),
        labels.get("claim_name", ""),
    )


def build_rows(
    samples: Iterable[Sample], *, namespace: str | None, node: str | None
) -> list[TopRow]:
    """Rows by node, device and claim; ``namespace`` None: every device, claimed or not, else
    only devices claimed in that namespace; ``node``: only that node's."""
    rows: dict[Key, TopRow] = {}
    pods: dict[Key, set[str]] = {}
    pod_values: dict[tuple[Key, str, str], float] = {}  # (row, pod UID, field) -> value
    idle: dict[tuple[str, str, str], float] = {}
    for name, labels, value in samples:
        key = _key(labels)
        if name in _DEVICE_VALUES or name == "dra_gpu_device_telemetry_up":
            row = rows.setdefault(key, TopRow(*key))
            row.product = labels.get("product", row.product)
            if name in _DEVICE_VALUES:
                setattr(row, _DEVICE_VALUES[name], value)
        elif name == "dra_gpu_pod_processes":
            pod = labels.get("pod_name") or (labels.get("pod_uid") or "")[:8] or "(no pod)"
            pods.setdefault(key, set()).add(pod)
        elif name in _POD_VALUES:
            pod_values[(key, labels.get("pod_uid", ""), _POD_VALUES[name])] = value
        elif name == "dra_gpu_claim_idle_seconds":
            idle[(key[0], key[2], key[3])] = value
    claims_on: dict[tuple[str, str], int] = {}
    for node_name, device, _ns, claim_name in rows:
        if claim_name:
            claims_on[(node_name, device)] = claims_on.get((node_name, device), 0) + 1
    for (key, _pod_uid, attribute), value in pod_values.items():
        if key in rows:
            row = rows[key]
            setattr(row, attribute, (getattr(row, attribute) or 0.0) + value)
    out: list[TopRow] = []
    for key, row in sorted(rows.items()):
        if node is not None and row.node != node:
            continue
        if namespace is not None and (not row.claim_name or row.claim_namespace != namespace):
            continue
        unclaimed = pods.get((row.node, row.device, "", ""), set()) if row.claim_name else set()
        row.pods = sorted(pods.get(key, set()) | unclaimed)
        row.claims_on_device = claims_on.get((row.node, row.device), 0)
        if row.claim_name and key not in pods:  # no process of its own: it uses nothing
            row.claim_utilization = row.claim_memory_used_bytes = 0.0
        if row.claim_name:
            row.idle_seconds = idle.get((row.node, row.claim_namespace, row.claim_name))
        out.append(row)
    return out


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value / (1 << 20):.1f}Mi" if value else "0"


def _idle(seconds: float | None) -> str:
    if not seconds:
        return "-"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )


HEADER = ("NODE", "DEVICE", "PRODUCT", "CLAIM", "PODS", "UTIL", "MEMORY", "IDLE")


def table(rows: Sequence[TopRow]) -> str:
    """Columns like ``kubectl top``; ``-`` where a value is unknown or does not apply."""
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def _cells(r: TopRow) -> tuple[str, ...]:
    # A GPU several claims hold: each row shows what its claim's own pods use, not the GPU's.
    mine = r.claims_on_device > 1
    util = r.claim_utilization if mine else r.utilization
    used = r.claim_memory_used_bytes if mine else r.memory_used_bytes
    return (
        r.node,
        r.device,
        r.product or "-",
        r.claim or "-",
        ",".join(r.pods) or "-",
        "-" if util is None else f"{util * 100:.0f}%",
        f"{_bytes(used)}/{_bytes(r.memory_total_bytes)}",
        _idle(r.idle_seconds),
    )


def to_json(rows: Sequence[TopRow]) -> str:
    return json.dumps({"items": [{**asdict(r), "claim": r.claim} for r in rows]}, indent=2)
