"""``dra-gpu top``: rows from what the plugins export, the table and JSON a user reads, and the
plugins reached through the API server's pod proxy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dra_gpu import cli
from dra_gpu.devices import naming, simulated
from dra_gpu.devices.usage import DeviceUsage, ProcessUsage
from dra_gpu.kube import errors
from dra_gpu.plugin import idle_claims, telemetry, usage_series
from dra_gpu.plugin.telemetry_metrics import TelemetryCollector
from dra_gpu.top import rows, source

POD_A = "0d6a8e43-1f2b-4c3d-9e8f-1a2b3c4d5e6f"
POD_B = "7b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9"
GIB = 1 << 30


def served(
    view: usage_series.UsageView,
    busy: usage_series.Holder,
    idle: usage_series.Holder,
    *,
    devices: tuple[str, str],
    idle_s: float,
    busy_processes: int,
) -> str:
    """The /metrics text of ``view`` with ``idle`` idle for ``idle_s`` on ``devices[1]`` and
    ``busy`` busy on ``devices[0]``."""
    snapshot = telemetry.Snapshot(
        view,
        idle=(
            telemetry.IdleNow(
                idle_claims.Subject(idle.claim_uid),
                idle_claims.Activity(False, 0, (devices[1],), idle),
                idle_s,
            ),
            telemetry.IdleNow(
                idle_claims.Subject(busy.claim_uid),
                idle_claims.Activity(True, busy_processes, (devices[0],), busy),
                0.0,
            ),
        ),
    )
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def exported(node: str) -> str:
    """What a plugin with a busy claim (two pods) and an idle claim serves at /metrics."""
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["h200x8"], node_name=node
    )
    devices = naming.build_devices(backend.discover().gpus)[:3]
    busy = usage_series.Holder("u1", "team", "train")
    idle = usage_series.Holder("u2", "team", "notebook")
    held = {"gpu-0": [busy], "gpu-1": [idle]}
    total = 150754820096
    view = usage_series.build_view(
        node=node,
        devices=devices,
        usage={
            "gpu-0": DeviceUsage(
                0.85,
                3 * GIB,
                total,
                processes=(
                    ProcessUsage(1, POD_A, 2 * GIB, 0.85),
                    ProcessUsage(2, POD_B, GIB, 0.0),
                ),
            ),
            "gpu-1": DeviceUsage(0.0, 0, total),
            "gpu-2": DeviceUsage(0.0, 0, total),
        },
        held=held,
        pods={
            "u1": {
                POD_A: usage_series.PodRef("team", "train-0"),
                POD_B: usage_series.PodRef("team", "train-1"),
            }
        },
    )
    return served(view, busy, idle, devices=("gpu-0", "gpu-1"), idle_s=1860.0, busy_processes=2)


def test_a_namespace_shows_its_claims_with_pods_utilization_memory_and_idle_time() -> None:
    found = rows.build_rows(source.parse_text(exported("node-a")), namespace="team", node=None)
    assert rows.table(found) == "\n".join(
        [
            "NODE     DEVICE   PRODUCT       CLAIM           PODS              UTIL   MEMORY"
            "          IDLE",
            "node-a   gpu-0    NVIDIA H200   team/train      train-0,train-1   85%    3.0Gi/140.4Gi"
            "   -",
            "node-a   gpu-1    NVIDIA H200   team/notebook   -                 0%     0/140.4Gi"
            "       31m00s",
        ]
    )


def test_all_namespaces_adds_free_devices_and_node_filters() -> None:
    samples = [*source.parse_text(exported("node-a")), *source.parse_text(exported("node-b"))]
    every = rows.build_rows(samples, namespace=None, node=None)
    assert [(r.node, r.device, r.claim) for r in every] == [
        ("node-a", "gpu-0", "team/train"),
        ("node-a", "gpu-1", "team/notebook"),
        ("node-a", "gpu-2", ""),
        ("node-b", "gpu-0", "team/train"),
        ("node-b", "gpu-1", "team/notebook"),
        ("node-b", "gpu-2", ""),
    ]
    assert {r.node for r in rows.build_rows(samples, namespace=None, node="node-b")} == {"node-b"}
    assert rows.build_rows(samples, namespace="other", node=None) == []


def test_json_output_has_every_value() -> None:
    found = rows.build_rows(source.parse_text(exported("node-a")), namespace="team", node=None)
    items = json.loads(rows.to_json(found))["items"]
    assert items[1]["claim"] == "team/notebook" and items[1]["idle_seconds"] == 1860
    assert items[0]["pods"] == ["train-0", "train-1"] and items[0]["utilization"] == 0.85


class Client:
    def __init__(self, pods: list[dict[str, Any]], texts: Mapping[str, str]) -> None:
        self.pods, self.texts = pods, texts
        self.asked: list[str] = []

    def request(self, method: str, path: str, *, query: Any = None, **_: Any) -> Any:
        self.asked.append(f"{method} {path} {query}")
        return {"items": self.pods}

    def get_text(self, path: str, *, timeout_s: float) -> str:
        self.asked.append(f"GET {path}")
        if path not in self.texts:
            raise errors.ApiError("forbidden", status=403, request=f"GET {path}")
        return self.texts[path]


def plugin_pod(name: str, port: int | None = 9464) -> dict[str, Any]:
    ports = [{"name": "metrics", "containerPort": port}] if port else []
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "plugin", "ports": ports}]},
        "status": {"phase": "Running"},
    }


def test_two_shares_of_one_gpu_are_two_rows_each_with_its_own_use() -> None:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["h200x8"], node_name="node-a"
    )
    devices = naming.build_devices(backend.discover().gpus)[:1]
    busy = usage_series.Holder("u1", "team", "train")
    idle = usage_series.Holder("u2", "team", "notebook")
    view = usage_series.build_view(
        node="node-a",
        devices=devices,
        usage={
            "gpu-0": DeviceUsage(
                0.85,
                3 * GIB,
                150754820096,
                processes=(ProcessUsage(1, POD_A, 2 * GIB, 0.85), ProcessUsage(2, None, GIB, 0.0)),
            )
        },
        held={"gpu-0": [busy, idle]},
        pods={
            "u1": {POD_A: usage_series.PodRef("team", "train-0")},
            "u2": {POD_B: usage_series.PodRef("team", "notebook-0")},
        },
    )
    text = served(view, busy, idle, devices=("gpu-0", "gpu-0"), idle_s=90.0, busy_processes=1)
    found = rows.build_rows(source.parse_text(text), namespace="team", node=None)
    assert rows.table(found).splitlines()[1:] == [
        "node-a   gpu-0    NVIDIA H200   team/notebook   (no pod)           0%     0/140.4Gi"
        "       1m30s",
        "node-a   gpu-0    NVIDIA H200   team/train      (no pod),train-0   85%    2.0Gi/140.4Gi"
        "   -",
    ]
    items = json.loads(rows.to_json(found))["items"]
    assert [(i["claim"], i["claims_on_device"], i["utilization"]) for i in items] == [
        ("team/notebook", 2, 0.85),
        ("team/train", 2, 0.85),
    ]


def test_plugins_are_read_through_the_pod_proxy_and_unreadable_ones_warned_about() -> None:
    proxy = "/api/v1/namespaces/dra-gpu/pods/{}:9464/proxy/metrics"
    client = Client(
        [plugin_pod("plugin-a"), plugin_pod("plugin-b"), plugin_pod("plugin-c", port=None)],
        {proxy.format("plugin-a"): exported("node-a")},
    )
    samples, warnings = source.from_plugins(client, namespace="dra-gpu", node="node-a")  # type: ignore[arg-type]
    assert "spec.nodeName=node-a" in client.asked[0]
    assert {r.node for r in rows.build_rows(samples, namespace=None, node=None)} == {"node-a"}
    assert warnings[0].startswith("plugin-b: ") and "forbidden" in warnings[0]
    assert "metrics.enabled=true" in warnings[1]


def test_top_is_a_dra_gpu_subcommand() -> None:
    with pytest.raises(SystemExit):
        cli.main(["top", "--help"])
