"""Where a prepare + unprepare cycle spends its CPU inside the plugin, without gRPC or the API.

Usage: ``.venv/bin/python bench/prepare_profile.py [--cycles N] [--dir PATH] [--top K]``

Runs ``DeviceState.prepare`` then ``unprepare`` of one single-device claim, N times, on a
simulated ``h200x8`` node whose claims come from memory (the API round trip, the gRPC server
and the kubelet's client are left out: ``bench/reference.py`` measures the whole call). The
checkpoint and the CDI specs go under ``--dir`` (default: a temp directory, i.e. the disk the
plugin's state would be on; give a tmpfs such as ``/dev/shm`` to see the CPU without the file
system's journal). Logging runs at INFO into ``/dev/null``, formatted as the plugin does. Every
write, the checkpoint's fsynced one included, is done on the calling thread before the call
returns (no thread writes on behind it), so CPU and wall time per cycle hold all of a cycle's
work.

Prints CPU per cycle (user, system: ``os.times``; the least of 5 blocks of N/5 cycles, and
the median) and wall time per cycle, then, with
``--top K``, the K functions with the most own time over a second, profiled, run of N cycles;
with ``--steps``, the CPU per cycle of each step of the cycle (:data:`STEPS`: the profiler
clocked by the process's CPU time, cumulative per function, so a step includes what it calls;
the profiler's own cost inflates them all alike, so read them as shares of the profiled total).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_gpu import DRIVER_NAME
from dra_gpu.devices.naming import build_devices
from dra_gpu.devices.profiles import resolve_profile
from dra_gpu.devices.simulated import SimulatedBackend
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import node_facts
from dra_gpu.prepare.plan import ClaimRef
from dra_gpu.prepare.state import DeviceState, StateSettings

# The steps of a cycle, as (label, module file, function): each the frame where a step starts.
STEPS = (
    ("prepare, whole", "prepare/state.py", "prepare"),
    ("  plan the claim", "prepare/plan.py", "plan_claim"),
    ("  build the CDI spec", "prepare/state.py", "_spec"),
    ("  metadata files", "prepare/device_metadata.py", "write"),
    ("  CDI spec file", "prepare/cdi.py", "write_encoded"),
    ("unprepare, whole", "prepare/state.py", "unprepare"),
    ("  metadata files removed", "prepare/device_metadata.py", "remove"),
    ("  CDI spec removed", "prepare/cdi.py", "remove_spec"),
    ("checkpoint commits (both)", "prepare/checkpoint.py", "_commit"),
    ("logging (both)", "logging/__init__.py", "_log"),
)
NODE = "bench-node"
CLAIMS = 8
BLOCKS = 5


class MemoryClaims:
    """``state.ClaimFetcher`` answering from a dict, as the API server's JSON would."""

    def __init__(self, claims: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        self._claims = claims

    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        # The benchmark's stand-in for the API server's JSON.
        return cast("ResourceClaim | None", self._claims.get((namespace, name)))


def claim_json(uid: str, name: str, device: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER_NAME, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result], "config": []}}},
    }


def make_state(root: Path) -> tuple[DeviceState, list[ClaimRef]]:
    gpus = SimulatedBackend(profile=resolve_profile("h200x8"), node_name=NODE).discover().gpus
    devices = {d.name: d for d in build_devices(gpus)}
    refs = [
        ClaimRef(
            uid=ClaimUID(f"00000000-0000-4000-8000-{i:012d}"), namespace="default", name=f"c{i}"
        )
        for i in range(CLAIMS)
    ]
    claims = {
        (r.namespace, r.name): claim_json(r.uid, r.name, f"gpu-{i}") for i, r in enumerate(refs)
    }
    settings = StateSettings(
        driver_name=DRIVER_NAME,
        node_name=NODE,
        cdi_root=root / "cdi",
        state_dir=root / "state",
    )
    state = DeviceState(
        settings=settings,
        node_facts=node_facts.simulated,
        inventory=lambda: devices,
        claims=MemoryClaims(claims),
    )
    state.start()
    return state, refs


def cycles(state: DeviceState, refs: list[ClaimRef], n: int) -> None:
    for i in range(n):
        ref = refs[i % len(refs)]
        error = state.prepare([ref])[ref.uid].error
        if error:
            raise RuntimeError(error)
        error = state.unprepare([ref])[ref.uid]
        if error:
            raise RuntimeError(error)


def print_steps(state: DeviceState, refs: list[ClaimRef], n: int) -> None:
    """CPU per cycle of each of :data:`STEPS`, from a profile clocked by process CPU time."""
    profile = cProfile.Profile(time.process_time)
    profile.runcall(cycles, state, refs, n)
    # pstats' table: (file, line, function) -> (calls, primitive calls, own, cumulative, callers)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in table.values()) * 1e3 / n
    print(f"CPU per cycle by step, profiled (total {total:.3f} ms per cycle under the profiler):")
    for label, module, function in STEPS:
        cumulative = sum(
            entry[3]
            for (path, _line, name), entry in table.items()
            if name == function and path.endswith(module)
        )
        ms = cumulative * 1e3 / n
        print(f"  {label:<28} {ms:7.3f} ms  {100 * ms / total:5.1f} %")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None, help="where state and specs go")
    parser.add_argument("--top", type=int, default=0, help="show the K costliest functions")
    parser.add_argument("--steps", action="store_true", help="CPU per cycle of each step")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=open(os.devnull, "w"),  # noqa: SIM115 (lives as long as the process)
    )
    with tempfile.TemporaryDirectory(prefix="pp-", dir=args.dir) as tmp:
        state, refs = make_state(Path(tmp))
        cycles(state, refs, 20)  # warm-up
        # Blocks, and the least CPU of them: on a shared machine other processes' load only
        # ever adds (cache misses, preemption), so the least is the closest to the code's own.
        n = max(1, args.cycles // BLOCKS)
        cpu: list[tuple[float, float, float, float]] = []
        for _ in range(BLOCKS):
            t0, w0 = os.times(), time.perf_counter()
            cycles(state, refs, n)
            t1, w1 = os.times(), time.perf_counter()
            user, system = (t1.user - t0.user) * 1e3 / n, (t1.system - t0.system) * 1e3 / n
            cpu.append((user + system, user, system, (w1 - w0) * 1e3 / n))
        best = min(cpu)
        median_cpu = statistics.median(c[0] for c in cpu)
        print(
            f"{n * BLOCKS} cycles in {tmp} (load {os.getloadavg()[0]:.2f} on {os.cpu_count()} "
            f"CPUs): CPU per cycle, least of {BLOCKS} blocks: {best[0]:.3f} ms (user "
            f"{best[1]:.3f}, system {best[2]:.3f}), median {median_cpu:.3f}"
            f" ms; wall per cycle, median {statistics.median(c[3] for c in cpu):.3f} ms"
        )
        if args.top:
            profile = cProfile.Profile()
            profile.runcall(cycles, state, refs, n)
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        if args.steps:
            print_steps(state, refs, n)
        state.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
