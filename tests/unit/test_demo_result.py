"""How ``make demo`` ends (``e2e.demo.run.result_text``): a fallback to simulated nodes is said in
the table's heading and again in the last lines, with the reason and the command showing the log.

Cases: a real node that failed, so both are simulated (reason + ``less <supervisor log>`` first
and last); only the second failed (said, but containers did run); real nodes (the heading says
the reports are read from the containers' logs, nothing after the tear-down).
"""

from __future__ import annotations

from e2e.demo import run as demo
from e2e.demo import view as demo_view
from e2e.demo.env import DemoState, NodeInfo

REASON = (
    "real node demo-h200 unavailable: timed out after 0s waiting for node demo-h200 to be Ready "
    "(last: NotFoundException 404: Not Found)"
)
LOG = "/cache/dra-gpu/demo/supervisor.log"
ROWS = [demo_view.Row("one-gpu/one-gpu", "c", "demo-h200", "gpu-0", "gpu-0 NVIDIA H200", "cdi")]


def _state(*, real: bool, a100_real: bool | None = None) -> DemoState:
    def node(name: str, profile: str, real: bool) -> NodeInfo:
        failed = {} if real else {"note": REASON, "note_log": LOG}
        return NodeInfo(name, profile, real, "/s/dra.sock", f"/cdi/{name}", "/p.log", **failed)

    return DemoState(
        pid=1,
        workdir="/w",
        kubeconfig="/w/admin.kubeconfig",
        server="https://127.0.0.1:6443",
        kubectl="/bin/kubectl",
        controller_log="/w/controller.log",
        webhook="https://127.0.0.1:8443/validate",
        nodes=(
            node("demo-h200", "h200x8", real),
            node("demo-a100", "a100x4-mig", real if a100_real is None else a100_real),
        ),
    )


def test_a_fallback_is_said_above_the_table_and_in_the_last_lines() -> None:
    lines = demo.result_text(_state(real=False), ROWS).splitlines()
    said = [f"NO CONTAINER RAN: {REASON}.", f"  See why: less {LOG}"]
    assert lines[:2] == said
    assert lines[-2:] == said
    assert "simulated nodes" in lines[2]
    table = lines.index(next(line for line in lines if line.startswith("POD ")))
    assert table < lines.index("Tear down:")


def test_one_real_node_of_two_is_not_called_no_container() -> None:
    lines = demo.result_text(_state(real=True, a100_real=False), ROWS).splitlines()
    said = [f"SOME NODES ARE SIMULATED: {REASON}.", f"  See why: less {LOG}"]
    assert lines[:2] == said
    assert "read from its log" in lines[2]
    assert lines[-2:] == said


def test_real_nodes_need_no_notice() -> None:
    lines = demo.result_text(_state(real=True), ROWS).splitlines()
    assert "read from its log" in lines[0]
    assert not any("NO CONTAINER RAN" in line for line in lines)
    assert lines[-1] == "  .venv/bin/python -m e2e.demo down"
