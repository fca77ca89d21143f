"""The scenario manifests users read: valid YAML, runnable without a registry, all catalogued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.images.node_images import TEST_IMAGE
from e2e.suite.kube import load_manifests
from e2e.suite.runner import SCENARIOS_DIR, with_node_selector
from e2e.suite.scenarios import BY_NAME

FOLDERS = sorted(p for p in SCENARIOS_DIR.iterdir() if p.is_dir())


def test_every_folder_is_a_catalogued_scenario_and_back() -> None:
    assert {p.name for p in FOLDERS} == set(BY_NAME)


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_pods_use_the_local_image_and_only_declared_claims(folder: Path) -> None:
    docs = load_manifests(folder)
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert pods, f"{folder.name} has no pod"
    for pod in pods:
        declared = {c["name"] for c in pod["spec"].get("resourceClaims") or []}
        for container in pod["spec"]["containers"]:
            assert container["image"] == TEST_IMAGE
            assert container["imagePullPolicy"] == "Never"
            used = {c["name"] for c in (container.get("resources") or {}).get("claims") or []}
            assert used <= declared


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_claims_use_the_v1_api_and_our_device_classes(folder: Path) -> None:
    docs = load_manifests(folder)
    claims = [d for d in docs if d["kind"] != "Pod"]
    if not claims:  # only a pod asking for the extended resource the gpu class serves
        limits = [c["resources"]["limits"] for d in docs for c in d["spec"]["containers"]]
        assert all(lim.get("nvidia.com/gpu") for lim in limits), folder.name
    for doc in claims:
        assert doc["apiVersion"] == "resource.k8s.io/v1"
        spec: dict[str, Any] = (
            doc["spec"]["spec"] if doc["kind"].endswith("Template") else doc["spec"]
        )
        for request in spec["devices"]["requests"]:
            assert request["exactly"]["deviceClassName"] in ("gpu.nvidia.com", "mig.nvidia.com")


def test_node_selector_is_added_without_touching_the_manifest() -> None:
    pod: dict[str, Any] = {"kind": "Pod", "spec": {"nodeSelector": {"a": "b"}, "containers": []}}
    changed = with_node_selector(pod, {"c": "d"})
    assert changed["spec"]["nodeSelector"] == {"a": "b", "c": "d"}
    assert pod["spec"]["nodeSelector"] == {"a": "b"}
