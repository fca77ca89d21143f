"""``python -m e2e.gpu.telemetry_demo``: the plugin's GPU telemetry on a real GPU, two "pods"
time-slicing it (nothing of the GPU's settings is changed; run as root).

1. The first full GPU is found with the plugin's NVML backend.
2. Two CUDA processes (``loadcheck.cu``, compiled with ``nvcc``) start in cgroups named as the
   kubelet names a pod's (``.../kubepods/besteffort/pod<uid>/...``, cgroup v2): one keeps the
   SMs busy with 776 MiB, one holds 1,544 MiB and sleeps.
3. The plugin's telemetry loop (``plugin.telemetry`` over ``devices.nvml_usage``, what the
   plugin runs with ``--metrics-address``) samples every ``--interval`` seconds; one claim
   shared by the two pods (as a checkpoint record and a claim whose ``reservedFor`` names them)
   holds the GPU, ``--idle-after`` 60 s.
4. Prints each pass's pod rows, the ``GpuIdle`` Events the loop would post, the exported series
   and the ``dra-gpu top`` table.

Exits 0 only if: each pod's memory is its own, the busy pod has an SM share and the idle pod
none, the idle pod gets ``GpuIdle`` and the busy pod and the claim do not.
Also: ``python bench/telemetry.py --nvml`` for the CPU time of a pass on this machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from dra_gpu.devices import naming
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.devices.nvml_usage import NvmlUsageSampler
from dra_gpu.plugin import telemetry
from dra_gpu.plugin.claim_pods import ClaimPods
from dra_gpu.plugin.telemetry_metrics import TelemetryCollector
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, ClaimRecord, DeviceRecord
from dra_gpu.top import rows, source

SOURCE = Path(__file__).with_name("loadcheck.cu")
CGROUP_ROOT = Path("/sys/fs/cgroup/dra-gpu-telemetry-demo/kubepods/besteffort")
NODE = "h200-demo"
MIB = 1 << 20


def say(line: str) -> None:
    print(f"[telemetry-demo] {line}", flush=True)


def in_pod_cgroup(pod_uid: str, argv: list[str]) -> subprocess.Popen[str] | None:
    """``argv`` started inside a cgroup named after ``pod_uid`` as the kubelet would; None when
    this machine's cgroups cannot be written."""
    group = CGROUP_ROOT / f"pod{pod_uid}" / "main"
    try:
        group.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        say(f"cannot create {group}: {err}")
        return None
    script = f'echo $$ > {group}/cgroup.procs && exec "$@"'
    return subprocess.Popen(["sh", "-c", script, "sh", *argv], text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--idle-after", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=100.0, help="how long the pods run")
    args = parser.parse_args()

    gpus = [d for d in naming.build_devices(NvmlBackend().discover().gpus) if d.mig is None]
    if not gpus:
        say("no full GPU found")
        return 1
    gpu = gpus[0]
    say(f"GPU {gpu.name} {gpu.uuid} ({gpu.gpu.product_name})")
    tmp = Path(tempfile.mkdtemp(prefix="tl-demo-"))
    binary = tmp / "loadcheck"
    subprocess.run(["nvcc", "-O2", "-o", str(binary), str(SOURCE)], check=True)

    busy_uid, idle_uid, claim_uid = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    seconds = str(args.seconds)
    busy_argv = [str(binary), "busy", seconds, "776"]
    idle_argv = [str(binary), "idle", seconds, "1544"]
    started = [in_pod_cgroup(busy_uid, busy_argv), in_pod_cgroup(idle_uid, idle_argv)]
    pod_of = None  # the plugin's way: the pod UID in /proc/<pid>/cgroup
    if any(p is None for p in started):
        # A machine whose cgroups are read-only here (a container): the processes run as they
        # are and are mapped to the pods by PID, so the cgroup reading is not exercised.
        say("FALLBACK: processes mapped to pods by PID, not by cgroup")
        for p in started:
            if p is not None:
                p.kill()
        busy, idle = subprocess.Popen(busy_argv, text=True), subprocess.Popen(idle_argv, text=True)
        started = [busy, idle]
        pod_of = {busy.pid: busy_uid, idle.pid: idle_uid}.get
    procs = [p for p in started if p is not None]
    claim = {
        "metadata": {"namespace": "demo", "name": "shared", "uid": claim_uid},
        "status": {
            "reservedFor": [
                {"resource": "pods", "name": "busy", "uid": busy_uid},
                {"resource": "pods", "name": "idle", "uid": idle_uid},
            ]
        },
    }
    record = ClaimRecord(
        state=PREPARE_COMPLETED,
        namespace="demo",
        name="shared",
        devices=(
            DeviceRecord(
                pool=NODE,
                device=gpu.name,
                config={"sharing": {"strategy": "TimeSlicing"}},
            ),
        ),
    )
    posted: list[tuple[str, str, str]] = []

    def post(involved: Mapping[str, str], message: str) -> None:
        posted.append((involved["kind"], involved["name"], message))
        say(f"Event GpuIdle on {involved['kind']} {involved['name']}: {message}")

    loop = telemetry.Telemetry(
        node=NODE,
        sampler=NvmlUsageSampler(pod_of=pod_of),
        devices=lambda: [gpu],
        claims=lambda: {claim_uid: record},
        pods=ClaimPods(lambda ns, name: claim),  # type: ignore[arg-type,return-value]
        interval_s=args.interval,
        idle=telemetry.IdleSettings(args.idle_after),
        post=post,
    )
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(lambda: loop.snapshot))
    time.sleep(5)  # CUDA contexts up
    seen: dict[str, tuple[int | None, float | None]] = {}
    deadline = time.monotonic() + min(args.seconds - 10, args.idle_after + 4 * args.interval)
    while time.monotonic() < deadline:
        snap = loop.run_once()
        for row in snap.view.pods:
            name = row.labels["pod_name"] or row.pod_uid or "(no pod)"
            seen[name] = (row.memory_bytes, row.utilization_ratio)
            say(
                f"pass {snap.passes}: pod {name}: {row.processes} processes, "
                f"{(row.memory_bytes or 0) // MIB} MiB, SM share {row.utilization_ratio}"
            )
        for d in snap.view.devices:
            u = d.usage
            say(
                f"pass {snap.passes}: {d.device.name}: util {u.utilization_ratio}, "
                f"{(u.memory_used_bytes or 0) // MIB} MiB, {u.temperature_celsius} C, "
                f"{u.power_watts} W, pass CPU {snap.last_pass_s * 1e3:.1f} ms {u.error}"
            )
        time.sleep(args.interval)
    text = generate_latest(registry).decode()
    print("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    print(rows.table(rows.build_rows(source.parse_text(text), namespace=None, node=None)))
    for p in procs:
        p.kill()
        p.wait()
    loop.close_sampler()
    top = CGROUP_ROOT.parent.parent
    for group in [*sorted(top.rglob("*"), reverse=True), top] if top.exists() else []:
        if group.is_dir():
            group.rmdir()  # empty once its process is gone
    checks = {
        "busy pod's memory is its own (776 MiB)": (seen.get("busy", (0, 0))[0] or 0) // MIB >= 776,
        "idle pod's memory is its own (1544 MiB)": (seen.get("idle", (0, 0))[0] or 0) // MIB
        >= 1544,
        "busy pod has an SM share": (seen.get("busy", (0, 0.0))[1] or 0.0) > 0.05,
        "idle pod has none": (seen.get("idle", (0, 1.0))[1] or 0.0) < 0.01,
        "idle pod got GpuIdle": any(k == "Pod" and n == "idle" for k, n, _ in posted),
        "busy pod and the claim did not": not any(n in ("busy", "shared") for _, n, _ in posted),
    }
    for what, ok in checks.items():
        say(f"{'OK  ' if ok else 'FAIL'} {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
