"""``/metrics`` of the real plugins and controller while scenarios run on real kubelets.

The session's driver serves metrics on every plugin and the controller. Two scenarios of the
suite run here with the scrapes compared before and after: ``one-gpu`` must add exactly one
successful prepare and one successful unprepare per claim the run used (the kubelet calls each
once), nothing left prepared or in flight; ``invalid-config`` must add failed prepares counted
under their error kind. Published devices are what each node's profile has, all healthy; the
controller holds (no election here) and has reconciled the DeviceClasses.
"""

from __future__ import annotations

from e2e.driver import Driver
from e2e.probes import Series, sample, scrape
from e2e.suite.runner import Context, run_scenario
from e2e.suite.scenarios import SCENARIOS

BY_NAME = {s.name: s for s in SCENARIOS}
PUBLISHED = {  # (type, health) -> devices, per node profile (see tests/node/conftest.py)
    "gpu-h200": {("gpu", "HEALTHY"): 8},
    "gpu-a100": {("gpu", "HEALTHY"): 1, ("mig", "HEALTHY"): 9},
}


def plugin_scrapes(driver: Driver) -> dict[str, Series]:
    return {name: scrape(driver.metrics_ports[name]) for name in driver.plugins}


def total(scrapes: dict[str, Series], name: str, **labels: str) -> float:
    return sum(sample(s, name, **labels) or 0 for s in scrapes.values())


def claims(operation: str, result: str, kind: str = "") -> dict[str, str]:
    return {"operation": operation, "result": result, "error_kind": kind}


def test_metrics_count_what_the_scenarios_did(suite: Context, driver: Driver) -> None:
    before = plugin_scrapes(driver)
    runs = run_scenario(suite, BY_NAME["one-gpu"])
    after = plugin_scrapes(driver)
    used = sum(len(run.claims) for run in runs)
    assert used >= 1
    name = "dra_gpu_plugin_claims_total"
    for op in ("prepare", "unprepare"):
        added = total(after, name, **claims(op, "ok")) - total(before, name, **claims(op, "ok"))
        assert added == used, f"{op}: {added} successful claims counted, the run used {used}"
    for scrapes in after.values():
        assert sample(scrapes, "dra_gpu_plugin_prepared_claims") == 0
        assert not sample(scrapes, "dra_gpu_plugin_calls_in_flight", operation="prepare")
    for node, scrapes in after.items():
        published = {
            (dict(labels)["type"], dict(labels)["health"]): value
            for (series, labels), value in scrapes.items()
            if series == "dra_gpu_plugin_published_devices"
        }
        assert published == PUBLISHED[node], node

    before = after
    run_scenario(suite, BY_NAME["invalid-config"])
    after = plugin_scrapes(driver)
    failed = {
        dict(labels)["error_kind"]: value - (before[node].get((series, labels)) or 0)
        for node, scrapes in after.items()
        for (series, labels), value in scrapes.items()
        if series == name and dict(labels)["result"] == "error"
    }
    assert failed.get("PlanError", 0) >= 1, failed

    controller = scrape(driver.metrics_ports["controller"])
    assert sample(controller, "dra_gpu_controller_leader") == 1
    assert (sample(controller, "dra_gpu_deviceclass_reconciles_total", result="ok") or 0) >= 1
