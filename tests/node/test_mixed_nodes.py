"""Simulated nodes (a Node object and a plugin, no kubelet) beside the real ones.

The simulated node's devices are published and allocatable like any other, but nothing would run a
pod there: the suite's node selector keeps scenario pods on the real nodes, which this checks.
"""

from __future__ import annotations

from pathlib import Path

from e2e.cluster import Cluster
from e2e.driver import Driver, PluginProcess
from e2e.suite.kube import Kube, wait_for
from e2e.suite.runner import Context, run_scenario
from e2e.suite.scenarios import BY_NAME


def test_simulated_node_publishes_while_pods_stay_on_real_nodes(
    cluster: Cluster, driver: Driver, kube: Kube, suite: Context, tmp_path: Path
) -> None:
    name = "sim-h100"
    cluster.register_node(name)
    plugin = PluginProcess.simulated(
        tmp_path, node_name=name, kubeconfig=cluster.kubeconfig, profile="h100x8"
    ).start()
    try:

        def published() -> int | None:
            if not plugin.alive:
                raise AssertionError(f"the plugin of {name} exited:\n{plugin.log_tail()}")
            mine = [s for s in kube.slices() if s["spec"].get("nodeName") == name]
            count = sum(len(s["spec"].get("devices") or []) for s in mine)
            return count or None

        assert wait_for(f"slices of {name}", published, timeout=60) == 8
        runs = run_scenario(suite, BY_NAME["two-gpus"])
        assert {c.node for r in runs for c in r.containers} <= set(driver.plugins)
    finally:
        plugin.stop()
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)
