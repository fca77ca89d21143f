"""The driver's processes on the local cluster: kubelet plugins (one per node), the controller.

On a real cluster these run in pods (Helm chart); here they run as host processes, which is what
the kubelet sees anyway: a plugin registers through the kubelet's registry directory and serves
the DRA socket in the kubelet's plugins directory, and writes CDI specs where containerd reads them.

``PluginProcess.for_node(node, ...)`` wires a plugin to a real ``e2e.node.Node``; a plugin for a
simulated node without a kubelet gets directories of its own (its registry dir is never watched, so
only its ResourceSlices matter). Each process runs in its own session and is killed with its group.
``kill()`` is SIGKILL (a crash: sockets and state stay behind), ``stop()`` is SIGTERM (clean exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from e2e import procs

if TYPE_CHECKING:
    from e2e.node import Node

DRIVER_NAME = "gpu.nvidia.com"


class ManagedProcess:
    """A long-running child in its own process group, logging to a file, stopped at exit."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log_path, self.env = name, argv, log_path, env
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n")
        self._proc = procs.spawn(self.argv, log_path=self.log_path, env=self.env)
        return self

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self, *, grace: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL after ``grace``; returns the exit code."""
        if self._proc is None:
            return None
        procs.stop(self._proc, grace_s=grace)
        return self._proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the whole group at once, as a crash or an OOM kill would."""
        if self._proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        procs.stop(self._proc, grace_s=0)
        return self._proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class PluginDirs:
    registry: Path
    data: Path
    cdi_root: Path
    state: Path


def plugin_argv(
    *, node_name: str, kubeconfig: Path, profile: str, dirs: PluginDirs, healthz_port: int = 0
) -> list[str]:
    return [
        *(sys.executable, "-m", "dra_gpu", "kubelet-plugin"),
        *("--node-name", node_name, "--kubeconfig", str(kubeconfig), "--simulate", profile),
        *("--plugin-registry-dir", str(dirs.registry), "--plugin-data-dir", str(dirs.data)),
        *("--cdi-root", str(dirs.cdi_root), "--state-dir", str(dirs.state)),
        *("--healthz-port", str(healthz_port)),
    ]


class PluginProcess(ManagedProcess):
    def __init__(
        self, *, node_name: str, kubeconfig: Path, profile: str, dirs: PluginDirs, log_path: Path
    ) -> None:
        argv = plugin_argv(node_name=node_name, kubeconfig=kubeconfig, profile=profile, dirs=dirs)
        super().__init__(f"plugin[{node_name}]", argv, log_path, _python_env())
        self.node_name, self.profile, self.dirs = node_name, profile, dirs

    @classmethod
    def for_node(cls, node: Node, *, kubeconfig: Path, profile: str) -> PluginProcess:
        """A plugin for a real node: the kubelet's registry/plugins dirs, containerd's CDI dir."""
        dirs = PluginDirs(
            registry=node.paths.plugin_registry_dir,
            data=node.paths.plugins_dir / DRIVER_NAME,
            cdi_root=node.cdi_root,
            state=node.paths.root / "plugin-state",
        )
        log = node.paths.logs / "plugin.log"
        return cls(
            node_name=node.name, kubeconfig=kubeconfig, profile=profile, dirs=dirs, log_path=log
        )

    @classmethod
    def simulated(
        cls, workdir: Path, *, node_name: str, kubeconfig: Path, profile: str
    ) -> PluginProcess:
        """A plugin for a node without a kubelet: only its ResourceSlices are real."""
        root = workdir / node_name
        dirs = PluginDirs(root / "registry", root / "data", root / "cdi", root / "state")
        return cls(
            node_name=node_name,
            kubeconfig=kubeconfig,
            profile=profile,
            dirs=dirs,
            log_path=root / "plugin.log",
        )

    def registered_socket(self) -> Path | None:
        """The registration socket the kubelet watches, once the plugin has created it."""
        sockets = sorted(self.dirs.registry.glob(f"{DRIVER_NAME}*-reg.sock"))
        return sockets[0] if sockets else None


def controller_process(*, kubeconfig: Path, log_path: Path) -> ManagedProcess:
    """The controller without leader election or webhook: it keeps the DeviceClasses applied."""
    argv = [
        *(sys.executable, "-m", "dra_gpu", "controller", "--kubeconfig", str(kubeconfig)),
        "--no-leader-elect",
    ]
    return ManagedProcess("controller", argv, log_path, _python_env())
