"""CPU time of one GPU telemetry pass of the kubelet plugin, in-process.

Usage: ``.venv/bin/python bench/telemetry.py [--passes N] [--gpus G] [--nvml]``

Simulated (default): G simulated H200s (8), each held by a prepared claim (a real checkpoint
file in a temporary state directory) and busy with two processes of two pods (the usage file
of simulated GPUs, rewritten before every pass so it is parsed every time, the worst case);
one pass = sample, join with the checkpoint's claims and the pods, idle tracking, and one
scrape of the series. Prints the median and p90 CPU milliseconds of a pass and of a scrape.
No NVML: the NVML calls' own cost needs a GPU machine.

``--nvml``: the same pass over this machine's real GPUs through NVML (no claims), after one
discovery; run it on a GPU node (the figure for the H200 comes from there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, generate_latest

from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device
from dra_gpu.devices.usage import UsageSampler
from dra_gpu.plugin import telemetry
from dra_gpu.plugin.claim_pods import ClaimPods
from dra_gpu.plugin.telemetry_metrics import TelemetryCollector
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
)

NODE = "bench-node"


def simulated_devices(gpus: int) -> list[Device]:
    profile = simulated.SimProfile(
        name="bench",
        gpus=tuple(simulated.SimGpu("H200-141GB", *simulated.default_pci(i)) for i in range(gpus)),
    )
    backend = simulated.SimulatedBackend(profile=profile, node_name=NODE)
    return naming.build_devices(backend.discover().gpus)


def pod_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def claim(i: int, device: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": "bench", "name": f"claim-{i}", "uid": f"uid-{i}"},
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": f"pod-{i}-{j}", "uid": pod_uid(2 * i + j)}
                for j in range(2)
            ]
        },
    }


def measure(
    sampler: UsageSampler,
    devices: Sequence[Device],
    state: Path,
    passes: int,
    before_pass: Callable[[int], None],
) -> tuple[list[float], list[float]]:
    store = CheckpointStore(state)
    records = {
        f"uid-{i}": ClaimRecord(
            state=PREPARE_COMPLETED,
            namespace="bench",
            name=f"claim-{i}",
            devices=(DeviceRecord(pool=NODE, device=d.name, config={}),),
        )
        for i, d in enumerate(devices)
    }

    def prepared(checkpoint: Checkpoint) -> Checkpoint:
        for uid, record in records.items():
            checkpoint = checkpoint.with_claim(uid, record)
        return checkpoint

    store.update(prepared, durable=False)
    claims = {f"claim-{i}": claim(i, d.name) for i, d in enumerate(devices)}
    loop = telemetry.Telemetry(
        node=NODE,
        sampler=sampler,
        devices=lambda: devices,
        claims=lambda: store.load().claims,
        pods=ClaimPods(lambda ns, name: claims.get(name)),  # type: ignore[arg-type,return-value]
        idle=telemetry.IdleSettings(1800.0),
        post=lambda involved, message: None,
    )
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: loop.snapshot))
    pass_ms, scrape_ms = [], []
    for n in range(passes + 1):
        before_pass(n)
        t0 = time.process_time()
        loop.run_once()
        t1 = time.process_time()
        generate_latest(registry)
        t2 = time.process_time()
        if n:  # the first pass reads the claims and warms the caches
            pass_ms.append((t1 - t0) * 1e3)
            scrape_ms.append((t2 - t1) * 1e3)
    sampler.close()
    return pass_ms, scrape_ms


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nvml", action="store_true", help="this machine's GPUs through NVML")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tl-") as tmp:
        state = Path(tmp)
        if args.nvml:
            from dra_gpu.devices.nvml import NvmlBackend
            from dra_gpu.devices.nvml_usage import NvmlUsageSampler

            devices = naming.build_devices(NvmlBackend().discover().gpus)
            what = f"{len(devices)} real GPU devices through NVML"
            sampler: UsageSampler = NvmlUsageSampler()

            def before(n: int) -> None:
                pass
        else:
            from dra_gpu.devices.simulated_usage import FILE_NAME, SimulatedUsageSampler

            devices = simulated_devices(args.gpus)
            what = f"{len(devices)} simulated H200s, 2 pods with a process each per GPU"
            usage_file = state / FILE_NAME
            sampler = SimulatedUsageSampler(usage_file)

            def before(n: int) -> None:
                usage = {
                    d.name: {
                        "utilization": (n % 10) / 10,
                        "processes": [
                            {
                                "pid": 100 + 2 * i + j,
                                "podUID": pod_uid(2 * i + j),
                                "memoryBytes": (j + 1) << 30,
                                "utilization": 0.05 * j,
                            }
                            for j in range(2)
                        ],
                    }
                    for i, d in enumerate(devices)
                }
                usage_file.write_text(json.dumps({"devices": usage}))

        pass_ms, scrape_ms = measure(sampler, devices, state, args.passes, before)
    print(f"telemetry pass over {what} (n={len(pass_ms)}):")
    print(f"  pass CPU: median {statistics.median(pass_ms):.2f} ms, p90 {p90(pass_ms):.2f} ms")
    print(
        f"  scrape CPU: median {statistics.median(scrape_ms):.2f} ms, p90 {p90(scrape_ms):.2f} ms"
    )
    print(f"  at the default 10 s interval: {statistics.median(pass_ms) / 100:.3f} % of one core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
