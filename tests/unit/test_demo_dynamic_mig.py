"""The dynamic-MIG row's binding lines: what a reader of ``make demo`` sees of the binding
condition, the pod's binding and its events, from the objects the API server returns."""

from __future__ import annotations

from typing import Any

from e2e.demo.dynamic_mig import binding_lines

DEVICE = "gpu-0-mig-3g40gb-9-4"
CREATED = "gpu.nvidia.com/mig-created"


def claim(*, conditions: list[dict[str, Any]], waited: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {"driver": "gpu.nvidia.com", "pool": "p", "device": DEVICE}
    if waited:
        result |= {
            "bindingConditions": [CREATED],
            "bindingFailureConditions": ["gpu.nvidia.com/mig-failed"],
        }
    entry = {"driver": "gpu.nvidia.com", "pool": "p", "device": DEVICE, "conditions": conditions}
    return {
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "devices": [entry] if conditions else [],
        }
    }


def created(at: str, status: str = "True") -> dict[str, Any]:
    return {
        "type": CREATED,
        "status": status,
        "reason": "MigDeviceCreated",
        "message": "MIG device MIG-1 created for this allocation",
        "lastTransitionTime": at,
    }


# As the Python client writes them: times with +00:00, events with eventTime.
POD = {
    "status": {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-12-06T20:01:07+00:00",
            }
        ]
    }
}
EVENTS = [
    {"reason": "Scheduled", "eventTime": "2026-12-06T20:01:07.412000+00:00"},
    {"reason": "BindingConditionsPending", "eventTime": "2026-12-06T20:01:02.100000+00:00"},
    {"reason": "Pulled", "eventTime": "2026-12-06T20:01:08.000000+00:00"},
]


def test_the_condition_true_before_the_pod_bound_reads_so() -> None:
    lines = binding_lines(claim(conditions=[created("2026-12-06T20:01:05Z")]), POD, EVENTS)
    assert lines == [
        f"binding condition of {DEVICE} (claim status.devices):",
        f"  {CREATED} True at 2026-12-06T20:01:05Z (MigDeviceCreated)",
        "pod bound at 2026-12-06T20:01:07Z (PodScheduled True)",
        "pod events: BindingConditionsPending 2026-12-06T20:01:02Z, Scheduled 2026-12-06T20:01:07Z",
        "mig-created was True before the pod was bound",
    ]


def test_a_condition_after_the_binding_or_not_true_is_said() -> None:
    late = binding_lines(claim(conditions=[created("2026-12-06T20:01:09Z")]), POD, EVENTS)
    assert late[-1] == "mig-created was NOT True before the pod was bound"
    false = binding_lines(
        claim(conditions=[created("2026-12-06T20:01:05Z", status="False")]), POD, EVENTS
    )
    assert false[1].startswith(f"  {CREATED} False at ")
    assert false[-1] == "mig-created was NOT True before the pod was bound"


def test_no_condition_in_the_status_and_no_events() -> None:
    lines = binding_lines(claim(conditions=[]), POD, [])
    assert lines[1] == f"  {CREATED}: none in the claim's status"
    assert lines[-1] == "pod events: none of BindingConditionsPending, Scheduled"


def test_an_allocation_without_binding_conditions_was_made_at_prepare() -> None:
    assert binding_lines(claim(conditions=[], waited=False), POD, EVENTS) == [
        "no binding condition in the allocation: this API server does not serve them, "
        "the MIG device was created at prepare"
    ]
