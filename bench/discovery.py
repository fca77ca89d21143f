"""Discovery time per simulated profile, and the ResourceSlice build on top of it.

Usage: ``.venv/bin/python bench/discovery.py [--repeat N] [--nvml]``

For each built-in profile, prints the median and best of N runs of ``discover()`` +
``build_devices`` ("discover") and of ``build_resource_slices`` ("slices"). Target: h200x8
discovery under 20 ms. ``--nvml`` adds the real NVML backend (needs a GPU); its time is
dominated by the driver, not by our code.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_gpu import DRIVER_NAME
from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device, GpuBackend
from dra_gpu.kubeletplugin import slices

TARGET_MS = {"h200x8": 20.0}


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    samples: list[float] = []
    result: Any = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples), min(samples), result


def bench(name: str, backend: GpuBackend, repeat: int) -> None:
    def discover() -> list[Device]:
        return naming.build_devices(backend.discover().gpus)

    d_med, d_min, devices = timed(discover, repeat)

    def build() -> list[dict[str, Any]]:
        return slices.build_resource_slices(
            devices=devices,
            driver_name=DRIVER_NAME,
            node_name="bench-node",
            pool_generation=1,
            node_owner=("bench-node", "uid"),
        )

    s_med, s_min, objs = timed(build, repeat)
    target = TARGET_MS.get(name)
    verdict = "" if target is None else (" OK" if d_med < target else f" OVER {target:g} ms")
    print(
        f"{name:<12} devices={len(devices):<3} slices={len(objs)}  "
        f"discover median {d_med:7.3f} ms (best {d_min:.3f})  "
        f"slices median {s_med:7.3f} ms (best {s_min:.3f}){verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--nvml", action="store_true", help="also time the real NVML backend")
    args = parser.parse_args()
    for name, profile in simulated.BUILTIN_PROFILES.items():
        bench(
            name, simulated.SimulatedBackend(profile=profile, node_name="bench-node"), args.repeat
        )
    if args.nvml:
        from dra_gpu.devices import nvml

        bench("nvml", nvml.NvmlBackend(), max(1, args.repeat // 10))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
