"""Kubelet plugin start-up: process start -> ResourceSlices published, and memory after start.

Usage: ``.venv/bin/python bench/plugin_startup.py [--runs N] [--kubeconfig PATH --node NAME]``

Starts a local control plane (``e2e.cluster.Cluster``) unless ``--kubeconfig`` is given, registers
a node, and N times (default 5): deletes the node's slices, starts
``python -m dra_gpu kubelet-plugin --simulate h200x8`` and times from ``Popen`` to the moment a
watch on the API server sees the slice with all 8 devices. One second later it reads the
process's resident memory (VmRSS from /proc) and stops it with SIGTERM.

Targets: median start -> published under 1.5 s; RSS under 80 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dra_gpu import DRIVER_NAME  # noqa: E402

TARGET_START_S = 1.5
TARGET_RSS_MIB = 80.0
DEVICES = 8


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class SliceWatch:
    """Records when the node's pool first shows ``devices`` devices (a watch, not polling)."""

    def __init__(
        self, api: Any, node: str, *, driver: str = DRIVER_NAME, devices: int = DEVICES
    ) -> None:
        from kubernetes import client

        self._api = api
        self._resource = client.ResourceV1Api(api)
        self._selector = f"spec.nodeName={node},spec.driver={driver}"
        self._devices = devices
        self.seen_at: float | None = None
        self._done = threading.Event()

    def clear(self) -> str:
        """Delete the node's slices; returns the resourceVersion to watch from."""
        listed = self._resource.list_resource_slice(field_selector=self._selector)
        for item in listed.items:
            assert item.metadata is not None and item.metadata.name  # set on every stored object
            self._resource.delete_resource_slice(item.metadata.name)
        listed = self._resource.list_resource_slice(field_selector=self._selector)
        assert listed.metadata is not None  # a list always carries its resourceVersion
        return str(listed.metadata.resource_version)

    def start(self, resource_version: str) -> threading.Thread:
        self.seen_at = None
        self._done.clear()
        thread = threading.Thread(target=self._run, args=(resource_version,), daemon=True)
        thread.start()
        return thread

    def _run(self, resource_version: str) -> None:
        from kubernetes import watch

        w = watch.Watch()
        for event in w.stream(
            self._resource.list_resource_slice,
            field_selector=self._selector,
            resource_version=resource_version,
            timeout_seconds=60,
        ):
            obj = event["object"]
            published = len(obj.spec.devices or [])
            if event["type"] in ("ADDED", "MODIFIED") and published == self._devices:
                self.seen_at = time.monotonic()
                self._done.set()
                w.stop()
                return

    def wait(self, timeout: float) -> float | None:
        self._done.wait(timeout)
        return self.seen_at


def one_run(*, kubeconfig: Path, node: str, watcher: SliceWatch) -> tuple[float, float]:
    from e2e import procs
    from e2e.driver import PluginDirs, plugin_argv

    rv = watcher.clear()
    thread = watcher.start(rv)
    time.sleep(0.3)  # let the watch connect before the clock starts
    with tempfile.TemporaryDirectory(prefix="kpb-") as tmp:
        argv = plugin_argv(
            node_name=node,
            kubeconfig=kubeconfig,
            profile="h200x8",
            dirs=PluginDirs.under(Path(tmp)),
            extra=("--log-level", "WARNING"),
        )
        started = time.monotonic()
        proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
        try:
            seen = watcher.wait(30.0)
            if seen is None:
                raise RuntimeError("the slices did not appear within 30 s")
            time.sleep(1.0)
            rss = rss_mib(proc.pid)
        finally:
            procs.stop(proc, grace_s=10)
        thread.join(5)
    return seen - started, rss


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig`` and ``--node``: the cluster and node ``target`` uses."""
    parser.add_argument("--kubeconfig", type=Path, help="use this cluster instead of a new one")
    parser.add_argument(
        "--node", default="bench-node", help="node name (must exist with --kubeconfig)"
    )


@contextlib.contextmanager
def target(args: argparse.Namespace) -> Iterator[tuple[Path, str, Any]]:
    if args.kubeconfig:
        from kubernetes import config

        yield args.kubeconfig, args.node, config.new_client_from_config(str(args.kubeconfig))
        return
    from e2e.cluster import Cluster

    with Cluster() as cluster:
        cluster.register_node(args.node)
        api = cluster.api_client()
        try:
            yield cluster.kubeconfig, args.node, api
        finally:
            api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    add_target_arguments(parser)
    args = parser.parse_args()
    with target(args) as (kubeconfig, node, api):
        watcher = SliceWatch(api, node)
        runs = [
            one_run(kubeconfig=kubeconfig, node=node, watcher=watcher) for _ in range(args.runs)
        ]
    starts = [s for s, _ in runs]
    rss = [r for _, r in runs]
    print(f"load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("start -> slices published: " + ", ".join(f"{s:.3f}" for s in starts) + " s")
    med = statistics.median(starts)
    ok_start = "OK" if med < TARGET_START_S else "OVER TARGET"
    print(f"  median {med:.3f} s (target < {TARGET_START_S} s): {ok_start}")
    ok_rss = "OK" if max(rss) < TARGET_RSS_MIB else "OVER TARGET"
    print(f"RSS after start: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB "
          f"(target < {TARGET_RSS_MIB:.0f} MiB): {ok_rss}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
