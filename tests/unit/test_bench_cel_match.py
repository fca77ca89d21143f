"""bench/cel_match.py: what the selector-cost benchmark feeds Kubernetes' evaluator.

Cases:
- the evaluator's module is pinned to the Kubernetes version the harness runs (a drift would
  time another release's evaluator than the one ``bench/scale.py`` measures);
- every layout's case evaluates the product's DeviceClass selectors before the claim's, on all
  devices of one node as published.
"""

from __future__ import annotations

from bench import cel_match as cm
from bench import scale_layouts as sl
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS, type_selector
from e2e import binaries


def test_the_evaluator_is_the_harness_kubernetes_release() -> None:
    dra = binaries.module_version(cm.GOMOD / "go.mod", cm.DRA_MODULE)
    api = binaries.module_version(cm.GOMOD / "go.mod", "k8s.io/api")
    k8s = binaries.DEFAULT_K8S_VERSION  # v1.37.2 -> staging modules v0.37.2
    assert dra == api == "v0." + k8s.removeprefix("v1.")


def test_each_layout_evaluates_class_then_claim_selectors_on_a_whole_node() -> None:
    by_name = {c.name: c for c in cm.cases(sl.LAYOUTS)}
    assert set(by_name) == set(sl.LAYOUTS)
    for name, layout in sl.LAYOUTS.items():
        case = by_name[name]
        kind = "gpu" if layout.device_class == GPU_CLASS else "mig"
        assert layout.device_class in (GPU_CLASS, MIG_CLASS)
        assert case.expressions == [type_selector(kind), layout.selector]
        rendered = layout.render("kwok-node-00000", "00000000-0000-0000-0000-000000000000")
        assert [d["name"] for d in case.devices] == [
            d["name"] for s in rendered for d in s["spec"].get("devices") or []
        ]
