"""``dra-gpu explain`` over a large cluster: 1,250 simulated H200 nodes x 8 GPUs = 10,000 devices.

Usage: ``.venv/bin/python bench/explain.py [--nodes N] [--repeat N]``

Builds the ResourceSlices the plugin would publish for each node (same builder), a quarter of
the GPUs allocated to other claims, and explains a claim for 2 GPUs with three selectors
(product name, memory as a quantity, driver version as a semver). Each run starts cold: the
compiled-expression cache is emptied first, as in a fresh ``dra-gpu explain`` process.
Prints the median and best wall time of the analysis, and for comparison what one cel-python
evaluation costs without the per-value memo. Target: under 1 s for 10,000 devices.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_gpu import DRIVER_NAME
from dra_gpu.controller import classes
from dra_gpu.explain import analysis, cel
from dra_gpu.kube.objects import (
    DeviceClassSpec,
    DeviceRequestAllocationResult,
    ResourceClaim,
    ResourceSlice,
)
from e2e.sim_slices import node_slices

SELECTORS = (
    "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H200'",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0",
    "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('570.0.0'))",
)
TARGET_S = 1.0


def cluster(nodes: int) -> tuple[list[ResourceSlice], list[ResourceClaim]]:
    out: list[ResourceSlice] = []
    claims: list[ResourceClaim] = []
    for i in range(nodes):
        node = f"node-{i:05d}"
        out += cast("list[ResourceSlice]", node_slices(node, "h200x8"))  # the kit's plain dicts
        results: list[DeviceRequestAllocationResult] = [
            {"driver": DRIVER_NAME, "pool": node, "device": f"gpu-{g}", "request": "gpu"}
            for g in range(2)
        ]
        claims.append(
            {
                "metadata": {"namespace": "bench", "name": f"busy-{i}", "uid": f"u{i}"},
                "status": {"allocation": {"devices": {"results": results}}},
            }
        )
    return out, claims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    slice_objs, claims = cluster(args.nodes)
    device_classes = {
        c.name: cast(DeviceClassSpec, c.spec)  # the controller's plain dicts
        for c in classes.builtin_classes(extended_resource_name=None)
    }
    claim: ResourceClaim = {
        "metadata": {"namespace": "bench", "name": "three-selectors", "uid": "me"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "count": 2,
                            "selectors": [{"cel": {"expression": e}} for e in SELECTORS],
                        },
                    }
                ]
            }
        },
    }
    devices = sum(len(s["spec"]["devices"]) for s in slice_objs)
    samples = []
    report = None
    for _ in range(args.repeat):
        cel.compiled.cache_clear()
        t0 = time.perf_counter()
        report = analysis.explain_claim(
            claim, classes=device_classes, slices=slice_objs, claims=claims
        )
        samples.append(time.perf_counter() - t0)
    assert report is not None
    print(
        f"explain: {devices} devices on {args.nodes} nodes, {len(SELECTORS)} claim selectors "
        f"+ class selector: median {statistics.median(samples):.3f} s, "
        f"best {min(samples):.3f} s (target < {TARGET_S} s); fits on {len(report.fits)} nodes"
    )
    views = analysis.devices_of(slice_objs[:25])
    selector = cel.Selector(SELECTORS[1])
    t0 = time.perf_counter()
    for d in views:
        selector._evaluate(d.view)  # the cost the memo avoids: one full evaluation a device
    per = (time.perf_counter() - t0) / len(views)
    checks = devices * (len(SELECTORS) + 1)
    print(
        f"one cel-python evaluation without the memo: {per * 1000:.3f} ms "
        f"(x {checks} checks = {per * checks:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
