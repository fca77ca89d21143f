"""What the driver detects of a Kubernetes version, and what it refuses (from the answers)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from dra_gpu.kube import capabilities, errors
from dra_gpu.kube.capabilities import Capabilities, KubeVersion
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import Node

GROUP_1_34 = {
    "preferredVersion": {"version": "v1"},
    "versions": [{"version": "v1beta2"}, {"version": "v1"}, {"version": "v1beta1"}],
}


def _node(kubelet: str) -> Node:
    return {"metadata": {"name": "n"}, "status": {"nodeInfo": {"kubeletVersion": kubelet}}}


def _answers(
    version: str,
    *,
    taints: bool,
    counters: bool,
    kubelet: str | None = None,
    binding: bool = True,
) -> Capabilities:
    taint_body, counter_body, binding_body = capabilities.probe_slices(
        driver="gpu.nvidia.com", node="n1"
    )
    if not taints:
        taint_body["spec"]["devices"][0].pop("taints")
    if not counters:
        counter_body["spec"].pop("sharedCounters")
    if not binding:  # what a server with DRADeviceBindingConditions off sends back
        device = binding_body["spec"]["devices"][0]
        device.pop("bindingConditions")
        device.pop("bindingFailureConditions")
    return capabilities.from_answers(
        version={"gitVersion": version},
        group=GROUP_1_34,
        taint_probe=taint_body,
        counter_probe=counter_body,
        node=_node(kubelet) if kubelet else None,
        binding_probe=binding_body,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v1.34.4", (1, 34, 4)),
        ("v1.35.0-beta.0", (1, 35, 0)),
        ("v1.36.3-eks-1a2b3c", (1, 36, 3)),
        ("1.37", (1, 37, 0)),
    ],
)
def test_versions_as_providers_spell_them(text: str, expected: tuple[int, int, int]) -> None:
    version = capabilities.parse_version(text)
    assert (version.major, version.minor, version.patch) == expected
    assert str(version) == text


def test_a_server_without_resource_v1_is_refused_naming_its_version() -> None:
    with pytest.raises(capabilities.Unsupported, match=r"v1\.33\.5 does not serve.*1\.34"):
        capabilities.from_answers(
            version={"gitVersion": "v1.33.5"},
            group={"versions": [{"version": "v1beta2"}, {"version": "v1beta1"}]},
            taint_probe=None,
            counter_probe=None,
        )


def test_preferred_version_comes_first() -> None:
    assert capabilities.served_versions(GROUP_1_34) == ("v1", "v1beta2", "v1beta1")


def test_dropped_taints_refuse_health_taints_naming_version_and_gate() -> None:
    caps = _answers("v1.34.4", taints=False, counters=False, kubelet="v1.34.4")
    assert not caps.device_taints and not caps.partitionable_devices
    report = capabilities.plugin_report(caps)
    warnings = [text for level, text in report if level == logging.WARNING]
    assert any("v1.34.4" in w and "DRADeviceTaints" in w and "health taints" in w for w in warnings)
    assert "device taints off" in report[0][1]
    assert "DRAPlugin v1, DRAResourceHealth v1alpha1" in report[0][1]


def test_kept_fields_refuse_nothing() -> None:
    caps = _answers("v1.37.2", taints=True, counters=True, kubelet="v1.37.2")
    assert caps.device_taints and caps.partitionable_devices
    assert [level for level, _ in capabilities.plugin_report(caps)] == [logging.INFO]
    assert caps.kubelet_health_service == "v1"


@pytest.mark.parametrize(("minor", "own_slice"), [(34, False), (35, True), (37, True)])
def test_where_counters_live_follows_the_server_version(minor: int, own_slice: bool) -> None:
    caps = _answers(f"v1.{minor}.1", taints=True, counters=True)
    assert caps.counters_in_own_slice is own_slice


@pytest.mark.parametrize(
    ("minor", "stage", "granular"),
    [(34, "beta", False), (35, "beta", False), (36, "beta", True), (37, "GA", True)],
)
def test_claim_device_status_and_the_permission_it_needs_per_version(
    minor: int, stage: str, granular: bool
) -> None:
    caps = _answers(f"v1.{minor}.2", taints=True, counters=True)
    assert caps.device_status_stage == stage
    # Before 1.36 the status subresource is all the server checks; from 1.36 also the
    # driver's own entries (resourceclaims/driver, associated-node verbs).
    assert ("resourceclaims/driver associated-node:update" in caps.device_status_permission) is (
        granular
    )
    assert "resourceclaims/status patch" in caps.device_status_permission
    summary = capabilities.plugin_report(caps)[0][1]
    assert f"claim device status {stage}" in summary


def test_kubelet_before_1_36_does_not_read_health() -> None:
    caps = _answers("v1.35.4", taints=True, counters=True, kubelet="v1.35.4")
    assert caps.kubelet_watches_health is False
    assert any("ResourceHealthStatus" in text for _, text in capabilities.plugin_report(caps))


def test_a_server_newer_than_the_matrix_is_warned_about() -> None:
    caps = _answers("v1.38.0", taints=True, counters=True)
    assert any("newer than 1.37" in text for _, text in capabilities.plugin_report(caps))


def test_dropped_extended_resource_name_is_refused_by_the_controller() -> None:
    dropped = capabilities.from_answers(
        version={"gitVersion": "v1.34.4"},
        group=GROUP_1_34,
        taint_probe=None,
        counter_probe=None,
        class_probe={"spec": {}},
        slices_probed=False,
    )
    report = capabilities.controller_report(dropped, extended_resource_name="nvidia.com/gpu")
    assert "device taints not probed" in report[0][1]  # the controller probes classes only
    assert any(
        level == logging.WARNING and "DRAExtendedResource" in text and "v1.34.4" in text
        for level, text in report
    )
    kept = capabilities.from_answers(
        version={"gitVersion": "v1.37.2"},
        group=GROUP_1_34,
        taint_probe=None,
        counter_probe=None,
        class_probe=capabilities.probe_class("nvidia.com/gpu", labels={}),
    )
    assert kept.extended_resources is True
    assert len(capabilities.controller_report(kept, extended_resource_name="nvidia.com/gpu")) == 1


class FakeApi(KubeClient):
    """Answers by path; records the dry-run creates. Not connected to anything."""

    def __init__(self, answers: Mapping[str, dict[str, Any] | Exception]) -> None:
        self.answers = answers
        self.created: list[tuple[str, Mapping[str, str] | None]] = []

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "",
        timeout_s: float = 0.0,
    ) -> dict[str, Any]:
        if method == "POST":
            self.created.append((path, query))
            return dict(body or {})  # a server that keeps every field
        answer = self.answers[path]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_probes_are_dry_runs_only() -> None:
    api = FakeApi(
        {
            "/version": {"gitVersion": "v1.36.3"},
            "/apis/resource.k8s.io": GROUP_1_34,
            "/api/v1/nodes/n1": dict(_node("v1.36.3")),  # as the API server sends it
        }
    )
    caps = capabilities.detect(api, driver="gpu.nvidia.com", node="n1")
    assert caps.device_taints and caps.partitionable_devices
    assert caps.kubelet == KubeVersion(1, 36, 3, "v1.36.3")
    assert api.created and all(query == {"dryRun": "All"} for _, query in api.created)


def test_an_unanswering_server_leaves_capabilities_unknown() -> None:
    api = FakeApi({"/version": errors.ApiUnavailable("connection refused")})
    assert capabilities.detect_or_none(api, driver="gpu.nvidia.com", node="n1") is None
    assert capabilities.plugin_report(None) == []


@pytest.mark.parametrize(
    ("version", "counters", "refused_for"),
    [
        ("v1.34.4", False, "DRAPartitionableDevices"),  # gate off: counters dropped
        ("v1.34.4", True, "in the devices' slice"),  # gate on, but 1.34's layout
        ("v1.37.2", False, "DRAPartitionableDevices"),
        ("v1.35.4", True, None),
        ("v1.37.2", True, None),
    ],
)
def test_dynamic_mig_is_refused_where_counters_cannot_be_published(
    version: str, counters: bool, refused_for: str | None
) -> None:
    why = capabilities.dynamic_mig_refusal(_answers(version, taints=True, counters=counters))
    if refused_for is None:
        assert why is None
    else:
        assert why is not None and version in why and refused_for in why
        assert "--mig-mode=static" in why


@pytest.mark.parametrize(("version", "kept"), [("v1.35.4", False), ("v1.37.2", True)])
def test_binding_conditions_are_used_only_where_the_server_keeps_them(
    version: str, kept: bool
) -> None:
    caps = _answers(version, taints=True, counters=True, binding=kept)
    assert caps.binding_conditions is kept
    assert capabilities.mig_before_binding(caps) is kept
    assert f"binding conditions {'on' if kept else 'off'}" in caps.summary()
    note = capabilities.binding_conditions_note(caps)
    if kept:
        assert note is None
    else:
        assert note is not None and version in note and "DRADeviceBindingConditions" in note
        assert "created at prepare, after the pod is bound" in note


def test_binding_conditions_are_probed_with_a_dry_run() -> None:
    api = FakeApi(
        {
            "/version": {"gitVersion": "v1.37.2"},
            "/apis/resource.k8s.io": GROUP_1_34,
            "/api/v1/nodes/n1": dict(_node("v1.37.2")),
        }
    )
    caps = capabilities.detect(api, driver="gpu.nvidia.com", node="n1")
    assert caps.binding_conditions is True
    assert len(api.created) == 3 and all(q == {"dryRun": "All"} for _, q in api.created)
    unknown = capabilities.detect(api, driver="gpu.nvidia.com", node=None)
    assert unknown.binding_conditions is None
    assert capabilities.mig_before_binding(unknown) is False
    assert capabilities.binding_conditions_note(unknown) is None
