"""Device health: injected event -> taint visible in the API server, p50 over N (default 20).

Usage: ``.venv/bin/python bench/taint_latency.py [--runs N] [--kubeconfig PATH --node NAME]``

Starts a local control plane (``e2e.cluster.Cluster``) unless ``--kubeconfig`` is given,
registers a node, and runs ``python -m dra_gpu kubelet-plugin --simulate h200x8`` on it (no
kubelet: only its ResourceSlices matter here). Each run appends an XID 79 event for one GPU to
the plugin's command file (what ``dra-gpu health inject`` writes) and times until a watch on the
API server sees that device's taint; then it clears the GPU (``dra-gpu health clear``) and
waits until the taint is gone before the next run. The time includes the plugin's file poll
(every 0.2 s), the slice update and the watch delivery.

Target: p50 under 1 s.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plugin_startup import add_target_arguments, target  # noqa: E402
from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.devices import health_events  # noqa: E402

TARGET_P50_S = 1.0
GPUS = 8


class TaintWatch:
    """Hands over (time seen, tainted device names) for every change of the node's slices."""

    def __init__(self, api: Any, node: str) -> None:
        from kubernetes import client

        self._resource = client.ResourceV1Api(api)
        self._selector = f"spec.nodeName={node},spec.driver={DRIVER_NAME}"
        self.seen: queue.Queue[tuple[float, frozenset[str]]] = queue.Queue()
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop.is_set():  # the API server going away at the end is no news
                raise

    def _watch(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            w = watch.Watch()
            for event in w.stream(
                self._resource.list_resource_slice,
                field_selector=self._selector,
                timeout_seconds=30,
            ):
                now = time.monotonic()
                devices = event["object"].spec.devices or []
                tainted = frozenset(d.name for d in devices if d.taints)
                self.seen.put((now, tainted))
                if self._stop.is_set():
                    w.stop()

    def wait_until(self, want: frozenset[str], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the watch did not see tainted devices {set(want)} in time")
            try:
                at, tainted = self.seen.get(timeout=left)
            except queue.Empty:
                continue
            if tainted == want:
                return at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    add_target_arguments(parser)
    args = parser.parse_args()
    from e2e import procs
    from e2e.driver import PluginDirs, plugin_argv

    times: list[float] = []
    with target(args) as (kubeconfig, node, api), tempfile.TemporaryDirectory(prefix="tl-") as tmp:
        dirs = PluginDirs.under(Path(tmp))
        commands = dirs.state / health_events.FILE_NAME
        argv = plugin_argv(
            node_name=node,
            kubeconfig=kubeconfig,
            profile="h200x8",
            dirs=dirs,
            extra=("--log-level", "ERROR"),  # each taint is a WARNING: not for the figures
        )
        proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True)
        watch = TaintWatch(api, node)
        try:
            watch.start()
            watch.wait_until(frozenset(), timeout=60)  # published, nothing tainted
            time.sleep(0.5)  # past the plugin's first read of the command file
            for run in range(args.runs):
                device = f"gpu-{run % GPUS}"
                started = time.monotonic()
                health_events.append(commands, health_events.Injected(device, "xid", 79))
                times.append(watch.wait_until(frozenset({device}), timeout=30) - started)
                health_events.append(commands, health_events.Clear(device))
                watch.wait_until(frozenset(), timeout=30)
        finally:
            watch.stop()
            procs.stop(proc, grace_s=10)
    print(f"load average at end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print("injected event -> taint in the API server: " + ", ".join(f"{t:.3f}" for t in times))
    p50 = statistics.median(times)
    verdict = "OK" if p50 < TARGET_P50_S else "OVER TARGET"
    print(f"  p50 {p50:.3f} s, max {max(times):.3f} s over {len(times)} (target p50 < "
          f"{TARGET_P50_S} s): {verdict}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
