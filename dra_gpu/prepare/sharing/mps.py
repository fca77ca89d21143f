"""One MPS control daemon per claim: its directories, limits, start, stop and health.

The daemon is a host process the plugin starts (``nvidia-cuda-mps-control -d`` forks off and is
re-parented, so it outlives the plugin process) in the claim's own directories under the
plugin's state dir: ``mps/<key>/{pipe,log,shm}``, where ``key`` is a digest of the claim's UID
(short, because the daemon's sockets in ``pipe`` must fit a socket path's 107 bytes; the full UID
is kept in ``mps/<key>/claim-uid``; a directory named by the full UID, as the previous release
made them, is still found). It runs in a mount namespace of its own
where the claim's ``shm`` directory is ``/dev/shm``; the CDI spec binds the same ``shm`` at the
container's ``/dev/shm`` and ``pipe`` at :data:`CONTAINER_PIPE_DIR`, so clients of one claim (all
its containers, in any pod) meet their daemon and nobody else's. Everything about a claim's
daemon is found from its UID, so the next start can repair any crash (see ``applied``).

Limits go through the control interface after the start: the claim's
``defaultActiveThreadPercentage`` (daemon-wide, so the claim's MPS devices must agree) and per
device (by its index in the daemon's ``CUDA_VISIBLE_DEVICES``, the claim's order) the
``defaultPinnedDeviceMemoryLimit`` or the entry of ``defaultPerDevicePinnedMemoryLimit`` naming
that index or UUID, in whole MiB.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dra_gpu.config import MpsConfig
from dra_gpu.config.quantity import to_bytes
from dra_gpu.config.v1beta1 import MPS
from dra_gpu.prepare.cdi import ClaimDevice
from dra_gpu.prepare.sharing.runner import Command, CommandFailed, Runner

CONTROL: Final = "nvidia-cuda-mps-control"
CONTAINER_PIPE_DIR: Final = "/tmp/nvidia-mps"
MIB: Final = 1024 * 1024
START_TIMEOUT_S: Final = 30.0
CONTROL_TIMEOUT_S: Final = 10.0
READY_WAIT_S: Final = 10.0  # the forked daemon creates its pipe shortly after ``-d`` returns
LOG_TAIL_LINES: Final = 20
# A unix socket's path: sun_path's 108 bytes less the terminating NUL; the daemon's longest
# socket in its pipe directory is control_privileged.
SOCKET_PATH_MAX: Final = 107
LONGEST_SOCKET: Final = "control_privileged"
UID_FILE: Final = "claim-uid"
KEY_CHARS: Final = 16
# Binds the claim's shm directory at /dev/shm in a mount namespace of the daemon's own.
_IN_OWN_SHM: Final = 'mount --bind "$0" /dev/shm && exec "$1" -d'


class MpsError(RuntimeError):
    """The claim's MPS daemon cannot be configured or did not come up; says why."""


@dataclass(frozen=True)
class Dirs:
    root: Path

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def shm(self) -> Path:
        return self.root / "shm"


def mps_root(state_dir: Path) -> Path:
    return state_dir / "mps"


def claim_key(claim_uid: str) -> str:
    return hashlib.sha256(claim_uid.encode()).hexdigest()[:KEY_CHARS]


def claim_dirs(state_dir: Path, claim_uid: str) -> Dirs:
    root = mps_root(state_dir)
    previous = root / claim_uid  # the previous release's name, for a daemon it started
    return Dirs(previous if previous.is_dir() else root / claim_key(claim_uid))


def socket_problem(dirs: Dirs) -> str | None:
    """Why the daemon could not create its sockets in ``dirs.pipe``; None if it can."""
    longest = str(dirs.pipe / LONGEST_SOCKET)
    if len(longest.encode()) <= SOCKET_PATH_MAX:
        return None
    return (
        f"the MPS daemon's socket {longest} would be {len(longest.encode())} bytes, more than a "
        f"socket path's {SOCKET_PATH_MAX}: use a shorter --state-dir"
    )


def mps_devices(devices: Iterable[ClaimDevice]) -> list[ClaimDevice]:
    return [d for d in devices if d.config.sharing is not None and d.config.sharing.strategy == MPS]


def _mps_config(device: ClaimDevice) -> MpsConfig:
    sharing = device.config.sharing
    return (sharing.mpsConfig if sharing is not None else None) or MpsConfig()


def control_lines(devices: Sequence[ClaimDevice]) -> list[str]:
    """The control-interface commands that apply the claim's limits; raises MpsError."""
    percentages = {
        p for d in devices if (p := _mps_config(d).defaultActiveThreadPercentage) is not None
    }
    if len(percentages) > 1:
        raise MpsError(
            "the claim's MPS devices ask for different defaultActiveThreadPercentage values "
            f"({', '.join(map(str, sorted(percentages)))}); one daemon serves them all, so "
            "give them one value"
        )
    lines = [f"set_default_active_thread_percentage {p}" for p in percentages]
    keys = {str(i) for i in range(len(devices))} | {d.uuid for d in devices}
    for index, device in enumerate(devices):
        config = _mps_config(device)
        per_device = config.defaultPerDevicePinnedMemoryLimit or {}
        for key in per_device:
            if key not in keys:
                raise MpsError(
                    f"defaultPerDevicePinnedMemoryLimit names {key!r}, which is neither an index "
                    f"(0..{len(devices) - 1}) nor the UUID of one of the claim's MPS devices"
                )
        limit = (
            per_device.get(str(index))
            or per_device.get(device.uuid)
            or config.defaultPinnedDeviceMemoryLimit
        )
        if limit is not None:
            lines.append(f"set_default_device_pinned_mem_limit {index} {to_bytes(limit) // MIB}M")
    return lines


def daemon_env(dirs: Dirs, devices: Sequence[ClaimDevice]) -> dict[str, str]:
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices),
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
    }


def control_env(dirs: Dirs) -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe), "CUDA_MPS_LOG_DIRECTORY": str(dirs.log)}


def start_command(dirs: Dirs, devices: Sequence[ClaimDevice]) -> Command:
    return Command(
        argv=(
            *("unshare", "--mount", "--propagation", "private", "--"),
            *("sh", "-c", _IN_OWN_SHM, str(dirs.shm), CONTROL),
        ),
        env=daemon_env(dirs, devices),
        timeout_s=START_TIMEOUT_S,
    )


def control_command(dirs: Dirs, lines: Sequence[str]) -> Command:
    return Command(
        argv=(CONTROL,),
        stdin="".join(f"{line}\n" for line in lines),
        env=control_env(dirs),
        timeout_s=CONTROL_TIMEOUT_S,
    )


def reap_exited_daemons(proc: Path = Path("/proc")) -> int:
    """Collect the exit status of MPS daemons re-parented to this process; returns how many.

    ``-d`` forks the daemon off, so it is re-parented to the nearest reaper. On a host that is
    init, which collects it; in the plugin's container the plugin is PID 1, and every claim's
    daemon (control and server) would stay a zombie after ``quit`` (seen on the H200: two per
    claim). Only exited processes named ``nvidia-cuda-mps*`` are collected, never a child
    ``subprocess`` is waiting for.
    """
    reaped = 0
    for children in proc.glob("self/task/*/children"):
        try:
            pids = children.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                stat = (proc / pid / "stat").read_text()
            except OSError:
                continue
            name, state = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 :]
            if state.startswith("Z") and name.startswith("nvidia-cuda-mps"):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(pid), os.WNOHANG)
                    reaped += 1
    return reaped


def log_tail(dirs: Dirs) -> str:
    try:
        lines = (dirs.log / "control.log").read_text(errors="replace").splitlines()
    except OSError:
        return "(no control.log)"
    return "\n".join(lines[-LOG_TAIL_LINES:]) or "(control.log is empty)"


@dataclass(frozen=True)
class MpsControl:
    """Starts, checks and stops the claims' daemons through ``runner``."""

    runner: Runner
    state_dir: Path
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def start(self, claim_uid: str, devices: Sequence[ClaimDevice]) -> None:
        """Start the claim's daemon and apply its limits; raises MpsError with the log tail."""
        lines = control_lines(devices)  # a bad config fails before anything runs
        dirs = claim_dirs(self.state_dir, claim_uid)
        problem = socket_problem(dirs)
        if problem is not None:
            raise MpsError(problem)
        reap_exited_daemons()  # those that quit since the last start or stop
        for path in (dirs.pipe, dirs.log, dirs.shm):
            path.mkdir(parents=True, exist_ok=True)
        (dirs.root / UID_FILE).write_text(claim_uid)
        try:
            self.runner.run(start_command(dirs, devices))
            self._until_ready(dirs, [*lines, "get_default_active_thread_percentage"])
        except CommandFailed as exc:
            raise MpsError(
                f"MPS control daemon for {', '.join(d.name for d in devices)} failed: {exc}; "
                f"daemon log ({dirs.log / 'control.log'}):\n{log_tail(dirs)}"
            ) from None

    def _until_ready(self, dirs: Dirs, lines: Sequence[str]) -> None:
        deadline = self.clock() + READY_WAIT_S
        while True:
            try:
                self.runner.run(control_command(dirs, lines))
                return
            except CommandFailed:
                if self.clock() >= deadline:
                    raise
                self.sleep(0.1)

    def healthy(self, claim_uid: str) -> bool:
        """Whether the claim's daemon answers its control pipe."""
        dirs = claim_dirs(self.state_dir, claim_uid)
        if not dirs.pipe.is_dir():
            return False
        try:
            self.runner.run(control_command(dirs, ["get_default_active_thread_percentage"]))
        except CommandFailed:
            return False
        return True

    def stop(self, claim_uid: str) -> bool:
        """Stop the claim's daemon (if it runs) and remove its directories; False if none."""
        dirs = claim_dirs(self.state_dir, claim_uid)
        if not dirs.root.exists():
            return False
        # Not running (crashed, or stopped before a crash): nothing to quit.
        with contextlib.suppress(CommandFailed):
            self.runner.run(control_command(dirs, ["quit"]))
        shutil.rmtree(dirs.root, ignore_errors=True)
        reap_exited_daemons()
        return True

    def claims(self) -> set[str]:
        """UIDs of the claims with daemon directories."""
        root = mps_root(self.state_dir)
        if not root.is_dir():
            return set()
        return {_uid_of(p) for p in root.iterdir() if p.is_dir()}


def _uid_of(directory: Path) -> str:
    """The claim UID a daemon directory belongs to: its ``claim-uid`` file, else its name (the
    previous release's directories, and one whose file a crash kept from being written: its
    name then finds it again in :func:`claim_dirs`, so it is stopped and removed)."""
    try:
        return (directory / UID_FILE).read_text().strip() or directory.name
    except OSError:
        return directory.name


def mounts(dirs: Dirs) -> list[Mapping[str, object]]:
    """CDI mounts giving a container the claim's pipe directory and shared memory."""
    return [
        {
            "hostPath": str(dirs.pipe),
            "containerPath": CONTAINER_PIPE_DIR,
            "options": ["rbind", "rw"],
            "type": "bind",
        },
        {
            "hostPath": str(dirs.shm),
            "containerPath": "/dev/shm",
            "options": ["rbind", "rw"],
            "type": "bind",
        },
    ]
