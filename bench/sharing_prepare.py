"""Prepare latency with GPU sharing applied: MPS (daemon start included) and time-slicing.

Usage: ``.venv/bin/python bench/sharing_prepare.py [--strategy mps|timeslicing|share|none]
[--cycles N] [--backend simulated|nvml] [--runner record|process]``

In-process, no API server: the plugin's prepare transaction (``DeviceState``: plan, sharing
applied, CDI spec, checkpoint) for one claim on ``gpu-0`` whose ``GpuConfig`` asks for the
strategy, then its unprepare (sharing undone), N times; p50 and p99 of each. ``share``: the
claim is a consumable share of 40Gi of the GPU (``shareID`` and ``consumedCapacity`` in its
result, no config), so prepare gives it an MPS daemon limited to 40Gi; compare with ``none``
(the whole GPU). The claim is
served from memory, so the figures are the node's own work plus the tools' time.

``--runner record`` (default) records the ``nvidia-smi`` / ``nvidia-cuda-mps-control`` commands as
a simulated node does; ``--runner process`` runs them (with ``--backend nvml`` on a GPU machine:
a real MPS daemon per cycle). Time-slicing with ``--runner process`` changes the GPU's setting
and is refused unless ``--apply-timeslice`` is given (never on a machine you do not own).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dra_gpu import DRIVER_NAME  # noqa: E402
from dra_gpu.kube.objects import ResourceClaim  # noqa: E402
from dra_gpu.kubeletplugin.ids import ClaimUID  # noqa: E402
from dra_gpu.plugin import inventory, platforms  # noqa: E402
from dra_gpu.prepare import node_facts  # noqa: E402
from dra_gpu.prepare.plan import ClaimRef  # noqa: E402
from dra_gpu.prepare.sharing.applied import Sharing, Switches, recording_path  # noqa: E402
from dra_gpu.prepare.sharing.runner import ProcessRunner, RecordingRunner, Runner  # noqa: E402
from dra_gpu.prepare.state import DeviceState, StateSettings  # noqa: E402

NODE = "bench-node"
SHARING = {
    "mps": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    "timeslicing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}


class Claims:
    """The claim source: claim ``bench-<i>`` (UID ``uid-<i>``) allocated ``device``, as the API
    server would return it. A claim per cycle, as pods come and go (each MPS daemon its own)."""

    def __init__(
        self, device: str, sharing: Mapping[str, Any] | None, consumed: Mapping[str, str] | None
    ) -> None:
        config = []
        if sharing is not None:
            parameters = {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": dict(sharing),
            }
            config = [
                {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
            ]
        result: dict[str, Any] = {"request": "gpu", "driver": DRIVER_NAME, "pool": NODE}
        result["device"] = device
        if consumed is not None:
            result |= {"shareID": "share-1", "consumedCapacity": dict(consumed)}
        self.body = {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [result],
                        "config": config,
                    }
                }
            },
        }

    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        uid = name.replace("bench-", "uid-")
        # The benchmark's stand-in for the API server's JSON.
        return cast(
            ResourceClaim,
            {"metadata": {"uid": uid, "namespace": namespace, "name": name}, **self.body},
        )


def quantile(values: Sequence[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--strategy", choices=("mps", "timeslicing", "share", "none"), default="mps")
    p.add_argument("--cycles", type=int, default=50)
    p.add_argument("--backend", choices=("simulated", "nvml"), default="simulated")
    p.add_argument("--runner", choices=("record", "process"), default="record")
    p.add_argument("--apply-timeslice", action="store_true")
    args = p.parse_args(argv)
    if args.strategy == "timeslicing" and args.runner == "process" and not args.apply_timeslice:
        p.error("time-slicing with --runner process changes the GPU: add --apply-timeslice")
    simulate = "h200x8" if args.backend == "simulated" else None
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=simulate, node_name=NODE))
    )
    by_name = {d.name: d for d in devices}
    gpu = next(d.name for d in devices if d.type == "gpu")
    root = Path(tempfile.mkdtemp(prefix="sharing-bench-"))
    state_dir = root / "state"
    runner: Runner = (
        RecordingRunner(recording_path(state_dir)) if args.runner == "record" else ProcessRunner()
    )
    state = DeviceState(
        settings=StateSettings(
            driver_name=DRIVER_NAME,
            node_name=NODE,
            cdi_root=root / "cdi",
            state_dir=state_dir,
        ),
        # CDI content as on a simulated node: the figure is sharing's cost
        node_facts=node_facts.simulated,
        inventory=lambda: by_name,
        claims=Claims(
            gpu,
            SHARING.get(args.strategy),
            {"memory": "40Gi"} if args.strategy == "share" else None,
        ),
        boot_id=lambda: "bench",
        sharing=Sharing(
            runner=runner, state_dir=state_dir, switches=Switches(time_slicing=True, mps=True)
        ),
    )
    state.start()
    prepare_ms, unprepare_ms = [], []
    for i in range(args.cycles):
        ref = ClaimRef(uid=ClaimUID(f"uid-{i}"), namespace="default", name=f"bench-{i}")
        t0 = time.perf_counter()
        result = state.prepare([ref])[ref.uid]
        t1 = time.perf_counter()
        if result.error:
            print(f"prepare failed: {result.error}", file=sys.stderr)
            return 1
        error = state.unprepare([ref])[ref.uid]
        t2 = time.perf_counter()
        if error:
            print(f"unprepare failed: {error}", file=sys.stderr)
            return 1
        prepare_ms.append((t1 - t0) * 1000)
        unprepare_ms.append((t2 - t1) * 1000)
    state.close()
    figures = {
        "strategy": args.strategy,
        "backend": args.backend,
        "runner": args.runner,
        "device": gpu,
        "cycles": args.cycles,
        "prepare_ms": {"p50": quantile(prepare_ms, 0.5), "p99": quantile(prepare_ms, 0.99)},
        "unprepare_ms": {"p50": quantile(unprepare_ms, 0.5), "p99": quantile(unprepare_ms, 0.99)},
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
