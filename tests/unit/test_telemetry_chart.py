"""The chart's telemetry dashboard and PrometheusRule query only series the plugin exports: a
renamed series fails here instead of leaving an empty panel or an alert that never fires."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dra_gpu import metrics
from dra_gpu.plugin.telemetry_metrics import HEALTH_EVENTS, SERIES

CHART = Path(__file__).resolve().parents[2] / "manifests" / "helm" / "dra-gpu"
NAME = re.compile(r"\bdra_gpu_[a-z_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported() -> set[str]:
    plugin = metrics.PluginMetrics()
    plugin.watch_state(
        prepared=lambda: (0, 0),
        published=lambda: [("gpu", "HEALTHY")],
        checkpoint_writes=lambda: (0, 0),
    )
    driver = {
        family.name + suffix
        for family in plugin.registry.collect()
        for suffix in SUFFIXES[family.type]
    }
    return driver | set(SERIES) | {f"{HEALTH_EVENTS}_total"}


def test_every_telemetry_panel_queries_exported_series() -> None:
    dashboard = json.loads((CHART / "dashboards" / "dra-gpu-telemetry.json").read_text())
    for panel in dashboard["panels"]:
        used = {n for t in panel["targets"] for n in NAME.findall(t["expr"])}
        assert used and not used - exported(), (panel["title"], used - exported())
    shown = {n for p in dashboard["panels"] for t in p["targets"] for n in NAME.findall(t["expr"])}
    # the series a user asked for each have a panel
    assert {
        "dra_gpu_device_utilization_ratio",
        "dra_gpu_device_memory_used_bytes",
        "dra_gpu_pod_utilization_ratio",
        "dra_gpu_pod_memory_used_bytes",
        "dra_gpu_claim_idle_seconds",
        "dra_gpu_device_temperature_celsius",
        "dra_gpu_device_power_watts",
    } <= shown


def test_every_alert_queries_exported_series() -> None:
    template = (CHART / "templates" / "metrics.yaml").read_text()
    rules = template[template.index("kind: PrometheusRule") :]
    alerts = re.findall(r"- alert: (\w+)\n\s+expr: (.+)", rules)
    assert {a for a, _ in alerts} >= {"DraGpuClaimIdle", "DraGpuHot", "DraGpuXid"}
    for alert, expr in alerts:
        used = set(NAME.findall(expr))
        assert used and not used - exported(), (alert, used - exported())
