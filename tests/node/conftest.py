"""Fixtures of the real-node tier: kubelet + containerd nodes, and the driver running on them.

Two real nodes (each its own kubelet, containerd and CNI bridge) so that every scenario has the
simulated hardware it needs: ``gpu-h200`` runs the plugin with ``h200x8`` (8 full GPUs) and
``gpu-a100`` with ``a100x4-mig`` (MIG devices). Both carry the label ``dra-gpu.test/real-node``,
which the suite adds as a node selector to every pod, so pods never land on a node that some other
test registered without a kubelet.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from collection_output import terminal_log

from e2e import procs
from e2e.cluster import Cluster
from e2e.deployed.env import REAL_NODE_SELECTOR
from e2e.driver import Driver, PluginProcess, controller_process
from e2e.images import node_images as images
from e2e.node.binaries import ensure_node_binaries
from e2e.node.cleanup import cgroup_hierarchies, mounts_under
from e2e.node.kubelet_node import Node
from e2e.suite.kube import Kube
from e2e.suite.runner import Context

NODE_TIER = Path(__file__).resolve().parent
NODE_PROFILES = {"gpu-h200": "h200x8", "gpu-a100": "a100x4-mig"}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build what a real node needs before any test runs, so no test's timeout pays for it:
    Debian packages, containerd + runc, and the local images (the root conftest builds the
    kubelet, with the other Kubernetes binaries)."""
    if session.config.option.collectonly:
        return
    if not any(NODE_TIER in Path(str(item.path)).resolve().parents for item in session.items):
        return
    with terminal_log(session):
        ensure_node_binaries()
        images.ensure_images(images.cache_dir())


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _report_on_failure(request: pytest.FixtureRequest, texts: list[str]) -> None:
    if request.session.testsfailed:
        for text in texts:
            print(text, file=sys.stderr)


@pytest.fixture(scope="session")
def real_nodes(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[dict[str, Node]]:
    if os.geteuid() != 0:
        pytest.skip("a real node (containerd, runc, kubelet, cgroups, mounts) needs root")
    nodes: dict[str, Node] = {}
    try:
        for name in NODE_PROFILES:
            nodes[name] = Node(cluster, name=name).up()
        yield nodes
    finally:
        _report_on_failure(request, [n.diagnostics() for n in nodes.values()])
        for node in nodes.values():
            node.down()
    # Teardown must leave nothing: no process (shim, container) mentioning a node's directory
    # or socket, no mount under it, no cgroup.
    left = [p for n in nodes.values() for p in procs.leftover_processes(n.paths.root)]
    mounts = [m for n in nodes.values() for m in mounts_under(n.paths.root, _mountinfo())]
    cgroups = [
        c
        for n in nodes.values()
        for h in cgroup_hierarchies()
        if (c := h / n.cgroup_root.lstrip("/")).exists()
    ]
    assert not (left or mounts or cgroups), f"left behind: {left} {mounts} {cgroups}"


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    return Kube(cluster.api_client())


@pytest.fixture(scope="session")
def driver(
    cluster: Cluster, real_nodes: dict[str, Node], kube: Kube, request: pytest.FixtureRequest
) -> Iterator[Driver]:
    any_node = next(iter(real_nodes.values()))
    free = procs.free_ports(2 * len(real_nodes) + 1)
    ports = dict(zip(["controller", *real_nodes], free[: len(real_nodes) + 1], strict=True))
    # /readyz of each plugin (``dra-gpu validate --plugin-readyz``: a plugin that is no pod).
    healthz = dict(zip(real_nodes, free[len(real_nodes) + 1 :], strict=True))

    def metrics_flag(name: str) -> tuple[str, str]:
        return ("--metrics-address", f"127.0.0.1:{ports[name]}")

    controller = controller_process(
        kubeconfig=cluster.kubeconfig,
        log_path=any_node.paths.logs / "controller.log",
        extra=metrics_flag("controller"),
    )
    plugins = {
        name: PluginProcess.for_node(
            node,
            kubeconfig=cluster.kubeconfig,
            profile=NODE_PROFILES[name],
            healthz_port=healthz[name],
            # GFD's labels on the Node, as the chart does (docs/user/node-pools.md).
            extra=(*metrics_flag(name), "--node-labels", "true"),
        )
        for name, node in real_nodes.items()
    }
    started = time.monotonic()
    try:
        controller.start()
        for plugin in plugins.values():
            plugin.start()
        drv = Driver(controller, plugins, ports)
        drv.wait_ready(kube)
        print(f"[driver] published in {time.monotonic() - started:.1f}s", file=sys.stderr)
        yield drv
    finally:
        _report_on_failure(
            request, [f"--- {p.name} ---\n{p.log_tail()}" for p in (controller, *plugins.values())]
        )
        for plugin in plugins.values():
            plugin.stop()
        controller.stop()


@pytest.fixture(scope="session")
def suite(kube: Kube, real_nodes: dict[str, Node], driver: Driver) -> Context:
    """The e2e suite's context, pointed at the real nodes (and their CDI directories)."""
    return Context(
        kube=kube,
        cdi_dirs=tuple(n.cdi_root for n in real_nodes.values()),
        node_selector=REAL_NODE_SELECTOR,
        log=lambda line: print(line, file=sys.stderr),
    )
