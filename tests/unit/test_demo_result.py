"""How ``make demo`` ends (``e2e.demo.run.result_text``): a real node that did not start is said in
the table's heading and again in the last lines, with the reason and the command showing the log;
nodes simulated on purpose are named in one last line, with no warning.

Cases: the first real node failed, so all are simulated (reason + ``less <supervisor log>`` first
and last); only a later one failed (said, but containers did run); every node real (the heading
says the reports are read from the containers' logs, nothing after the tear-down); real nodes
turned off (one line naming the nodes and why, no warning, the heading says where the table is
from). In every case the GPUs are said to be simulated: in the heading, in the table's columns and
in the last line, real nodes included (their GPUs are simulated too).
"""

from __future__ import annotations

from dataclasses import replace

from e2e.demo import run as demo
from e2e.demo import view as demo_view
from e2e.demo.env import DemoState, NodeInfo

REASON = (
    "real node demo-h200 unavailable: timed out after 0s waiting for node demo-h200 to be Ready "
    "(last: NotFoundException 404: Not Found)"
)
OFF = "real nodes off (DRA_GPU_DEMO_REAL_NODES=no)"
LOG = "/cache/dra-gpu/demo/supervisor.log"
ROWS = [demo_view.Row("one-gpu/one-gpu", "c", "demo-h200", "gpu-0", "gpu-0 NVIDIA H200", "cdi")]
NODES = (("demo-h200", "h200x8"), ("demo-a100", "a100x4-mig"), ("demo-h100-dyn", "h100x8-mig"))
GPUS = (
    "GPUs: SIMULATED on every node (profiles h200x8, a100x4-mig, h100x8-mig), no NVIDIA "
    "hardware: names, UUIDs and /dev/nvidia* come from the profile; a real node is a real "
    "kubelet + containerd, not a real GPU (make demo-gpu runs on one)."
)


def _state(real: int, *, on_purpose: bool = False) -> DemoState:
    """The first ``real`` nodes real, the others simulated: failed, or turned off on purpose."""

    def node(name: str, profile: str, real: bool) -> NodeInfo:
        base = NodeInfo(name, profile, real, "/s/dra.sock", f"/cdi/{name}", "/p.log")
        if real:
            return base
        if on_purpose:
            return replace(base, note=OFF, on_purpose=True)
        return replace(base, note=REASON, note_log=LOG)

    return DemoState(
        pid=1,
        workdir="/w",
        kubeconfig="/w/admin.kubeconfig",
        server="https://127.0.0.1:6443",
        kubectl="/bin/kubectl",
        controller_log="/w/controller.log",
        webhook="https://127.0.0.1:8443/validate",
        nodes=tuple(node(name, profile, i < real) for i, (name, profile) in enumerate(NODES)),
    )


def test_a_fallback_is_said_above_the_table_and_in_the_last_lines() -> None:
    lines = demo.result_text(_state(0), ROWS).splitlines()
    said = [f"NO CONTAINER RAN: {REASON}.", f"  See why: less {LOG}"]
    assert lines[:2] == said
    assert lines[-3:] == [*said, GPUS]
    assert "simulated nodes" in lines[2]
    table = lines.index(next(line for line in lines if line.startswith("POD ")))
    assert table < lines.index("Tear down:")
    assert "DEVICE (SIMULATED)" in lines[table] and "(SIMULATED GPUS)" in lines[table]


def test_a_later_real_node_failing_is_not_called_no_container() -> None:
    lines = demo.result_text(_state(1), ROWS).splitlines()
    said = [f"SOME NODES ARE SIMULATED: {REASON}.", f"  See why: less {LOG}"]
    assert lines[:2] == said
    assert "read from its log" in lines[2]
    assert lines[-3:] == [*said, GPUS]


def test_real_nodes_need_no_notice() -> None:
    lines = demo.result_text(_state(3), ROWS).splitlines()
    assert "read from its log" in lines[0]
    assert not any("NO CONTAINER RAN" in line or "SOME NODES" in line for line in lines)
    # Real kubelets, simulated GPUs: said above the table, on each node and at the end.
    assert lines[1] == GPUS
    assert "  demo-h200 real (kubelet + containerd), SIMULATED GPUs of profile h200x8" in (
        "\n".join(lines)
    )
    assert lines[-3:] == ["  .venv/bin/python -m e2e.demo down", "", GPUS]


def test_nodes_simulated_on_purpose_are_named_in_one_line_without_a_warning() -> None:
    text = demo.result_text(_state(0, on_purpose=True), ROWS)
    lines = text.splitlines()
    assert lines[-2:] == [
        f"Simulated on purpose (no kubelet): demo-h200, demo-a100, demo-h100-dyn, {OFF}.",
        GPUS,
    ]
    assert "NO CONTAINER RAN" not in text and "SOME NODES ARE SIMULATED" not in text
    assert lines[0].startswith("Pods on simulated nodes (no kubelet)")
