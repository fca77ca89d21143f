"""bench/scale.py's table and exit status: a layout that stopped prints ``not measured: <why>``
for each figure it did not reach, never a zero as if measured, and fails the run unless
``--allow-partial``. With ``--repeat``, each layout against ``minimal``: the medians' ratio and
every round's.
"""

from __future__ import annotations

from bench import scale
from bench import scale_layouts as sl

WHY = "memory guard: 2.9 GiB available, below 3.0 GiB"


def finished() -> scale.Figures:
    fig = scale.Figures(sl.Run(sl.LAYOUTS["static"]))
    fig.devices_per_node, fig.slices_per_node, fig.kib_per_node = 8, 1, 12.5
    fig.publish_s, fig.republish_s, fig.rewrites = 4.2, 1.1, 0
    fig.cold_calls = {"POST resourceslices": 1.0}
    fig.before = scale.Memory(100.0, 50.0, 10.0, 0, 0.0)
    fig.after = scale.Memory(160.0, 70.0, 20.0, 100, 5.0)
    fig.workload = scale.Workload(100, 100, 2.0, 50.0, 40.0, 90.0, 10.0, 45.0, 95.0, 0)
    fig.explain_s, fig.load = 1.5, (1.0, 1.0, 1.0)
    return fig


def stopped_while_publishing() -> scale.Figures:
    fig = scale.Figures(sl.Run(sl.LAYOUTS["dynamic-mig"]))
    fig.devices_per_node, fig.slices_per_node, fig.kib_per_node = 56, 2, 80.0
    fig.before = scale.Memory(100.0, 50.0, 10.0, 0, 0.0)
    fig.stopped = WHY
    return fig


def row(lines: list[str], label: str) -> list[str]:
    (found,) = [line for line in lines if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in found.strip("|").split("|")[1:]]


def test_a_stopped_layout_prints_why_for_every_figure_it_did_not_reach() -> None:
    lines = scale.table([finished(), stopped_while_publishing()], 1000)
    unreached = [
        "publish all, cold start (s)",
        "publish all, restart (s)",
        "slices rewritten on restart",
        "cold start: our calls per node",
        "API server RSS growth (MiB)",
        "pods/s (creation -> bound)",
        "dra-gpu explain, whole cluster (s)",
        "load average at the end (1 min)",
    ]
    for label in unreached:
        measured, stopped = row(lines, label)
        assert stopped == f"not measured: {WHY}", label
        assert not measured.startswith("not measured"), label
    # What it did reach (the layout's own size) is shown; no zero stands in for a figure.
    assert row(lines, "devices / slices per node") == ["8 / 1", "56 / 2"]
    assert row(lines, "slices rewritten on restart")[0] == "0"  # measured: nothing rewritten
    assert not any(cell in ("0", "0.0") for line in lines for cell in row_cells(line, 2))


def row_cells(line: str, column: int) -> list[str]:
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    return cells[column : column + 1]


def test_closing_lines_say_not_measured_for_a_stopped_layout() -> None:
    lines = scale.closing_lines(
        [finished(), stopped_while_publishing()], [sl.LAYOUTS["static"], sl.LAYOUTS["dynamic-mig"]]
    )
    assert lines == [
        "static: 100 pods in 2.0 s, 50.0 pods/s",
        f"dynamic-mig: not measured: {WHY}",
    ]


def measured(layout: str, round_: int, pods_per_s: float) -> scale.Figures:
    fig = scale.Figures(sl.Run(sl.LAYOUTS[layout], round_))
    seconds = 1000 / pods_per_s
    fig.workload = scale.Workload(1000, 1000, seconds, pods_per_s, 0, 0, 0, 0, 0, 0)
    return fig


def test_repeated_rounds_end_with_each_rounds_ratio_to_minimal() -> None:
    figs = [
        measured("static", 1, 14.7),
        measured("minimal", 1, 18.4),
        measured("minimal", 2, 13.1),
        measured("static", 2, 12.9),
        stopped_while_publishing_static(3),
        measured("minimal", 3, 20.3),
    ]
    lines = scale.closing_lines(figs, [sl.LAYOUTS["static"], sl.LAYOUTS["minimal"]])
    # Median of static's two measured rounds is the lower, 12.9; minimal's is 18.4.
    assert lines[:2] == [
        "static / minimal: 0.70 (pods/s, medians)",
        "static / minimal by round: 0.80, 0.98, -",
    ]
    assert lines[2].startswith("static: 1000 pods in 77.5 s, 12.9 pods/s (median of rounds: ")


def stopped_while_publishing_static(round_: int) -> scale.Figures:
    fig = scale.Figures(sl.Run(sl.LAYOUTS["static"], round_))
    fig.stopped = WHY
    return fig


def test_a_stopped_layout_fails_the_run_unless_partial_is_allowed() -> None:
    assert scale.exit_status([finished()], allow_partial=False) == 0
    partial = [finished(), stopped_while_publishing()]
    assert scale.exit_status(partial, allow_partial=False) == 1
    assert scale.exit_status(partial, allow_partial=True) == 0


def test_a_figure_not_asked_for_on_a_finished_layout_is_a_dash() -> None:
    lines = scale.table([finished()], 100)  # no steady state measured on it
    assert row(lines, "steady: all requests /node/min") == ["-"]
