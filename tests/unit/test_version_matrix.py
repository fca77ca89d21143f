"""``make matrix``'s table: versions picked, JUnit reports read, each cell's verdict, the exit
status, the docs block kept only from a green run."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import binaries, matrix, procs
from e2e.matrix import FAILED, NOT_RUN, PASSED, REFUSED, Outcome
from e2e.suite import needs
from e2e.suite.scenarios import SCENARIOS

EXT = (
    "refused: Kubernetes v1.34.4 drops DeviceClass spec.extendedResourceName "
    "(feature gate DRAExtendedResource is off there): a nvidia.com/gpu limit is not served"
)
NO_ROOT = "a real node (containerd, runc, kubelet, cgroups, mounts) needs root"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.node.test_scenarios" name="test_scenario[one-gpu]" time="4.1"/>
<testcase classname="tests.node.test_scenarios" name="test_scenario[extended-resource]">
  <skipped type="pytest.skip"
    message="refused: Kubernetes v1.34.4 drops it (feature gate DRAExtendedResource is off there)"
  >why</skipped>
</testcase>
<testcase classname="tests.node.test_scenarios" name="test_scenario[two-gpus]">
  <failure message="ScenarioFailed: two-gpus: pod x ended (Failed)&#10;second line">tb</failure>
</testcase>
</testsuite></testsuites>
"""


def test_default_versions_are_one_per_minor_and_the_variable_picks() -> None:
    assert [v.split(".")[1] for v in matrix.versions_from(None)] == ["34", "35", "36", "37"]
    assert matrix.versions_from("1.34.4, v1.37.2") == ("v1.34.4", "v1.37.2")
    with pytest.raises(ValueError, match=r"1\.34"):
        matrix.versions_from("1.34")


def test_junit_outcomes_per_scenario() -> None:
    why = "Kubernetes v1.34.4 drops it (feature gate DRAExtendedResource is off there)"
    assert matrix.parse_junit(JUNIT, "v1.34.4") == {
        "one-gpu": Outcome(PASSED),
        "extended-resource": Outcome(REFUSED, why),
        "two-gpus": Outcome(FAILED, "ScenarioFailed: two-gpus: pod x ended (Failed)"),
    }
    # The same refusal on a version that serves the feature ran nothing: NOT RUN.
    late = matrix.parse_junit(JUNIT, "v1.37.2")["extended-resource"]
    assert late.status == NOT_RUN and "not known for v1.37.2" in late.detail


@pytest.mark.parametrize(
    ("version", "message", "status"),
    [
        ("v1.34.4", EXT, REFUSED),
        ("v1.35.4", EXT.replace("DRAExtendedResource", "DRAConsumableCapacity"), REFUSED),
        ("v1.36.3", EXT, NOT_RUN),  # 1.36 serves it: the refusal is a cell that ran nothing
        ("v1.34.4", EXT.replace("DRAExtendedResource", "DRASomethingElse"), NOT_RUN),
        ("v1.34.4", "refused: the cluster is having a bad day", NOT_RUN),
        ("v1.37.2", NO_ROOT, NOT_RUN),  # run without root: the whole tier skips
        ("v1.37.2", "", NOT_RUN),
    ],
)
def test_a_skip_is_refused_only_for_a_known_gate_the_version_lacks(
    version: str, message: str, status: str
) -> None:
    outcome = matrix.skip_verdict(version, message)
    assert outcome.status == status
    if status == NOT_RUN:
        assert outcome.detail  # NOT RUN always says why


def test_known_refusals_name_their_gate_and_first_serving_version() -> None:
    gate = needs.known_refusal("v1.35.4", "feature gate DRAConsumableCapacity is off")
    assert gate is not None and gate.served_from == (1, 36)
    assert needs.known_refusal("1.36.0", "feature gate DRAConsumableCapacity is off") is None
    assert needs.known_refusal("v1.34.4", "no gate named") is None
    assert needs.known_refusal("not a version", "feature gate DRAExtendedResource") is None


def test_a_run_without_root_fails_and_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skipped = "".join(
        f'<testcase name="test_scenario[{s}]"><skipped message="{NO_ROOT}"/></testcase>'
        for s in ("one-gpu", "two-gpus")
    )
    report = f"<testsuites><testsuite>{skipped}</testsuite></testsuites>"
    results = matrix.complete(
        {"v1.37.2": matrix.parse_junit(report, "v1.37.2")}, ["one-gpu", "two-gpus"]
    )
    assert matrix.summary_line(results) == "0 passed, 0 failed, 2 not run"
    assert matrix.exit_status(results) == 1 and not matrix.green(results)
    assert "| one-gpu | NOT RUN |" in matrix.table(results, ["one-gpu", "two-gpus"])
    assert f"- v1.37.2 one-gpu: NOT RUN: skipped: {NO_ROOT}" in matrix.notes(results)


def test_exit_status_over_the_cells() -> None:
    def run(*statuses: str) -> dict[str, dict[str, Outcome]]:
        return {"v1.37.2": {f"s{i}": Outcome(s, "x") for i, s in enumerate(statuses)}}

    assert matrix.exit_status(run(PASSED, REFUSED)) == 0
    assert matrix.exit_status(run(PASSED, FAILED)) == 1
    assert matrix.exit_status(run(PASSED, NOT_RUN)) == 1
    assert matrix.exit_status(run(REFUSED)) == 1  # nothing passed: nothing was shown to work
    assert matrix.exit_status({}) == 1


def test_docs_are_rewritten_only_from_a_green_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path))
    monkeypatch.setenv("K8S_VERSIONS", "v1.37.2")
    doc = tmp_path / "versions.md"
    before = f"# Versions\n{matrix.BEGIN}\nthe last green run\n{matrix.END}\n"
    doc.write_text(before)
    out = tmp_path / "out"
    junit = out / "v1.37.2" / "junit.xml"
    junit.parent.mkdir(parents=True)
    names = [s.name for s in SCENARIOS]
    cases = "".join(
        f'<testcase name="test_scenario[{n}]"><skipped message="{NO_ROOT}"/></testcase>'
        for n in names
    )
    junit.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    argv = ["--out", str(out), "--docs", str(doc), "--reuse"]
    assert matrix.main(argv) == 1
    assert doc.read_text() == before
    passed = "".join(f'<testcase name="test_scenario[{n}]"/>' for n in names)
    junit.write_text(f"<testsuites><testsuite>{passed}</testsuite></testsuites>")
    assert matrix.main(argv) == 1  # the dynamic-MIG node's rows are not in the report
    assert doc.read_text() == before
    passed += "".join(f'<testcase name="{t}"/>' for t in matrix.NODE_CASES)
    junit.write_text(f"<testsuites><testsuite>{passed}</testsuite></testsuites>")
    assert matrix.main(argv) == 1  # the binding row does not say which path made the device
    assert doc.read_text() == before
    path = f'<property name="{matrix.BINDING_PROPERTY}" value="{matrix.MADE_BEFORE_BINDING}"/>'
    passed = passed.replace(
        f'<testcase name="{matrix.BINDING_TEST}"/>',
        f'<testcase name="{matrix.BINDING_TEST}"><properties>{path}</properties></testcase>',
    )
    junit.write_text(f"<testsuites><testsuite>{passed}</testsuite></testsuites>")
    assert matrix.main(argv) == 0
    rows = len(names) + len(matrix.NODE_CASES)
    assert f"**{rows} passed, 0 failed**" in doc.read_text()
    assert "| dynamic-mig-binding | passed |" in doc.read_text()


def test_table_counts_every_cell_and_a_missing_scenario_fails() -> None:
    results = matrix.complete(
        {"v1.34.4": matrix.parse_junit(JUNIT, "v1.34.4"), "v1.37.2": {"one-gpu": Outcome(PASSED)}},
        ["one-gpu", "extended-resource", "two-gpus"],
    )
    text = matrix.table(results, ["one-gpu", "extended-resource", "two-gpus"])
    assert text.splitlines()[0] == "| scenario | v1.34.4 | v1.37.2 |"
    assert "| extended-resource | refused | NOT RUN |" in text
    assert matrix.summary_line(results) == "2 passed, 1 failed, 2 not run (1 refused)"
    assert any(
        "v1.37.2 two-gpus: NOT RUN: not in the run's report" in n for n in matrix.notes(results)
    )


def test_the_docs_block_is_replaced_and_the_rest_kept() -> None:
    doc = f"# Versions\nbefore\n{matrix.BEGIN}\nold table\n{matrix.END}\nafter\n"
    new = matrix.replace_block(doc, "new table")
    assert new == f"# Versions\nbefore\n{matrix.BEGIN}\nnew table\n{matrix.END}\nafter\n"
    with pytest.raises(ValueError, match="matrix:begin"):
        matrix.replace_block("no markers", "x")


def test_the_report_names_commit_failures_and_build_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path))
    green = {"v1.37.2": {"one-gpu": Outcome(PASSED)}}
    text = matrix.report(green, ["one-gpu"], commit="abc1234", date="2026-12-01 15:00 UTC")
    assert "at commit `abc1234`" in text and "- v1.37.2: no recorded build" in text
    assert "FAILED" not in text and text.endswith("**1 passed, 0 failed**")
    red = {"v1.34.4": {"one-gpu": Outcome(FAILED, "pod x ended (Failed)")}}
    assert "- v1.34.4 one-gpu: FAILED: pod x ended (Failed)" in matrix.report(
        red, ["one-gpu"], commit="abc1234", date="2026-12-01 15:00 UTC"
    )


DYNAMIC_REFUSAL = (
    "refused: dynamic MIG (partitionable devices) not available: Kubernetes v1.35.4 drops it "
    "(feature gate DRAPartitionableDevices is off on this API server); start the plugin with "
    "--mig-mode=static"
)
NODE_JUNIT = f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.node.test_dynamic_mig_node"
  name="test_made_before_the_pod_binds_where_served_at_prepare_elsewhere">
  <skipped type="pytest.skip" message="{DYNAMIC_REFUSAL}">why</skipped>
</testcase>
<testcase classname="tests.node.test_dynamic_mig_node"
  name="test_pods_get_created_mig_devices_through_the_kubelet" time="80.0"/>
</testsuite></testsuites>
"""


def test_the_dynamic_mig_node_tests_are_rows_refused_where_the_plugin_refuses() -> None:
    """The plugin's own refusal of --mig-mode=dynamic (1.34, 1.35: partitionable devices off)
    is a known refusal there, and a cell that ran nothing on 1.36+."""
    outcomes = matrix.parse_junit(NODE_JUNIT, "v1.35.4")
    binding = outcomes["dynamic-mig-binding"]
    assert binding.status == REFUSED and "DRAPartitionableDevices" in binding.detail
    assert outcomes["dynamic-mig-through-the-kubelet"] == Outcome(PASSED)
    assert matrix.parse_junit(NODE_JUNIT, "v1.36.3")["dynamic-mig-binding"].status == NOT_RUN
    rows = list(matrix.NODE_CASES.values())
    assert rows == ["dynamic-mig-binding", "dynamic-mig-through-the-kubelet"]
    assert not set(rows) & {s.name for s in SCENARIOS}


def _binding_junit(path: str | None) -> str:
    prop = (
        f'<properties><property name="{matrix.BINDING_PROPERTY}" value="{path}"/></properties>'
        if path is not None
        else ""
    )
    return f"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="1">
<testcase classname="tests.node.test_dynamic_mig_node" name="{matrix.BINDING_TEST}">{prop}
</testcase>
</testsuite></testsuites>
"""


@pytest.mark.parametrize(
    ("version", "path", "status"),
    [
        ("v1.36.3", matrix.MADE_BEFORE_BINDING, PASSED),
        ("v1.37.2", matrix.MADE_BEFORE_BINDING, PASSED),
        # 1.36+ serves binding conditions with its default gates: made at prepare is not the
        # promise there, though the pod ran.
        ("v1.36.3", matrix.MADE_AT_PREPARE, FAILED),
        ("v1.35.4", matrix.MADE_AT_PREPARE, PASSED),  # the gate turned on for partitionable
        ("v1.35.4", matrix.MADE_BEFORE_BINDING, FAILED),
        ("v1.37.2", None, FAILED),  # a report that does not say which path ran shows nothing
    ],
)
def test_the_dynamic_mig_binding_row_passes_only_on_the_path_the_version_gives(
    version: str, path: str | None, status: str
) -> None:
    outcome = matrix.parse_junit(_binding_junit(path), version)["dynamic-mig-binding"]
    assert outcome.status == status
    if status == PASSED:
        # The path is in the report's notes beside the table.
        note = f"- {version} dynamic-mig-binding: passed: MIG device made {path}"
        assert matrix.notes({version: {"dynamic-mig-binding": outcome}}) == [note]
    else:
        assert "DRADeviceBindingConditions" in outcome.detail


def test_binding_conditions_are_served_from_1_36() -> None:
    assert [needs.serves(v, needs.BINDING_CONDITIONS) for v in matrix.VERSIONS] == [
        False,
        False,
        True,
        True,
    ]
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        needs.serves("latest", needs.BINDING_CONDITIONS)


def test_the_runs_get_the_default_feature_gates_and_keep_test_properties(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DRA_GPU_FEATURE_GATES left in the shell does not reach the suite: the verdicts expect
    each version's default gates."""
    seen: dict[str, str] = {}

    argvs: list[list[str]] = []

    def run_to_end(argv: list[str], *, env: dict[str, str], **kw: object) -> int:
        seen.update(env)
        argvs.append(argv)
        return 0

    monkeypatch.setattr(binaries, "ensure", lambda *a, **kw: {})
    monkeypatch.setattr(procs, "run_to_end", run_to_end)
    monkeypatch.setenv("DRA_GPU_FEATURE_GATES", "DRADeviceBindingConditions=false")
    monkeypatch.setenv("CI", "true")
    assert matrix.run_version("v1.36.3", tmp_path) == {}
    assert seen["DRA_GPU_K8S_VERSION"] == "v1.36.3"
    assert "DRA_GPU_FEATURE_GATES" not in seen and "CI" not in seen
    # The JUnit family that keeps the binding row's record_property.
    (argv,) = argvs
    assert "junit_family=xunit1" in argv
