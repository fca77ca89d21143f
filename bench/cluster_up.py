"""How long the local control plane takes: cold build of the binaries, and ``up`` to ready.

``.venv/bin/python bench/cluster_up.py [--runs N]``

- Cold build: if any control-plane binary is missing it is built now and timed; otherwise the
  durations recorded beside the binaries when they were built (``build-times.json``) are reported.
- Up to ready: ``Cluster.up()`` with cached binaries (certificates, etcd, API server ready,
  controller-manager and scheduler healthy, default ServiceAccount present), N times; the median,
  the spread and the per-component breakdown of the median run are printed.
  Target: under 20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from e2e import binaries, procs
from e2e.cluster import Cluster

TARGET_S = 20.0


def report_build(versions: binaries.Versions) -> None:
    todo = binaries.missing(binaries.CONTROL_PLANE, versions)
    if todo:
        start = time.monotonic()
        binaries.ensure(binaries.CONTROL_PLANE, versions=versions)
        print(f"cold build (now) of {', '.join(todo)}: {time.monotonic() - start:.0f} s")
        return
    # Components built together share one record: count each build once.
    seen: dict[float, list[str]] = {}
    for name in binaries.CONTROL_PLANE:
        seconds = binaries.recorded_build_seconds(name, versions)
        if seconds is not None:
            seen.setdefault(seconds, []).append(name)
    for seconds, names in seen.items():
        print(f"recorded build of {', '.join(names)}: {seconds:.0f} s")
    total = sum(seen)
    print(f"cold build, control plane (recorded): {total:.0f} s ({total / 60:.1f} min)")
    kubelet = binaries.recorded_build_seconds("kubelet", versions)
    if kubelet is not None:
        print(f"recorded build of kubelet (cgo, not needed by the control plane): {kubelet:.0f} s")


def measure_up(runs: int) -> None:
    results: list[tuple[float, float, dict[str, float]]] = []
    for i in range(runs):
        cluster = Cluster(log=lambda _line: None)
        start = time.monotonic()
        try:
            cluster.up()
            up_s = time.monotonic() - start
            start = time.monotonic()
        finally:
            cluster.down()
        down_s = time.monotonic() - start
        left = procs.leftover_processes(cluster.workdir)
        print(f"run {i + 1}: up {up_s:.1f} s, down {down_s:.1f} s, processes left: {len(left)}")
        results.append((up_s, down_s, dict(cluster.startup_seconds)))
    ups = sorted(r[0] for r in results)
    median = statistics.median(ups)
    verdict = "within" if median < TARGET_S else "OVER"
    print(
        f"up to ready, binaries cached: median {median:.1f} s over {runs} runs "
        f"(min {ups[0]:.1f}, max {ups[-1]:.1f}); {verdict} the {TARGET_S:.0f} s target"
    )
    phases = min(results, key=lambda r: abs(r[0] - median))[2]
    print(
        "  ready at (s after first process start): "
        + ", ".join(f"{k} {v}" for k, v in phases.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    versions = binaries.Versions.from_env()
    print(f"Kubernetes {versions.k8s}, etcd {versions.etcd}, cache {binaries.cache_root()}")
    report_build(versions)
    measure_up(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
