"""``python -m e2e.gpu.shares_demo``: consumable shares enforced on a real GPU by MPS.

On a machine with an NVIDIA GPU (nothing of the GPU's settings is changed: each share's MPS
daemon runs with its own pipe, log and shm directories in a temp dir):

1. The first full GPU is found with the plugin's NVML backend. Two claims are planned as the
   scheduler would allocate them with consumable shares: one share of ``--big`` (40Gi) and one
   of ``--small`` (20Gi) memory on that GPU, each with its share ID and ``consumedCapacity``.
2. ``prepare.shares.enforced`` (what prepare runs) turns each share's consumed memory into its
   MPS limit; ``Sharing.apply`` starts each share's daemon with that limit before its server
   starts.
3. Three clients run at once as containers would (a mount namespace of their own with the CDI
   edits of their claim): one per share allocates in steps until ``cudaMalloc`` fails, and a
   third, in the small share, asks by environment for the whole GPU
   (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), which must not raise its share. Each holds its memory
   until all three have reported (``sharescheck.cu``, compiled with ``nvcc``).
4. ``Sharing.undo`` (what unprepare runs) quits both daemons; no process of them is left.

Checks: each client got about its share (within ``--slack`` MiB below it, never above) and
was stopped by an out-of-memory error. MPS limits each client process, not the server: the two
clients of the small share together hold about twice that share, which is printed (and what
docs/concepts/sharing.md says). Prints each step's raw output; exits 0 only if every
check held.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_gpu.config import default_gpu_config, normalized
from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin.ids import ClaimUID, DeviceName
from dra_gpu.plugin import inventory, platforms
from dra_gpu.prepare import shares
from dra_gpu.prepare.cdi import ClaimDevice
from dra_gpu.prepare.plan import ClaimPlan, ClaimRef, PlannedDevice
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import ProcessRunner

SOURCE = Path(__file__).with_name("sharescheck.cu")
MIB = 1024 * 1024
# Binds each CDI mount in a namespace of the client's own, then runs the client: a container.
_AS_CONTAINER = (
    'while [ "$1" != -- ]; do mkdir -p "$2" && mount --bind "$1" "$2" && shift 2; done; '
    'shift; exec "$@"'
)


def say(line: str) -> None:
    print(f"[shares-demo] {line}", flush=True)


def share_plan(device: Device, uid: str, memory_mib: int) -> ClaimPlan:
    """The plan prepare makes of a claim allocated ``memory_mib`` of ``device`` as a share."""
    assert device.uuid is not None
    cdi_device = ClaimDevice(
        name=DeviceName(device.name),
        type="gpu",
        uuid=device.uuid,
        minor=device.gpu.minor,
        product_name=device.gpu.product_name,
        config=normalized(default_gpu_config()),
    )
    planned = PlannedDevice(
        requests=("gpu",),
        pool="gpu-node",
        share_id=f"share-{uid}",
        admin_access=False,
        cdi=cdi_device,
        consumed={"memory": memory_mib * MIB},
    )
    ref = ClaimRef(uid=ClaimUID(uid), namespace="demo", name=uid)
    return ClaimPlan(ref=ref, devices=(planned,))


def as_container(
    edits: dict[str, Any], argv: list[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    binds = [arg for m in edits["mounts"] for arg in (m["hostPath"], m["containerPath"])]
    cdi_env = dict(e.split("=", 1) for e in edits["env"] if e.startswith("CUDA_"))
    wrapped = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _AS_CONTAINER]
    wrapped += ["sh", *binds, "--", *argv]
    return subprocess.Popen(
        wrapped,
        env={"PATH": "/usr/bin:/bin", **cdi_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def daemons(pipes: list[Path]) -> list[str]:
    """The MPS processes of this demo's daemons (by their pipe directory in the environment)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    mine = []
    for line in (x for x in out.splitlines() if "nvidia-cuda-mps" in x):
        try:
            environ = Path(f"/proc/{line.split()[0]}/environ").read_bytes()
        except OSError:
            continue
        if any(f"CUDA_MPS_PIPE_DIRECTORY={p}".encode() in environ for p in pipes):
            mine.append(line.strip())
    return mine


def fields(output: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in output.split() if "=" in f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.gpu.shares_demo", description=__doc__)
    p.add_argument("--big", type=int, default=40 * 1024, help="first share, MiB (40Gi)")
    p.add_argument("--small", type=int, default=20 * 1024, help="second share, MiB (20Gi)")
    p.add_argument("--step", type=int, default=256, help="allocation step of the clients, MiB")
    p.add_argument(
        "--slack", type=int, default=2048, help="MiB below its share a client may stop at"
    )
    p.add_argument("--work", type=Path, default=None, help="directory for state and the binary")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="shares-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        say(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    binary = work / "sharescheck"
    subprocess.run(["nvcc", "-O2", "-o", str(binary), str(SOURCE)], check=True)
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=None, node_name="gpu-node"))
    )
    gpu = next(d for d in devices if d.type == "gpu")
    say(f"GPU {gpu.name} {gpu.uuid} ({gpu.gpu.product_name}), {gpu.capacity['memory'] // MIB} MiB")

    sharing = Sharing(runner=ProcessRunner(), state_dir=work / "state", switches=Switches(mps=True))
    wanted = {"big-share": args.big, "small-share": args.small}
    plans = {uid: shares.enforced(share_plan(gpu, uid, mib)) for uid, mib in wanted.items()}
    edits = {}
    for uid, plan in plans.items():
        devices_of = [d.cdi for d in plan.devices]
        say(f"{uid}: config {devices_of[0].config.model_dump(mode='json', exclude_none=True)}")
        started = time.monotonic()
        sharing.apply(uid, devices_of)
        say(f"{uid}: Sharing.apply {(time.monotonic() - started) * 1000:.0f} ms")
        edits[uid] = sharing.cdi_edits(uid, devices_of)[gpu.name]
    pipes = [mps.claim_dirs(work / "state", uid).pipe for uid in plans]
    say(f"daemon processes: {daemons(pipes)}")

    release = work / "release"
    release.unlink(missing_ok=True)
    client = [str(binary), str(args.step), str(release)]
    raise_env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={gpu.capacity['memory'] // MIB}M"}
    runs = {
        "big": (args.big, as_container(edits["big-share"], client, {})),
        "small": (args.small, as_container(edits["small-share"], client, {})),
        "small-asks-all": (args.small, as_container(edits["small-share"], client, raise_env)),
    }
    lines: dict[str, str] = {}
    deadline = time.monotonic() + 300
    for name, (_, proc) in runs.items():
        assert proc.stdout is not None
        lines[name] = proc.stdout.readline().strip()
        say(f"client {name}: {lines[name]}")
        if time.monotonic() > deadline:
            break
    release.touch()  # all have reported while holding their memory: let them go
    for name, (share, proc) in runs.items():
        rest = proc.communicate(timeout=60)[0].strip()
        if rest:
            say(f"client {name} (rest): {rest}")
        got = int(fields(lines[name]).get("allocated_mib", "-1"))
        check(
            share - args.slack <= got <= share,
            f"client {name} allocated {got} MiB of a {share} MiB share",
        )
        check(
            fields(lines[name]).get("stopped_by") == "cudaErrorMemoryAllocation",
            f"client {name} was stopped by an out-of-memory error past its share",
        )

    small = sum(
        int(fields(lines[n]).get("allocated_mib", "0")) for n in ("small", "small-asks-all")
    )
    say(f"the small share's two clients together held {small} MiB (limits are per process)")

    for uid, plan in plans.items():
        sharing.undo(uid, [d.cdi for d in plan.devices], lambda: [])
    for _ in range(50):
        if not daemons(pipes):
            break
        time.sleep(0.1)
    left = daemons(pipes)
    say(f"after Sharing.undo: daemon processes {left}")
    check(left == [], "unprepare stopped both shares' daemons")
    say("all checks held" if not failures else f"{len(failures)} check(s) failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
