"""The demo's table, from pods, claims and CDI specs (pure parts of ``e2e.demo.view``).

Cases:
- CDI device IDs resolve to the spec-level plus the device-level edits, only for the devices
  asked for; an ID no spec defines is an error (as in the runtime);
- a container's claims come from the pod's claim names (template claims via the pod status)
  and its own ``resources.claims``;
- the summary names each device with product, MIG profile and non-default sharing, and the
  GPU device nodes; a container without GPU env says so;
- the table aligns columns and continues multi-line cells on the next lines;
- a share of a GPU (consumable capacity) shows its device, its shareID's start and what it
  consumed; a whole device only its name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.demo import view as demo_view
from e2e.suite.views import ContainerView

KIND = "k8s.gpu.nvidia.com/claim"
SPEC = {
    "cdiVersion": "0.6.0",
    "kind": KIND,
    "containerEdits": {"env": ["CLAIM=1"], "deviceNodes": [{"path": "/dev/nvidiactl"}]},
    "devices": [
        {
            "name": "u1-gpu-3",
            "containerEdits": {
                "env": ["GPU_DEVICE_3=gpu-3", "GPU_DEVICE_3_PRODUCT=NVIDIA H200"],
                "deviceNodes": [{"path": "/dev/nvidia3", "hostPath": "/dev/null"}],
            },
        },
        {
            "name": "u1-gpu-4",
            "containerEdits": {
                "env": ["GPU_DEVICE_4=gpu-4"],
                "deviceNodes": [{"path": "/dev/nvidia4"}],
            },
        },
    ],
}


def test_cdi_ids_resolve_to_spec_and_device_edits() -> None:
    view = demo_view.cdi_view([SPEC], [f"{KIND}=u1-gpu-3"])
    assert view.env == {
        "CLAIM": "1",
        "GPU_DEVICE_3": "gpu-3",
        "GPU_DEVICE_3_PRODUCT": "NVIDIA H200",
    }
    assert view.device_paths == {"/dev/nvidiactl", "/dev/nvidia3"}


def test_spec_without_requested_devices_adds_nothing() -> None:
    other = {**SPEC, "kind": "example.com/other", "containerEdits": {"env": ["OTHER=1"]}}
    view = demo_view.cdi_view([other, SPEC], [f"{KIND}=u1-gpu-4"])
    assert "OTHER" not in view.env
    assert view.device_names == {"gpu-4"}


def test_unknown_cdi_id_is_an_error() -> None:
    with pytest.raises(ValueError, match="u1-gpu-9"):
        demo_view.cdi_view([SPEC], [f"{KIND}=u1-gpu-9"])


def test_container_claims_follow_pod_claim_names() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                {"name": "shared", "resourceClaimName": "shared-gpu"},
                {"name": "not-yet", "resourceClaimTemplateName": "x"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "one-gpu-ab"}]},
    }
    assert demo_view.pod_claim_names(pod) == {"gpu": "one-gpu-ab", "shared": "shared-gpu"}
    container = {"resources": {"claims": [{"name": "gpu", "request": "a"}, {"name": "shared"}]}}
    assert demo_view.container_claims(container) == [("gpu", "a"), ("shared", None)]
    assert demo_view.container_claims({"name": "plain"}) == []


@pytest.mark.parametrize(
    ("env", "paths", "expected"),
    [
        pytest.param(
            {"GPU_DEVICE_3": "gpu-3", "GPU_DEVICE_3_PRODUCT": "NVIDIA H200"},
            {"/dev/nvidia3", "/dev/nvidiactl"},
            "gpu-3 NVIDIA H200 (/dev/nvidia3)",
            id="full-gpu",
        ),
        pytest.param(
            {
                "GPU_DEVICE_1_MIG_3G20GB_9_4": "gpu-1-mig-3g20gb-9-4",
                "GPU_DEVICE_1_MIG_3G20GB_9_4_MIG_PROFILE": "3g.20gb",
                "GPU_DEVICE_1_MIG_3G20GB_9_4_SHARING_STRATEGY": "TimeSlicing",
            },
            {"/dev/nvidia1"},
            "gpu-1-mig-3g20gb-9-4 MIG 3g.20gb (/dev/nvidia1)",
            id="mig-default-sharing-hidden",
        ),
        pytest.param(
            {
                "GPU_DEVICE_4": "gpu-4",
                "GPU_DEVICE_4_SHARING_STRATEGY": "TimeSlicing",
                "GPU_DEVICE_4_TIMESLICE_INTERVAL": "Long",
            },
            {"/dev/nvidia4"},
            "gpu-4 [TimeSlicing Long] (/dev/nvidia4)",
            id="time-slicing-long",
        ),
        pytest.param(
            {"GPU_DEVICE_10": "gpu-10", "GPU_DEVICE_2": "gpu-2"},
            {"/dev/nvidia10", "/dev/nvidia2"},
            "gpu-2\ngpu-10 (/dev/nvidia2, /dev/nvidia10)",
            id="two-devices-in-natural-order",
        ),
        pytest.param(
            {"GPU_DEVICE_0": "gpu-3", "GPU_DEVICE_3_UUID": "GPU-x"},
            {"/dev/nvidia3"},
            "no GPU",
            id="name-under-another-devices-key-is-not-a-device",
        ),
        pytest.param({"PATH": "/bin"}, set(), "no GPU", id="no-gpu"),
    ],
)
def test_summary(env: dict[str, str], paths: set[str], expected: str) -> None:
    view = ContainerView(env=env, device_paths=frozenset(paths))
    assert demo_view.summarize(view) == expected


def test_table_aligns_columns_and_continues_multiline_cells() -> None:
    rows = [
        demo_view.Row("a/pod", "claim-1", "node", "gpu-0\ngpu-1", "gpu-0\ngpu-1", "log"),
        demo_view.Row("longer/pod-name", "-", "-", "-", "Pending", ""),
    ]
    lines = demo_view.render_table(rows).splitlines()
    assert lines[0].split() == [
        *("POD", "CLAIM", "NODE", "DEVICE", "(SIMULATED)"),
        *("WHAT", "THE", "CONTAINER", "SAW", "(SIMULATED", "GPUS)"),
    ]
    column = lines[0].index("CLAIM")
    assert lines[2][column:].startswith("claim-1")
    assert lines[3][: lines[0].index("DEVICE")].strip() == ""
    assert lines[3][lines[0].index("DEVICE") :].startswith("gpu-1")
    assert lines[3][lines[0].index("WHAT") :] == "gpu-1 (log)"
    assert lines[4].startswith("longer/pod-name")
    assert lines[4].endswith("Pending")


def test_an_admission_refusal_becomes_a_row_per_pod_saying_why() -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "status": "Failure",
            "code": 422,
            "message": 'admission webhook "claims.gpu.nvidia.com" denied the request: '
            "spec.devices.config[0].opaque.parameters.sharing.mpsConfig: only with the MPS "
            "strategy; spec.devices.config[0].opaque.parameters.sharing.strategy: bad",
        }
    )
    why = demo_view.admission_refusal(body)
    assert why is not None and why.startswith("spec.devices.config[0]")
    template = {"kind": "ResourceClaimTemplate", "metadata": {"name": "invalid-config"}}
    (row,) = demo_view.refused_rows("invalid-config", template, ["invalid-config"], why)
    assert (row.pod, row.claim, row.node, row.source) == (
        "invalid-config/invalid-config",
        "ResourceClaimTemplate invalid-config",
        "-",
        "admission",
    )
    lines = row.saw.splitlines()
    assert lines[0] == "refused at admission:"
    # Wrapped between words only, one problem after the other: nothing lost, no path cut.
    assert lines[1].startswith("spec.devices.config[0].opaque.parameters.sharing.mpsConfig: ")
    assert lines[-1].startswith("spec.devices.config[0].opaque.parameters.sharing.strategy: ")
    assert " ".join(lines[1:]) == why.replace("; ", " ")
    assert "(admission)" in demo_view.render_table([row])


@pytest.mark.parametrize(
    "body",
    [
        None,
        "not json",
        json.dumps({"message": 'namespaces "x" not found'}),
        json.dumps(["a list"]),
    ],
)
def test_other_api_errors_are_not_refusals(body: str | None) -> None:
    assert demo_view.admission_refusal(body) is None


def test_the_notice_says_why_nodes_are_simulated_and_where_to_look() -> None:
    assert demo_view.fallback_notice([], some_real=False) == []
    reason = "real node demo-h200 unavailable: timed out after 120s waiting for node demo-h200"
    log = "/cache/demo/supervisor.log"
    failed = [demo_view.Simulated(n, reason, log) for n in ("demo-h200", "demo-a100")]
    assert demo_view.fallback_notice(failed, some_real=False) == [
        f"NO CONTAINER RAN: {reason}.",
        f"  See why: less {log}",
    ]
    # Not root: real nodes could not start, with no log to read.
    unavailable = [demo_view.Simulated("demo-h200", "real nodes need root on Linux")]
    assert demo_view.fallback_notice(unavailable, some_real=False) == [
        "NO CONTAINER RAN: real nodes need root on Linux."
    ]
    # A reason is never the heading again, even when none was recorded.
    assert demo_view.fallback_notice([demo_view.Simulated("demo-a100", "")], some_real=True) == [
        "SOME NODES ARE SIMULATED: node demo-a100 did not start."
    ]


def test_nodes_simulated_on_purpose_are_no_warning_but_one_line() -> None:
    off = "real nodes off (DRA_GPU_DEMO_REAL_NODES=no)"
    chosen = [demo_view.Simulated(n, off, on_purpose=True) for n in ("demo-h200", "demo-a100")]
    assert demo_view.fallback_notice(chosen, some_real=False) == []
    assert demo_view.on_purpose_line(chosen) == [
        f"Simulated on purpose (no kubelet): demo-h200, demo-a100, {off}."
    ]
    assert demo_view.on_purpose_line([demo_view.Simulated("demo-a100", "x")]) == []


def test_a_share_shows_its_device_share_id_and_consumed_memory() -> None:
    results: list[dict[str, Any]] = [
        {
            "device": "gpu-0",
            "shareID": "3f9a01bc-77d2-4c1e-9b0a-5d6e7f809a1b",
            "consumedCapacity": {"memory": "40Gi"},
        },
        {"device": "gpu-1"},
    ]
    assert demo_view.device_lines(results) == [
        "gpu-0 share 3f9a01bc",
        "  consumed memory 40Gi",
        "gpu-1",
    ]
