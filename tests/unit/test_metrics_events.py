"""Metrics and failure Events without a cluster: the address flag, what a prepare call adds to
the series, bounded labels, and one Event per failure on the claim and each pod it serves."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_gpu import metrics
from dra_gpu.kubeletplugin import dra_service, events
from dra_gpu.kubeletplugin.driver import PrepareResult, Step
from dra_gpu.pb import dra_v1_pb2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        (":8080", ("0.0.0.0", 8080)),
        ("[::1]:9090", ("::1", 9090)),
    ],
)
def test_metrics_address(text: str, expected: tuple[str, int] | None) -> None:
    assert metrics.parse_address(text) == expected


@pytest.mark.parametrize("text", ["9090", "host:", "host:http", "host:70000"])
def test_bad_metrics_address_is_named(text: str) -> None:
    with pytest.raises(metrics.AddressError, match="HOST:PORT"):
        metrics.parse_address(text)


class Handler:
    def prepare(self, refs: Sequence[Any]) -> Mapping[Any, PrepareResult]:
        return {
            r.uid: PrepareResult(error="bad", kind="PlanError")
            if r.uid == "bad"
            else PrepareResult()
            for r in refs
        }

    def unprepare(self, refs: Sequence[Any]) -> Mapping[Any, str]:
        return {r.uid: "" for r in refs}


class Kubelet:
    """Calls as the kubelet makes them, through the kit's DRA service and its steps."""

    def __init__(self, *steps: Step) -> None:
        self._methods = {
            m.name: m for m in dra_service.methods(Handler(), steps) if ".v1.DRAPlugin" in m.path
        }

    def _claims(self, uids: Sequence[str]) -> list[dra_v1_pb2.Claim]:
        return [dra_v1_pb2.Claim(uid=u, namespace="ns", name="c") for u in uids]

    def prepare(self, *uids: str) -> Any:
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=self._claims(uids))
        return self._methods["NodePrepareResources"].handle(request, None)  # type: ignore[arg-type]

    def unprepare(self, *uids: str) -> Any:
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=self._claims(uids))
        return self._methods["NodeUnprepareResources"].handle(request, None)  # type: ignore[arg-type]


def sample(m: metrics.PluginMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_prepare_calls_and_claims_are_counted_by_result_and_kind() -> None:
    m = metrics.PluginMetrics()
    kubelet = Kubelet(m)
    kubelet.prepare("a", "bad")
    kubelet.unprepare("a")
    assert sample(m, "dra_gpu_plugin_calls_total", operation="prepare") == 1
    ok = {"operation": "prepare", "result": "ok", "error_kind": ""}
    assert sample(m, "dra_gpu_plugin_claims_total", **ok) == 1
    failed = {"operation": "prepare", "result": "error", "error_kind": "PlanError"}
    assert sample(m, "dra_gpu_plugin_claims_total", **failed) == 1
    assert sample(m, "dra_gpu_plugin_call_duration_seconds_count", operation="unprepare") == 1
    assert sample(m, "dra_gpu_plugin_calls_in_flight", operation="prepare") == 0


def test_device_status_updates_are_counted_by_result() -> None:
    m = metrics.PluginMetrics()
    for result in ("written", "retry", "written"):
        m.claim_status(result)
    assert sample(m, "dra_gpu_plugin_claim_device_status_updates_total", result="written") == 2
    assert sample(m, "dra_gpu_plugin_claim_device_status_updates_total", result="retry") == 1


def test_webhook_kinds_are_bounded() -> None:
    m = metrics.ControllerMetrics()
    review = m.reviewer(lambda body: {"response": {"allowed": False}})
    review({"request": {"kind": {"kind": "Secret-" + "x" * 50}}})
    refused = {"kind": "other", "verdict": "refused"}
    assert m.registry.get_sample_value("dra_gpu_webhook_reviews_total", refused) == 1


class FakeClient:
    def __init__(self, claim: dict[str, Any] | None) -> None:
        self.claim = claim
        self.posted: list[dict[str, Any]] = []

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any] | None:
        if method == "GET":
            return self.claim
        self.posted.append(kw["body"])
        return {}


CLAIM: dict[str, Any] = {
    "metadata": {"namespace": "ns", "name": "c", "uid": "bad"},
    "status": {
        "reservedFor": [
            {"resource": "pods", "name": "p", "uid": "pod-uid"},
            {"resource": "things", "apiGroup": "example.com", "name": "t", "uid": "t"},
        ]
    },
}


def test_failure_is_an_event_on_the_claim_and_its_pods_once() -> None:
    client = FakeClient(CLAIM)
    poster = events.EventPoster(client)  # type: ignore[arg-type]
    kubelet = Kubelet(events.FailureEvents(poster, node_name="n1", source="test"))
    for _ in range(3):
        assert kubelet.prepare("bad", "a").claims["bad"].error == "bad"
    poster.close()
    involved = [(e["involvedObject"]["kind"], e["involvedObject"]["uid"]) for e in client.posted]
    assert involved == [("ResourceClaim", "bad"), ("Pod", "pod-uid")]
    assert all(e["reason"] == "PrepareFailed" and "n1" in e["message"] for e in client.posted)


def test_failure_events_carry_what_the_charts_policy_requires() -> None:
    # The chart's policy `claim-events` admits a PrepareFailed Warning about a Pod or
    # ResourceClaim of the Event's own namespace, with source.host the plugin's node and nothing
    # related: an Event without them is refused in a deployed cluster
    # (tests/cluster/test_manifests.py).
    for claim in (CLAIM, None):  # read, or gone by the time the Event is posted
        client = FakeClient(claim)
        poster = events.EventPoster(client)  # type: ignore[arg-type]
        Kubelet(events.FailureEvents(poster, node_name="n1", source="test")).prepare("bad")
        poster.close()
        assert client.posted
        for event in client.posted:
            assert event["metadata"]["namespace"] == event["involvedObject"]["namespace"] == "ns"
            assert event["involvedObject"]["kind"] in ("Pod", "ResourceClaim")
            assert (event["reason"], event["type"]) == ("PrepareFailed", "Warning")
            assert event["source"]["host"] == "n1"
            assert "related" not in event
            assert event.get("reportingInstance", "n1") == "n1"


def test_claim_replaced_since_is_named_as_the_kubelet_asked() -> None:
    other = {**CLAIM, "metadata": {**CLAIM["metadata"], "uid": "someone-else"}}
    client = FakeClient(other)
    poster = events.EventPoster(client)  # type: ignore[arg-type]
    Kubelet(events.FailureEvents(poster, node_name="n1", source="test")).prepare("bad")
    poster.close()
    assert [e["involvedObject"]["uid"] for e in client.posted] == ["bad"]


DASHBOARD = (
    Path(__file__).resolve().parents[2]
    / "manifests"
    / "helm"
    / "dra-gpu"
    / "dashboards"
    / "dra-gpu.json"
)


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_names() -> set[str]:
    """Every series name the plugin and the controller can export."""
    plugin, controller = metrics.PluginMetrics(), metrics.ControllerMetrics()
    plugin.watch_state(
        prepared=lambda: (0, 0),
        published=lambda: [("gpu", "HEALTHY")],
        checkpoint_writes=lambda: (0, 0),
    )
    return {
        family.name + suffix
        for registry in (plugin.registry, controller.registry)
        for family in registry.collect()
        for suffix in SUFFIXES[family.type]
    }


def test_dashboard_queries_only_series_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bdra_gpu_[a-z_]+", target["expr"])
    }
    exported = exported_names()
    assert used and not used - exported, used - exported


def test_checkpoint_writes_are_counted_and_exported(tmp_path: Path) -> None:
    from dra_gpu.prepare.checkpoint import CheckpointStore

    store = CheckpointStore(tmp_path)
    store.update(lambda c: c.with_boot_id("a"), durable=True)
    store.update(lambda c: c.with_boot_id("b"), durable=False)
    assert store.writes == (2, 1)
    plugin = metrics.PluginMetrics()
    plugin.watch_state(
        prepared=lambda: (0, 0), published=lambda: [], checkpoint_writes=lambda: store.writes
    )
    samples = {
        (s.name, s.labels.get("durable")): s.value
        for family in plugin.registry.collect()
        for s in family.samples
        if s.name.startswith("dra_gpu_plugin_checkpoint_writes")
    }
    assert samples == {
        ("dra_gpu_plugin_checkpoint_writes_total", "true"): 1,
        ("dra_gpu_plugin_checkpoint_writes_total", "false"): 1,
    }
