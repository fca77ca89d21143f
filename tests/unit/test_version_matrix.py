"""``make matrix``'s table: versions picked, JUnit reports read, the docs block kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import matrix
from e2e.matrix import FAILED, PASSED, REFUSED, Outcome

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.node.test_scenarios" name="test_scenario[one-gpu]" time="4.1"/>
<testcase classname="tests.node.test_scenarios" name="test_scenario[extended-resource]">
  <skipped type="pytest.skip" message="refused: Kubernetes v1.34.4 drops it">why</skipped>
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
    assert matrix.parse_junit(JUNIT) == {
        "one-gpu": Outcome(PASSED),
        "extended-resource": Outcome(REFUSED, "Kubernetes v1.34.4 drops it"),
        "two-gpus": Outcome(FAILED, "ScenarioFailed: two-gpus: pod x ended (Failed)"),
    }


def test_table_counts_every_cell_and_a_missing_scenario_fails() -> None:
    results = matrix.complete(
        {"v1.34.4": matrix.parse_junit(JUNIT), "v1.37.2": {"one-gpu": Outcome(PASSED)}},
        ["one-gpu", "extended-resource", "two-gpus"],
    )
    text = matrix.table(results, ["one-gpu", "extended-resource", "two-gpus"])
    assert text.splitlines()[0] == "| scenario | v1.34.4 | v1.37.2 |"
    assert "| extended-resource | refused | FAILED |" in text
    assert matrix.summary_line(results) == "2 passed, 3 failed (1 refused)"
    assert any("v1.37.2 two-gpus: FAILED: not run" in n for n in matrix.notes(results))


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
