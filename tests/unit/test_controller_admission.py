"""Admission review of ResourceClaims, ResourceClaimTemplates and DeviceClasses.

Cases: a valid GpuConfig is allowed; invalid configs are refused with the full field path and
reason (the same ConfigError prepare raises); other drivers' configs are ignored; templates are
checked at their nested path; misspelled selector names in exactly, firstAvailable and v1beta1
request-level selectors are allowed with warnings naming the selector; a DeviceClass's config and
selectors are checked at their paths; deletes, other kinds and malformed reviews get sensible
answers; a config of the wrong device type that names a request of a built-in class, or a config
naming a request the claim does not have, is refused as prepare would fail it (same rule).
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu import config as gpu_config
from dra_gpu.controller import admission

GPU_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
BAD_NAME = "device.attributes['gpu.nvidia.com'].productname == 'NVIDIA H200'"


def claim_review(
    devices: dict[str, Any], *, kind: str = "ResourceClaim", operation: str = "CREATE"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": devices}
    obj = {"spec": spec} if kind == "ResourceClaim" else {"spec": {"spec": spec}}
    if kind == "DeviceClass":
        obj = {"spec": devices}  # a class holds config and selectors directly in its spec
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc-123",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "operation": operation,
            "object": obj,
        },
    }


def opaque(params: Any, driver: str = "gpu.nvidia.com") -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": params}}


def request(selectors: list[str] | None = None) -> dict[str, Any]:
    sels = [{"cel": {"expression": e}} for e in selectors or []]
    return {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": sels}}


def response(review: dict[str, Any]) -> dict[str, Any]:
    out = admission.review(review)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    req = review.get("request")
    assert out["response"]["uid"] == (req.get("uid", "") if isinstance(req, dict) else "")
    return dict(out["response"])


def test_valid_config_is_allowed_without_warnings() -> None:
    params = {
        **GPU_CONFIG,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    r = response(claim_review({"requests": [request()], "config": [opaque(params)]}))
    assert r == {"uid": "abc-123", "allowed": True}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param(
            {**GPU_CONFIG, "sharing": {"strategy": "Sometimes"}},
            "spec.devices.config[0].opaque.parameters.sharing.strategy: ",
            id="strategy",
        ),
        pytest.param(
            {**GPU_CONFIG, "shareing": {}},
            "spec.devices.config[0].opaque.parameters.shareing: unknown field",
            id="unknown-field",
        ),
        pytest.param(
            {**GPU_CONFIG, "kind": "TpuConfig"},
            "spec.devices.config[0].opaque.parameters.kind: unsupported value 'TpuConfig'",
            id="kind",
        ),
        pytest.param(
            "not-an-object",
            "spec.devices.config[0].opaque.parameters: must be an object",
            id="not-object",
        ),
    ],
)
def test_invalid_config_is_refused_naming_the_field(params: Any, expected: str) -> None:
    r = response(claim_review({"requests": [request()], "config": [opaque(params)]}))
    assert r["allowed"] is False
    assert r["status"]["code"] == 422
    assert r["status"]["message"].startswith(expected)


def test_message_is_the_same_as_prepares() -> None:
    params = {**GPU_CONFIG, "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}}
    with pytest.raises(gpu_config.ConfigError) as prepare_error:
        gpu_config.parse_opaque_config(params)
    r = response(claim_review({"config": [opaque(params)]}))
    (problem,) = prepare_error.value.problems
    assert r["status"]["message"] == (
        f"spec.devices.config[0].opaque.parameters.{problem.path}: {problem.reason}"
    )


def test_every_bad_config_is_reported() -> None:
    bad = {**GPU_CONFIG, "x": 1}
    r = response(claim_review({"config": [opaque(bad), opaque(GPU_CONFIG), opaque(bad)]}))
    assert "config[0]" in r["status"]["message"] and "config[2]" in r["status"]["message"]
    assert "config[1]" not in r["status"]["message"]


def test_other_drivers_configs_are_ignored() -> None:
    r = response(claim_review({"config": [opaque({"anything": True}, driver="example.com")]}))
    assert r["allowed"] is True


def test_template_is_checked_at_its_path() -> None:
    review = claim_review(
        {"config": [opaque({**GPU_CONFIG, "x": 1})]}, kind="ResourceClaimTemplate"
    )
    r = response(review)
    assert r["allowed"] is False
    assert r["status"]["message"].startswith("spec.spec.devices.config[0].opaque.parameters.x:")


def test_device_class_config_and_selectors_are_checked() -> None:
    spec = {
        "selectors": [{"cel": {"expression": BAD_NAME}}],
        "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {**GPU_CONFIG, "x": 1}}}],
    }
    r = response(claim_review(spec, kind="DeviceClass"))
    assert r["allowed"] is False
    assert r["status"]["message"].startswith("spec.config[0].opaque.parameters.x:")
    assert [w.split(":")[0] for w in r["warnings"]] == ["spec.selectors[0]"]


def test_misspelled_selector_is_allowed_with_warning() -> None:
    r = response(claim_review({"requests": [request([BAD_NAME])]}))
    assert r["allowed"] is True
    assert r["warnings"] == [
        "spec.devices.requests[0].exactly.selectors[0]: gpu.nvidia.com never publishes "
        "attribute 'productname'; did you mean 'productName'?"
    ]


def test_first_available_and_v1beta1_selectors_are_checked() -> None:
    sel = [{"cel": {"expression": BAD_NAME}}]
    devices = {
        "requests": [
            {
                "name": "a",
                "firstAvailable": [
                    {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                    {"name": "h200", "deviceClassName": "gpu.nvidia.com", "selectors": sel},
                ],
            },
            {"name": "b", "deviceClassName": "gpu.nvidia.com", "selectors": sel},
        ]
    }
    warnings = response(claim_review(devices))["warnings"]
    assert [w.split(":")[0] for w in warnings] == [
        "spec.devices.requests[0].firstAvailable[1].selectors[0]",
        "spec.devices.requests[1].selectors[0]",
    ]


def test_refusal_still_carries_warnings() -> None:
    devices = {"requests": [request([BAD_NAME])], "config": [opaque({**GPU_CONFIG, "x": 1})]}
    r = response(claim_review(devices))
    assert r["allowed"] is False and len(r["warnings"]) == 1


@pytest.mark.parametrize(
    "review",
    [
        pytest.param(claim_review({"config": [opaque({"x": 1})]}, operation="DELETE"), id="del"),
        pytest.param(claim_review({"config": [opaque({"x": 1})]}, kind="Pod"), id="other-kind"),
        pytest.param(claim_review({}), id="no-devices"),
        pytest.param(claim_review({"config": "junk", "requests": [None, 3]}), id="junk-shapes"),
    ],
)
def test_allowed_untouched(review: dict[str, Any]) -> None:
    assert response(review) == {"uid": "abc-123", "allowed": True}


@pytest.mark.parametrize("review", [{}, {"request": {}}, {"request": "x"}], ids=str)
def test_malformed_review_is_refused(review: dict[str, Any]) -> None:
    r = response(review)
    assert r["allowed"] is False and "request.uid" in r["status"]["message"]


def test_update_leaving_devices_unchanged_is_allowed_even_if_invalid() -> None:
    devices = {"requests": [request([BAD_NAME])], "config": [opaque({**GPU_CONFIG, "x": 1})]}
    review = claim_review(devices, operation="UPDATE")
    review["request"]["oldObject"] = review["request"]["object"]
    assert response(review) == {"uid": "abc-123", "allowed": True}


def test_update_changing_devices_is_checked() -> None:
    review = claim_review({"config": [opaque({**GPU_CONFIG, "x": 1})]}, operation="UPDATE")
    review["request"]["oldObject"] = {"spec": {"devices": {}}}
    assert response(review)["allowed"] is False


MIG_CONFIG = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"}


def named(params: dict[str, Any], *requests: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
    return {"requests": list(requests), **entry} if requests else entry


def exactly(name: str, cls: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls}}


GPU, MIG = exactly("gpu", "gpu.nvidia.com"), exactly("mig", "mig.nvidia.com")
FIRST = {
    "name": "gpu",
    "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com"},
        {"name": "slice", "deviceClassName": "mig.nvidia.com"},
    ],
}
MISMATCH = "spec.devices.config[0]: a MigDeviceConfig cannot configure request 'gpu', whose "
SCOPES = [
    pytest.param(
        [GPU],
        [named(MIG_CONFIG, "gpu")],
        MISMATCH + "DeviceClass gpu.nvidia.com gives full GPUs (use GpuConfig, or name only "
        "requests for MIG devices in this config)",
        id="mig-config-naming-a-gpu-request",
    ),
    pytest.param(
        [MIG],
        [named(GPU_CONFIG, "mig")],
        "spec.devices.config[0]: a GpuConfig cannot configure request 'mig', whose DeviceClass "
        "mig.nvidia.com gives MIG devices (use MigDeviceConfig",
        id="gpu-config-naming-a-mig-request",
    ),
    pytest.param([GPU, MIG], [named(GPU_CONFIG)], None, id="claim-wide-passed-over"),
    pytest.param([GPU], [named(MIG_CONFIG, "gpu"), named(GPU_CONFIG)], None, id="later-fits"),
    pytest.param(
        [exactly("gpu", "admin.example.com")], [named(MIG_CONFIG, "gpu")], None, id="other-class"
    ),
    pytest.param(
        [GPU],
        [named(GPU_CONFIG, "gpus")],
        "spec.devices.config[0].requests: names 'gpus', which the claim does not have "
        "(its requests: gpu)",
        id="request-not-in-the-claim",
    ),
    pytest.param(
        [FIRST],
        [named(GPU_CONFIG, "gpu/small")],
        "spec.devices.config[0].requests: names 'gpu/small', which the claim does not have",
        id="subrequest-not-in-the-claim",
    ),
    pytest.param([FIRST], [named(GPU_CONFIG, "gpu/big")], None, id="fits-its-subrequest"),
    pytest.param(
        [FIRST],
        [named(GPU_CONFIG, "gpu/slice")],
        "spec.devices.config[0]: a GpuConfig cannot configure request 'gpu/slice', whose "
        "DeviceClass mig.nvidia.com gives MIG devices",
        id="gpu-config-naming-a-mig-subrequest",
    ),
    # The main request covers every subrequest: here the MIG one, which it does not fit.
    pytest.param(
        [FIRST],
        [named(GPU_CONFIG, "gpu")],
        "a GpuConfig cannot configure request 'gpu/slice'",
        id="gpu-config-naming-the-main-request",
    ),
]


@pytest.mark.parametrize(("requests", "configs", "refusal"), SCOPES)
def test_a_config_must_fit_the_requests_it_names(
    requests: list[dict[str, Any]], configs: list[dict[str, Any]], refusal: str | None
) -> None:
    r = response(claim_review({"requests": requests, "config": configs}))
    if refusal is None:
        assert r["allowed"], r
    else:
        assert not r["allowed"]
        assert refusal in r["status"]["message"], r["status"]["message"]


def test_template_scope_is_checked_at_its_path() -> None:
    review = claim_review(
        {"requests": [GPU], "config": [named(MIG_CONFIG, "gpu")]}, kind="ResourceClaimTemplate"
    )
    message = response(review)["status"]["message"]
    assert message.startswith("spec.spec.devices.config[0]: a MigDeviceConfig cannot"), message
