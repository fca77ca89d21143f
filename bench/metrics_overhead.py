"""What ``/metrics`` adds to one prepare call, measured in-process without noise from the cluster.

Usage: ``.venv/bin/python bench/metrics_overhead.py [--calls N]``

Times N single-claim ``prepare`` calls through a handler that does nothing, bare and wrapped
in the plugin's metrics (counter, in-flight gauge, latency histogram, per-claim counter), and
one scrape of the registry. The difference per call is the metrics' cost on prepare latency;
``bench/prepare.py --metrics`` shows it end to end, where it is lost in the noise of a busy
machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import generate_latest

from dra_gpu import metrics


@dataclass(frozen=True)
class Ref:
    uid: str


@dataclass(frozen=True)
class Result:
    error: str = ""
    kind: str = ""


class Noop:
    def prepare(self, refs: Sequence[Any]) -> Mapping[Any, Any]:
        return {r.uid: Result() for r in refs}

    def unprepare(self, refs: Sequence[Any]) -> Mapping[Any, str]:
        return {r.uid: "" for r in refs}


def per_call_us(handler: Any, calls: int) -> float:
    refs = [Ref("a")]
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            handler.prepare(refs)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    bare = per_call_us(Noop(), args.calls)
    m = metrics.PluginMetrics()
    m.watch_state(
        prepared=lambda: (3, 5),
        published=lambda: [("gpu", "HEALTHY")] * 8,
        checkpoint_writes=lambda: (12, 12),
    )
    wrapped = per_call_us(m.measured(Noop()), args.calls)
    t0 = time.perf_counter()
    body = generate_latest(m.registry)
    scrape_ms = (time.perf_counter() - t0) * 1e3
    print(
        f"prepare through a no-op handler: bare {bare:.2f} us, with metrics {wrapped:.2f} us: "
        f"metrics add {wrapped - bare:.2f} us per call; one scrape {scrape_ms:.2f} ms "
        f"({len(body)} bytes)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
