"""The kubelet plugin crashes (SIGKILL) while pods use its devices, then comes back.

Must hold: running pods are unaffected (same container, never restarted, CDI spec still there),
pods started after the restart still get exactly their devices, and deleting the pods prepared by
the killed instance still unprepares them (the restarted plugin works from its checkpoint).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from e2e.driver import Driver
from e2e.suite import runner
from e2e.suite.runner import Context
from e2e.suite.scenarios import BY_NAME

NODE = "gpu-h200"


def _container_ids(pod: dict[str, Any]) -> dict[str, tuple[str, int]]:
    statuses = pod["status"].get("containerStatuses") or []
    return {s["name"]: (s.get("containerID", ""), s.get("restartCount", 0)) for s in statuses}


def test_plugin_killed_and_restarted_while_pods_run(suite: Context, driver: Driver) -> None:
    ctx = dataclasses.replace(
        suite, node_selector={**suite.node_selector, "kubernetes.io/hostname": NODE}
    )
    plugin = driver.plugins[NODE]
    before, problems = runner.start(ctx, BY_NAME["one-gpu"])
    assert not problems, problems
    old_pod = next(iter(before.pods))
    old_ids = _container_ids(ctx.kube.pod(before.namespace, old_pod))
    registered = plugin.registrations()
    uid = next(iter(before.claims.values()))["metadata"]["uid"]

    plugin.kill()
    after = None
    try:
        pod = ctx.kube.pod(before.namespace, old_pod)
        assert pod["status"]["phase"] == "Running"
        assert runner._cdi_specs_for(ctx, uid), "the crash removed the running pod's CDI spec"

        plugin.start()
        plugin.wait_registered(after=registered)
        after, problems = runner.start(ctx, BY_NAME["one-gpu"])
        assert not problems, problems
        assert after.devices().isdisjoint(before.devices()), "a device was handed out twice"

        pod = ctx.kube.pod(before.namespace, old_pod)
        assert pod["status"]["phase"] == "Running"
        assert _container_ids(pod) == old_ids, "the running pod's container was restarted"
    finally:
        if not plugin.alive:
            plugin.start()
        # Deleting the pod prepared by the killed instance: unprepared by the new one.
        problems = runner.finish(ctx, before)
        if after is not None:
            problems += runner.finish(ctx, after)
    assert not problems, problems
