"""What ``/metrics`` adds to one prepare call, measured in-process without noise from the cluster.

Usage: ``.venv/bin/python bench/metrics_overhead.py [--calls N]``

Times N single-claim ``prepare`` calls through the kit's DRA service method over a driver that
does nothing, with no step and with the plugin's metrics as its step (counter, in-flight gauge,
latency histogram, per-claim counter), and one scrape of the registry. The difference per call
is the metrics' cost on prepare latency; ``bench/prepare.py --metrics`` shows it end to end,
where it is lost in the noise of a busy machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import generate_latest

from dra_gpu import metrics
from dra_gpu.kubeletplugin import dra_service
from dra_gpu.kubeletplugin.driver import PrepareResult, Step
from dra_gpu.pb import dra_v1_pb2


class Noop:
    def prepare(self, refs: Sequence[Any]) -> Mapping[Any, PrepareResult]:
        return {r.uid: PrepareResult() for r in refs}

    def unprepare(self, refs: Sequence[Any]) -> Mapping[Any, str]:
        return {r.uid: "" for r in refs}


def per_call_us(steps: Sequence[Step], calls: int) -> float:
    (method,) = [
        m
        for m in dra_service.methods(Noop(), steps)
        if m.path.endswith("v1.DRAPlugin/NodePrepareResources")
    ]
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(uid="a", namespace="ns", name="c")]
    )
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            method.handle(request, None)  # type: ignore[arg-type]
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    bare = per_call_us((), args.calls)
    m = metrics.PluginMetrics()
    m.watch_state(
        prepared=lambda: (3, 5),
        published=lambda: [("gpu", "HEALTHY")] * 8,
        checkpoint_writes=lambda: (12, 12),
    )
    wrapped = per_call_us((m,), args.calls)
    t0 = time.perf_counter()
    body = generate_latest(m.registry)
    scrape_ms = (time.perf_counter() - t0) * 1e3
    print(
        f"prepare through a no-op driver: bare {bare:.2f} us, with metrics {wrapped:.2f} us: "
        f"metrics add {wrapped - bare:.2f} us per call; one scrape {scrape_ms:.2f} ms "
        f"({len(body)} bytes)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
