"""``python -m e2e.gpu.mps_demo``: the driver's MPS code on a real GPU, clients as containers.

On a machine with an NVIDIA GPU (nothing of the GPU's settings is changed: MPS runs as a daemon
of its own, with its own pipe, log and shm directories in a temp dir):

1. The first full GPU is found with the plugin's NVML backend; a claim's device is built with
   ``GpuConfig`` ``sharing: {strategy: MPS, mpsConfig: {defaultActiveThreadPercentage: P}}``.
2. ``prepare.sharing.applied.Sharing.apply`` (what prepare runs) starts the claim's daemon and
   applies the limit through the control interface.
3. Two clients run at once as a container would run them: in a mount namespace of their own
   with the CDI edits the plugin would write for the claim (the pipe directory at
   ``/tmp/nvidia-mps``, the claim's shm at ``/dev/shm``, ``CUDA_MPS_PIPE_DIRECTORY``). Each
   (``mpscheck.cu``, compiled with ``nvcc``) reports the SM count CUDA gives it and how many
   SMs its kernel ran on; the daemon's server list is read while they run. One run without MPS
   gives the GPU's full count for comparison.
4. ``Sharing.undo`` (what unprepare runs) quits the daemon; no process of it is left.

Prints each step's raw output; exits 0 only if every check held.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_gpu.config import normalized, parse_opaque_config
from dra_gpu.devices.model import Device
from dra_gpu.kubeletplugin.ids import DeviceName
from dra_gpu.plugin import inventory, platforms
from dra_gpu.prepare.cdi import ClaimDevice
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import Sharing, Switches
from dra_gpu.prepare.sharing.runner import CommandFailed, ProcessRunner

SOURCE = Path(__file__).with_name("mpscheck.cu")
CLAIM_UID = "3f0c6a52-mps-demo"
# Binds each CDI mount in a namespace of the client's own, then runs the client: a container.
_AS_CONTAINER = (
    'while [ "$1" != -- ]; do mkdir -p "$2" && mount --bind "$1" "$2" && shift 2; done; '
    'shift; exec "$@"'
)


def say(line: str) -> None:
    print(f"[mps-demo] {line}", flush=True)


def claim_device(device: Device, percentage: int) -> ClaimDevice:
    config = normalized(
        parse_opaque_config(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {
                    "strategy": "MPS",
                    "mpsConfig": {"defaultActiveThreadPercentage": percentage},
                },
            }
        )
    )
    assert device.uuid is not None
    return ClaimDevice(
        name=DeviceName(device.name),
        type="gpu",
        uuid=device.uuid,
        minor=device.gpu.minor,
        product_name=device.gpu.product_name,
        config=config,
    )


def as_container(edits: dict[str, Any], binary: Path, cycles: int) -> subprocess.Popen[str]:
    binds = [arg for m in edits["mounts"] for arg in (m["hostPath"], m["containerPath"])]
    env = dict(e.split("=", 1) for e in edits["env"] if e.startswith("CUDA_"))
    argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _AS_CONTAINER]
    argv += ["sh", *binds, "--", str(binary), str(cycles)]
    return subprocess.Popen(
        argv,
        env={"PATH": "/usr/bin:/bin", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def daemons(pipe: Path) -> list[str]:
    """The MPS processes of this demo's daemon (by their pipe directory in the environment)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines() if "nvidia-cuda-mps" in line]
    mine = []
    for line in lines:
        pid = line.split()[0]
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ:
            mine.append(line.strip())
    return mine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.gpu.mps_demo", description=__doc__)
    p.add_argument("--percentage", type=int, default=50)
    p.add_argument("--cycles", type=int, default=400_000_000, help="kernel length (clocks)")
    p.add_argument("--work", type=Path, default=None, help="directory for state and the binary")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="mps-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        say(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    binary = work / "mpscheck"
    subprocess.run(["nvcc", "-O2", "-o", str(binary), str(SOURCE)], check=True)
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=None, node_name="gpu-node"))
    )
    gpu = next(d for d in devices if d.type == "gpu")
    device = claim_device(gpu, args.percentage)
    say(f"GPU {gpu.name} {device.uuid} ({device.product_name})")

    baseline = subprocess.run(
        [str(binary), str(args.cycles // 4)], capture_output=True, text=True, check=False
    )
    say(f"without MPS: {baseline.stdout.strip()}")
    full = int(baseline.stdout.split("sms_reported=")[1].split()[0])

    state_dir = work / "state"
    sharing = Sharing(runner=ProcessRunner(), state_dir=state_dir, switches=Switches(mps=True))
    started = time.monotonic()
    sharing.apply(CLAIM_UID, [device])
    say(f"Sharing.apply (daemon start + limits): {(time.monotonic() - started) * 1000:.0f} ms")
    dirs = mps.claim_dirs(state_dir, CLAIM_UID)
    edits = sharing.cdi_edits(CLAIM_UID, [device])[device.name]
    say(f"CDI edits of {device.name}: {edits}")
    runner = ProcessRunner()
    asked = runner.run(mps.control_command(dirs, ["get_default_active_thread_percentage"]))
    say(f"control: get_default_active_thread_percentage -> {asked.strip()}")
    check(float(asked.strip()) == args.percentage, "the daemon holds the claim's limit")
    say(f"daemon processes: {daemons(dirs.pipe)}")

    clients = [as_container(edits, binary, args.cycles) for _ in range(2)]
    time.sleep(1.0)
    servers = runner.run(mps.control_command(dirs, ["get_server_list"])).strip()
    say(f"control: get_server_list (clients running) -> {servers}")
    if servers:
        listed = runner.run(
            mps.control_command(dirs, [f"get_device_client_list {servers.split()[0]}"])
        )
        say(f"control: get_device_client_list {servers.split()[0]} -> {listed.strip()}")
    outputs = [c.communicate(timeout=300)[0].strip() for c in clients]
    for i, out in enumerate(outputs):
        say(f"client {i}: {out}")
    expected = full * args.percentage // 100
    for i, out in enumerate(outputs):
        # ``kernel=`` is CUDA's message, with spaces; every other field is one word.
        fields = dict(f.split("=", 1) for f in out.split(" kernel=")[0].split() if "=" in f)
        check(" kernel=no error " in out, f"client {i} ran its kernel through MPS")
        reported = int(fields.get("sms_reported", "-1"))
        used = int(fields.get("sms_used_by_kernel", "-1"))
        check(
            0 < reported < full and abs(reported - expected) <= 2,
            f"client {i} sees {reported} of {full} SMs under a {args.percentage}% limit",
        )
        check(used <= reported, f"client {i}'s kernel ran on {used} SMs (<= {reported})")
    check(bool(servers), "the clients were served by the claim's MPS server")

    sharing.undo(CLAIM_UID, [device], lambda: [])
    for _ in range(50):
        if not daemons(dirs.pipe):
            break
        time.sleep(0.1)
    left = daemons(dirs.pipe)
    say(f"after Sharing.undo: daemon processes {left}, claim dir exists: {dirs.root.exists()}")
    check(left == [] and not dirs.root.exists(), "unprepare stopped the daemon, removed its dirs")
    # Nothing answers on the claim's pipe any more.
    try:
        runner.run(mps.control_command(dirs, ["get_server_list"]))
        check(False, "no daemon answers after undo")
    except CommandFailed as exc:
        say(f"control after undo: {str(exc)[:200]}")
    say("all checks held" if not failures else f"{len(failures)} check(s) failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
