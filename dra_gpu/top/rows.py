"""Telemetry samples (from the plugins' ``/metrics`` or Prometheus) -> the rows of ``dra-gpu
top`` and their table or JSON (pure).

A sample is ``(series name, labels, value)`` as the plugin exports it (docs/metrics.md): the
device series give the row, the pod series its pods, ``dra_gpu_claim_idle_seconds`` its idle
time. Two plugin instances of one node (a rolling update) export the same device: the later
sample wins.
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
    product: str = ""
    claim_namespace: str = ""
    claim_name: str = ""
    pods: list[str] = field(default_factory=list)
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    idle_seconds: float | None = None

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


def build_rows(
    samples: Iterable[Sample], *, namespace: str | None, node: str | None
) -> list[TopRow]:
    """Rows by node and device; ``namespace`` None: every device, claimed or not, else only
    devices claimed in that namespace; ``node``: only that node's."""
    rows: dict[tuple[str, str], TopRow] = {}
    pods: dict[tuple[str, str], set[str]] = {}
    idle: dict[tuple[str, str, str], float] = {}
    for name, labels, value in samples:
        key = (labels.get("node", ""), labels.get("device", ""))
        if name in _DEVICE_VALUES or name == "dra_gpu_device_telemetry_up":
            row = rows.setdefault(key, TopRow(*key))
            row.product = labels.get("product", row.product)
            row.claim_namespace = labels.get("claim_namespace", "")
            row.claim_name = labels.get("claim_name", "")
            if name in _DEVICE_VALUES:
                setattr(row, _DEVICE_VALUES[name], value)
        elif name == "dra_gpu_pod_processes":
            pod = labels.get("pod_name") or (labels.get("pod_uid") or "")[:8] or "(no pod)"
            pods.setdefault(key, set()).add(pod)
        elif name == "dra_gpu_claim_idle_seconds":
            idle[(key[0], labels.get("claim_namespace", ""), labels.get("claim_name", ""))] = value
    out: list[TopRow] = []
    for key, row in sorted(rows.items()):
        if node is not None and row.node != node:
            continue
        if namespace is not None and (not row.claim_name or row.claim_namespace != namespace):
            continue
        row.pods = sorted(pods.get(key, ()))
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
    cells = [HEADER] + [
        (
            r.node,
            r.device,
            r.product or "-",
            r.claim or "-",
            ",".join(r.pods) or "-",
            "-" if r.utilization is None else f"{r.utilization * 100:.0f}%",
            f"{_bytes(r.memory_used_bytes)}/{_bytes(r.memory_total_bytes)}",
            _idle(r.idle_seconds),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells
    )


def to_json(rows: Sequence[TopRow]) -> str:
    return json.dumps({"items": [{**asdict(r), "claim": r.claim} for r in rows]}, indent=2)
