"""The driver's processes on the local cluster: kubelet plugins (one per node), the controller.

On a real cluster these run in pods (Helm chart); here they run as host processes, which is what
the kubelet sees anyway: a plugin registers through the kubelet's registry directory and serves
the DRA socket in the kubelet's plugins directory, and writes CDI specs where containerd reads them.

``PluginProcess.for_node(node, ...)`` wires a plugin to a real node
(``e2e.node.kubelet_node.Node``); a plugin for a simulated node without a kubelet gets
directories of its own (its registry dir is never watched, so only its ResourceSlices matter).
Each process runs in its own session and is killed with its group.
``kill()`` is SIGKILL (a crash: sockets and state stay behind), ``stop()`` is SIGTERM (clean exit).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes import client

from dra_gpu import DRIVER_NAME
from dra_gpu.config.v1beta1 import API_VERSION
from dra_gpu.controller import registration
from dra_gpu.controller.classes import GPU_CLASS, MIG_CLASS
from e2e import helm, probes, procs, waiting
from e2e.suite.kube import RESOURCE, Kube, wait_for

if TYPE_CHECKING:
    from e2e.node.kubelet_node import Node


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
        return procs.log_tail(self.log_path, lines)


def _python_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class PluginDirs:
    registry: Path
    data: Path
    cdi_root: Path
    state: Path

    @classmethod
    def under(cls, root: Path) -> PluginDirs:
        """Directories of a plugin no kubelet watches, all below ``root`` (keep it short: a unix
        socket's path is limited to 107 bytes)."""
        return cls(root / "registry", root / "data", root / "cdi", root / "state")


def plugin_argv(
    *,
    node_name: str,
    kubeconfig: Path,
    profile: str | None,
    dirs: PluginDirs,
    healthz_port: int = 0,
    extra: Sequence[str] = (),
) -> list[str]:
    """The kubelet plugin's command line: on simulated GPUs of ``profile``, or on the machine's
    real GPUs through NVML when ``profile`` is None; ``extra``: more flags (e.g. ``--pod-uid``,
    ``--driver-root``). Healthz port 0 turns /healthz off."""
    simulate = ("--simulate", profile) if profile is not None else ()
    return [
        *(sys.executable, "-m", "dra_gpu", "kubelet-plugin"),
        *("--node-name", node_name, "--kubeconfig", str(kubeconfig), *simulate),
        *("--plugin-registry-dir", str(dirs.registry), "--plugin-data-dir", str(dirs.data)),
        *("--cdi-root", str(dirs.cdi_root), "--state-dir", str(dirs.state)),
        *("--healthz-port", str(healthz_port)),
        *extra,
    ]


class PluginProcess(ManagedProcess):
    def __init__(
        self,
        *,
        node_name: str,
        kubeconfig: Path,
        profile: str | None,
        dirs: PluginDirs,
        log_path: Path,
        healthz_port: int = 0,
        extra: Sequence[str] = (),
    ) -> None:
        argv = plugin_argv(
            node_name=node_name,
            kubeconfig=kubeconfig,
            profile=profile,
            dirs=dirs,
            healthz_port=healthz_port,
            extra=extra,
        )
        super().__init__(f"plugin[{node_name}]", argv, log_path, _python_env())
        self.node_name, self.profile, self.dirs = node_name, profile, dirs
        self.healthz_port = healthz_port  # 0: /healthz, /readyz off

    @classmethod
    def for_node(
        cls,
        node: Node,
        *,
        kubeconfig: Path,
        profile: str | None,
        healthz_port: int = 0,
        extra: Sequence[str] = (),
    ) -> PluginProcess:
        """A plugin for a real node: the kubelet's registry/plugins dirs, containerd's CDI dir;
        ``profile`` None: the node's real GPUs (NVML)."""
        dirs = PluginDirs(
            registry=node.paths.plugin_registry_dir,
            data=node.paths.plugins_dir / DRIVER_NAME,
            cdi_root=node.cdi_root,
            state=node.paths.root / "plugin-state",
        )
        return cls(
            node_name=node.name,
            kubeconfig=kubeconfig,
            profile=profile,
            dirs=dirs,
            log_path=node.paths.logs / "plugin.log",
            healthz_port=healthz_port,
            extra=extra,
        )

    @classmethod
    def simulated(
        cls,
        workdir: Path,
        *,
        node_name: str,
        kubeconfig: Path,
        profile: str,
        healthz_port: int = 0,
        extra: Sequence[str] = (),
    ) -> PluginProcess:
        """A plugin for a node without a kubelet: only its ResourceSlices are real."""
        root = workdir / node_name
        return cls(
            node_name=node_name,
            kubeconfig=kubeconfig,
            profile=profile,
            dirs=PluginDirs.under(root),
            log_path=root / "plugin.log",
            healthz_port=healthz_port,
            extra=extra,
        )

    def registrations(self) -> int:
        """How often the kubelet confirmed registration (the plugin logs each confirmation)."""
        if not self.log_path.is_file():
            return 0
        return self.log_path.read_text(errors="replace").count("registered with the kubelet")

    def wait_registered(self, *, after: int = 0, timeout: float = 60.0) -> None:
        """Wait until the kubelet confirmed more than ``after`` registrations."""

        def registered() -> bool:
            if self.registrations() > after:
                return True
            self.check_alive()
            return False

        try:
            waiting.wait_for(f"the kubelet to register {self.name}", registered, timeout=timeout)
        except waiting.WaitTimeout as e:
            raise waiting.WaitTimeout(f"{e}\n{self.log_tail()}") from None

    def check_alive(self) -> None:
        """Raise (with the log's tail) if the plugin has exited: a wait for it would be in vain."""
        if not self.alive:
            raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")

    def registered_socket(self) -> Path | None:
        """The registration socket the kubelet watches, once the plugin has created it."""
        sockets = sorted(self.dirs.registry.glob(f"{DRIVER_NAME}*-reg.sock"))
        return sockets[0] if sockets else None


# No device plugin runs on the local nodes, so plain `nvidia.com/gpu: 1` limits are served by DRA.
EXTENDED_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class WebhookServing:
    """Where a controller run as a process serves its admission webhook: ``127.0.0.1:<port>``,
    with the self-signed CA and certificate it writes into ``cert_dir`` at start."""

    port: int
    cert_dir: Path

    @property
    def ca(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{registration.VALIDATE_PATH}"

    def args(self) -> list[str]:
        return [
            *("--webhook-port", str(self.port), "--webhook-address", "127.0.0.1"),
            *("--cert-dir", str(self.cert_dir)),
        ]


def controller_process(
    *,
    kubeconfig: Path,
    log_path: Path,
    webhook: WebhookServing | None = None,
    extra: Sequence[str] = (),
) -> ManagedProcess:
    """The controller without leader election: it keeps the DeviceClasses applied
    (``gpu.nvidia.com`` with ``extendedResourceName: nvidia.com/gpu``) and, given ``webhook``,
    serves the admission webhook there (``register_webhook`` points the API server at it);
    ``extra``: more flags."""
    argv = [
        *(sys.executable, "-m", "dra_gpu", "controller", "--kubeconfig", str(kubeconfig)),
        *("--no-leader-elect", "--extended-resource-name", EXTENDED_RESOURCE),
        *(webhook.args() if webhook else []),
        *extra,
    ]
    return ManagedProcess("controller", argv, log_path, _python_env())


def register_webhook(
    kube: Kube,
    name: str,
    controller: ManagedProcess,
    webhook: WebhookServing,
    *,
    timeout: float,
) -> None:
    """What the chart does, for a controller process: once it serves, register the chart's
    ValidatingWebhookConfiguration (rendered with helm, which must be built: its build is no
    part of ``timeout``) by URL instead of Service, and return when the API server refuses a bad
    claim through it (a configuration takes a moment to take effect)."""

    def serving() -> bool:
        if not controller.alive:
            raise RuntimeError(f"the controller exited:\n{controller.log_tail()}")
        return probes.https_healthy(webhook.port, webhook.ca)

    waiting.wait_for(f"the controller's webhook at {webhook.url}", serving, timeout=timeout)
    client_config = registration.client_config_url(
        webhook.url, ca_bundle_pem=webhook.ca.read_bytes()
    )
    config: Any = helm.webhook_configuration(name, client_config)  # the client takes plain dicts
    client.AdmissionregistrationV1Api(kube.api).create_validating_webhook_configuration(config)
    wait_for(
        f"webhook configuration {name} to take effect", lambda: _refuses(kube), timeout=timeout
    )


def _refuses(kube: Kube) -> bool:
    """A server-side dry run of a claim with a bad GpuConfig is refused by our webhook."""
    params = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}
    claim = {
        "apiVersion": "/".join(RESOURCE),
        "kind": "ResourceClaim",
        "metadata": {"name": "webhook-probe"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}],
                "config": [{"opaque": {"driver": DRIVER_NAME, "parameters": params}}],
            }
        },
    }
    try:
        kube.custom.create_namespaced_custom_object(
            *RESOURCE, "default", "resourceclaims", claim, dry_run="All"
        )
    except client.ApiException as exc:
        body = str(exc.body)  # JSON: the message's quotes are escaped
        return "denied the request" in body and registration.WEBHOOK_NAME in body
    return False


@dataclass
class Driver:
    """The driver on the local cluster: the controller and one plugin per real node."""

    controller: ManagedProcess
    plugins: dict[str, PluginProcess]
    # Where each process serves /metrics on 127.0.0.1: "controller" and the plugins' node names.
    metrics_ports: dict[str, int] = field(default_factory=dict)

    def wait_ready(self, kube: Kube, *, timeout: float = 60.0) -> None:
        """Each plugin is registered with its kubelet and its node's devices are published; the
        DeviceClasses exist."""
        for plugin in self.plugins.values():
            plugin.wait_registered(timeout=timeout)
        wait_published(kube, self.plugins.values(), timeout=timeout)


def wait_published(kube: Kube, plugins: Iterable[PluginProcess], *, timeout: float) -> None:
    """Each plugin's node has ResourceSlices and the controller has made the DeviceClasses. A
    plugin that exits ends the wait at once (with its log), rather than after ``timeout``."""
    for plugin in plugins:

        def published(plugin: PluginProcess = plugin) -> bool:
            plugin.check_alive()
            return any(s["spec"].get("nodeName") == plugin.node_name for s in kube.slices())

        wait_for(f"ResourceSlices of {plugin.node_name}", published, timeout=timeout)
    group, version = RESOURCE
    for name in (GPU_CLASS, MIG_CLASS):
        wait_for(
            f"DeviceClass {name} (made by the controller)",
            functools.partial(
                kube.custom.get_cluster_custom_object, group, version, "deviceclasses", name
            ),
            timeout=timeout,
        )
