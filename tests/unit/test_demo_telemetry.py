"""The demo's telemetry section (pure parts of ``e2e.demo.telemetry``).

Cases:
- the usage file the demo writes for the busy pod is one the simulated backend accepts, with
  the pod's process on the busy claim's GPU;
- ``dra-gpu top`` is shown as a user would type it, one ``--metrics-url`` per plugin, and run
  with the same arguments;
- the section shows top's table and the GpuIdle Events of the idle claim and pod, and says the
  busy one got none; a GpuIdle Event on the busy pod is called unexpected.
"""

from __future__ import annotations

import json
from typing import Any

from dra_gpu.devices import simulated_usage
from e2e.demo import telemetry

URLS = ["http://127.0.0.1:4001/metrics", "http://127.0.0.1:4002/metrics"]


def event(kind: str, name: str) -> dict[str, Any]:
    return {
        "type": "Warning",
        "reason": "GpuIdle",
        "involvedObject": {"kind": kind, "name": name},
        "message": f"GPU gpu-2 idle for 16s, 0 processes (claim demo-telemetry/{name})",
        "metadata": {"namespace": telemetry.NAMESPACE},
    }


def test_the_busy_usage_is_a_valid_usage_file_naming_the_pod() -> None:
    parsed = simulated_usage.parse(json.dumps(telemetry.busy_usage("gpu-1", "uid-1")))
    (entry,) = parsed.devices.values()
    assert list(parsed.devices) == ["gpu-1"]
    assert [(p.pod_uid, p.memory_bytes) for p in entry.processes] == [("uid-1", 12 << 30)]


def test_top_is_shown_as_typed_and_run_with_the_same_arguments() -> None:
    assert telemetry.top_argv(URLS) == [
        *("top", "-n", "demo-telemetry"),
        *("--metrics-url", URLS[0], "--metrics-url", URLS[1]),
    ]
    assert telemetry.top_command(URLS).splitlines() == [
        ".venv/bin/python -m dra_gpu top -n demo-telemetry \\",
        f"    --metrics-url {URLS[0]} \\",
        f"    --metrics-url {URLS[1]}",
    ]


def test_the_section_shows_top_the_idle_events_and_none_for_the_busy_pod() -> None:
    seen = telemetry.Observed(
        top_command="dra-gpu top",
        top_output="NODE   DEVICE\nn      gpu-1\n",
        events=(event("Pod", "idle"), event("ResourceClaim", "idle-gpu-x")),
        busy_claim="busy-gpu-y",
    )
    text = telemetry.section(seen)
    lines = text.splitlines()
    assert "$ dra-gpu top" in lines and "n      gpu-1" in lines
    claim_line = next(i for i, line in enumerate(lines) if "resourceclaim/idle-gpu-x" in line)
    pod_line = next(i for i, line in enumerate(lines) if "pod/idle " in line)
    assert claim_line < pod_line  # the claim first, then its pod
    assert lines[pod_line].split()[:3] == ["Warning", "GpuIdle", "pod/idle"]
    assert "(none on pod busy or its claim busy-gpu-y: its GPU is busy)" in lines

    wrong = telemetry.section(telemetry.Observed("t", "", (event("Pod", "busy"),), "busy-gpu-y"))
    assert "UNEXPECTED" in wrong and "(none on pod busy" not in wrong
