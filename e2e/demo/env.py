"""The demo's environment: the driver on four GPU nodes of a local cluster, kept up in background.

``python -m e2e.demo`` starts ``python -m e2e.demo _serve`` as a detached supervisor (its own
session) that owns everything and tears it down on SIGTERM (``python -m e2e.demo down``):

1. the control plane (``e2e.cluster.Cluster``; Kubernetes binaries are built the first time);
2. four GPU nodes, ``demo-h200`` (profile ``h200x8``: 8 full H200), ``demo-a100`` (profile
   ``a100x4-mig``: A100s with MIG devices), ``demo-h100-dyn`` (profile ``h100x8-mig``, with
   ``--mig-mode=dynamic``: H100s with MIG on and no MIG devices, created for claims) and
   ``demo-h200-shared`` (``h200x8`` with ``--consumable-shares memory``: several claims per GPU,
   each with its memory; the shares and telemetry examples run there). Each is a
   *real* node (kubelet + containerd + runc from ``e2e.node``, so pods really run) when that
   works on this machine, else a *simulated* node: a Node object without a kubelet, whose Lease
   the supervisor keeps renewing, tainted so that only the demo's own pods go there, and whose
   pods are removed at once when deleted (``e2e.cluster``: no kubelet would ever confirm it).
   ``demo-h200``'s plugin sets time-slice intervals (``--time-slicing-settings=true``);
3. one kubelet plugin per node (simulated GPUs; each serves ``/metrics`` with GPU telemetry on
   a port of 127.0.0.1, sampled every 2 s, ``--idle-after 10s``) and the controller, as
   processes: the controller keeps the DeviceClasses applied and serves the admission webhook,
   which the chart's own ValidatingWebhookConfiguration (rendered with helm, by URL instead of
   Service) registers;
4. it waits until every node's ResourceSlices and the DeviceClasses are in the API and the API
   server refuses a bad claim through the webhook, then writes ``<cache>/demo/state.json``: the
   supervisor's pid, the kubeconfig, and per node whether it is real and where its plugin's DRA
   socket and CDI directory are.

Builds come before the waits that follow them: helm before the controller starts, and a node's
wait for Ready starts after its kubelet, containerd and runc are built (``e2e.node``), so a cold
first run does not fall back for lack of time.

Real nodes need root and a cgroup/network setup the harness can create; ``DRA_GPU_DEMO_REAL_NODES``
is ``auto`` (default: try, fall back to simulated and say why), ``yes`` (fail instead) or ``no``.
The supervisor prints progress lines; the foreground command shows them while it waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e import binaries, helm, procs, supervisor
from e2e.cluster import Cluster
from e2e.demo import driver_profile
from e2e.driver import (
    ManagedProcess,
    PluginProcess,
    WebhookServing,
    controller_process,
    register_webhook,
    wait_published,
)
from e2e.suite import node_labels
from e2e.suite.kube import Kube

if TYPE_CHECKING:
    from e2e.node.kubelet_node import Node

# demo-h200's plugin applies time-slice intervals to its GPUs (off by default,
# docs/concepts/sharing.md):
# its simulated GPUs record the nvidia-smi commands, which the sharing example shows.
SHARING_NODE = "demo-h200"
SHARING_FLAGS = ("--time-slicing-settings", "true")
# demo-h100-dyn's H100s (MIG on, no MIG devices) use dynamic MIG: claims get MIG devices created
# for them (docs/concepts/dynamic-mig.md).
DYNAMIC_MIG_NODE = "demo-h100-dyn"
DYNAMIC_MIG_FLAGS = ("--mig-mode", "dynamic")
# demo-h200-shared publishes its H200s as consumable shares by memory (docs/concepts/sharing.md):
# the
# shares example puts two claims on one GPU. The telemetry example's claims run there too (whole
# GPUs: a claim that asks for nothing takes all the memory). The scenarios are kept off it, so
# those examples find its GPUs free.
SHARES_NODE = "demo-h200-shared"
SHARES_FLAGS = ("--consumable-shares", "memory")
# demo-h200-shared's driver is upgraded at the end of the demo (``e2e.demo.driver_upgrade``): its
# plugin runs on a profile file with the GPUs of ``h200x8`` (``e2e.demo.driver_profile``).
DRIVER_UPGRADE_NODE = SHARES_NODE
NODE_PROFILES = {
    "demo-h200": "h200x8",
    "demo-a100": "a100x4-mig",
    DYNAMIC_MIG_NODE: "h100x8-mig",
    SHARES_NODE: "h200x8",
}
# Every plugin writes GPU Feature Discovery's labels on its node, as the chart's default does
# (docs/user/node-pools.md; e2e.suite.node_labels reads them, e2e.demo.node_labels uses them).
NODE_LABEL_FLAGS = node_labels.FLAGS
NODE_FLAGS = {
    SHARING_NODE: SHARING_FLAGS,
    DYNAMIC_MIG_NODE: DYNAMIC_MIG_FLAGS,
    SHARES_NODE: SHARES_FLAGS,
}
# Every plugin serves /metrics with GPU telemetry (docs/user/metrics.md), sampled often and with a
# short idle period, so that the demo's idle claims get their GpuIdle Events while it runs: the
# telemetry example is applied first, and its idle period passes while the others are applied.
TELEMETRY_INTERVAL = "2"
IDLE_AFTER = "10s"
# Simulated nodes carry the label GPU Feature Discovery puts on real GPU nodes.
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true"}
REAL_NODE_LABEL = ("dra-gpu.test/real-node", "true")
READY_TIMEOUT_S = 180.0
WEBHOOK_CONFIG = "dra-gpu-webhook"  # the chart's name for it (release dra-gpu)
MODULE = "e2e.demo"  # ``python -m e2e.demo _serve`` is the supervisor


def demo_dir() -> Path:
    return binaries.cache_root() / "demo"


def state_file() -> Path:
    return demo_dir() / "state.json"


def supervisor_log() -> Path:
    return demo_dir() / "supervisor.log"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    profile: str
    real: bool
    dra_socket: str
    cdi_root: str
    plugin_log: str
    note: str = ""  # why a node is simulated, when a real one was wanted
    note_log: str = ""  # the log that tells more, when a real node failed
    on_purpose: bool = False  # simulated because real nodes were turned off, not for a failure
    state_dir: str = ""  # the plugin's state directory (its health command file is there)
    metrics_url: str = ""  # the plugin's /metrics (GPU telemetry, what dra-gpu top reads)
    profile_file: str = ""  # the profile file the plugin runs on, when not a built-in profile


@dataclass(frozen=True)
class DemoState:
    pid: int
    workdir: str
    kubeconfig: str
    server: str
    kubectl: str
    controller_log: str
    webhook: str  # the URL the ValidatingWebhookConfiguration sends claims to
    nodes: tuple[NodeInfo, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DemoState:
        nodes = tuple(NodeInfo(**n) for n in data.pop("nodes"))
        return cls(nodes=nodes, **data)


def alive(pid: int) -> bool:
    return supervisor.alive(pid, module=MODULE)


def read_state() -> DemoState | None:
    """The running demo, or None."""
    try:
        state = DemoState.from_json(json.loads(state_file().read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return state if alive(state.pid) else None


def _say(line: str) -> None:
    print(line, flush=True)


def _free_port() -> int:
    """For the plugin's /healthz (``e2e.driver`` starts plugins with it off)."""
    (port,) = procs.free_ports(1)
    return port


def telemetry_flags(port: int) -> tuple[str, ...]:
    return (
        *("--metrics-address", f"127.0.0.1:{port}"),
        *("--telemetry-interval", TELEMETRY_INTERVAL, "--idle-after", IDLE_AFTER),
    )


def real_nodes_wanted() -> str:
    mode = os.environ.get("DRA_GPU_DEMO_REAL_NODES", "auto").strip().lower()
    if mode not in ("auto", "yes", "no"):
        raise SystemExit(f"DRA_GPU_DEMO_REAL_NODES must be auto, yes or no, not {mode!r}")
    if mode == "auto" and (sys.platform != "linux" or os.geteuid() != 0):
        return "unavailable"
    return mode


class Environment:
    """Everything the supervisor started, in the order it must be stopped."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cluster = Cluster(workdir=workdir / "cluster", log=_say)
        self.nodes: list[Node] = []  # imported lazily when used (a node needs root tooling)
        self.plugins: dict[str, PluginProcess] = {}
        self.metrics_ports: dict[str, int] = {}
        self.infos: list[NodeInfo] = []
        self.controller: ManagedProcess | None = None
        self.webhook = WebhookServing(port=_free_port(), cert_dir=workdir / "controller-certs")

    def up(self) -> None:
        _say("[demo] starting the control plane (Kubernetes binaries are built the first time)")
        self.cluster.up()
        helm.ensure_helm()  # renders the chart's webhook configuration; built the first time
        self.controller = controller_process(
            kubeconfig=self.cluster.kubeconfig,
            log_path=self.workdir / "controller.log",
            webhook=self.webhook,
        ).start()
        mode = real_nodes_wanted()
        note = {
            "no": "real nodes off (DRA_GPU_DEMO_REAL_NODES=no)",
            "unavailable": "real nodes need root on Linux",
        }.get(mode, "")
        note_log = ""
        on_purpose = mode == "no"
        for name, profile in NODE_PROFILES.items():
            real = False
            profile = self._profile_file(name, profile)
            self.metrics_ports[name] = _free_port()
            extra = (
                *NODE_FLAGS.get(name, ()),
                *telemetry_flags(self.metrics_ports[name]),
                *NODE_LABEL_FLAGS,
            )
            if mode in ("auto", "yes") and not note:
                real, note = self._try_real_node(name, profile, required=mode == "yes", extra=extra)
                # The supervisor's log has the failed node's own log tails.
                note_log = "" if real else str(supervisor_log())
            if not real:
                self._simulated_node(name, profile, note, note_log, on_purpose, extra=extra)
        self._wait_published()
        self._register_webhook()

    def _profile_file(self, name: str, profile: str) -> str:
        """The driver-upgrade node's plugin runs on a file with its built-in profile's GPUs,
        which the demo's last step rewrites (``e2e.demo.driver_upgrade``); others on the name."""
        if name != DRIVER_UPGRADE_NODE:
            return profile
        path = driver_profile.profile_path(self.workdir)
        path.parent.mkdir(parents=True, exist_ok=True)
        driver_profile.write_profile(path)
        return str(path)

    def _try_real_node(
        self, name: str, profile: str, *, required: bool, extra: tuple[str, ...] = ()
    ) -> tuple[bool, str]:
        _say(f"[demo] starting real node {name} (kubelet + containerd; built the first time)")
        try:
            from e2e.node.kubelet_node import Node

            node = Node(self.cluster, name=name, workdir=self.workdir / name, log=_say).up()
        except Exception as exc:  # any failure: fall back, and say why
            if required:
                raise
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            _say(f"[demo] real node {name} unavailable ({reason}); using simulated nodes")
            return False, f"real node {name} unavailable: {reason}"
        self.nodes.append(node)
        plugin = PluginProcess.for_node(
            node,
            kubeconfig=self.cluster.kubeconfig,
            profile=profile,
            healthz_port=_free_port(),
            extra=extra,
        )
        self._add_plugin(name, profile, plugin, real=True)
        return True, ""

    def _simulated_node(
        self,
        name: str,
        profile: str,
        note: str,
        note_log: str,
        on_purpose: bool,
        extra: tuple[str, ...] = (),
    ) -> None:
        _say(f"[demo] registering simulated node {name} (profile {profile}, no kubelet)")
        self.cluster.register_node(name, labels=dict(GPU_NODE_LABELS))
        plugin = PluginProcess.simulated(
            self.workdir / "plugins",
            node_name=name,
            kubeconfig=self.cluster.kubeconfig,
            profile=profile,
            healthz_port=_free_port(),
            extra=extra,
        )
        self._add_plugin(
            name, profile, plugin, real=False, note=note, note_log=note_log, on_purpose=on_purpose
        )

    def _add_plugin(
        self,
        name: str,
        profile: str,
        plugin: PluginProcess,
        *,
        real: bool,
        note: str = "",
        note_log: str = "",
        on_purpose: bool = False,
    ) -> None:
        self.plugins[name] = plugin
        shown = Path(profile).stem if profile.endswith(".yaml") else profile
        self.infos.append(
            NodeInfo(
                name=name,
                profile=shown,
                profile_file=profile if shown != profile else "",
                real=real,
                dra_socket=str(plugin.dirs.data / "dra.sock"),
                cdi_root=str(plugin.dirs.cdi_root),
                plugin_log=str(plugin.log_path),
                note=note,
                note_log=note_log,
                on_purpose=on_purpose,
                state_dir=str(plugin.dirs.state),
                metrics_url=f"http://127.0.0.1:{self.metrics_ports[name]}/metrics",
            )
        )
        plugin.start()

    def _kube(self) -> Kube:
        return Kube(self.cluster.api_client())

    def _wait_published(self) -> None:
        _say("[demo] waiting for the plugins to publish ResourceSlices")
        wait_published(self._kube(), self.plugins.values(), timeout=READY_TIMEOUT_S)

    def _register_webhook(self) -> None:
        assert self.controller is not None
        _say(f"[demo] registering the admission webhook ({WEBHOOK_CONFIG}, {self.webhook.url})")
        register_webhook(
            self._kube(), WEBHOOK_CONFIG, self.controller, self.webhook, timeout=READY_TIMEOUT_S
        )

    def state(self) -> DemoState:
        assert self.controller is not None
        return DemoState(
            pid=os.getpid(),
            workdir=str(self.workdir),
            kubeconfig=str(self.cluster.kubeconfig),
            server=self.cluster.server,
            kubectl=str(self.cluster.bin("kubectl")),
            controller_log=str(self.controller.log_path),
            webhook=self.webhook.url,
            nodes=tuple(self.infos),
        )

    def down(self) -> None:
        for plugin in self.plugins.values():
            plugin.stop()
        if self.controller is not None:
            self.controller.stop()
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.down()
        self.cluster.down()


def serve() -> int:
    """The supervisor: bring everything up, publish the state, wait for SIGTERM, tear down."""
    signals = supervisor.StopSignals()  # until ready, the finally below tears down what started
    workdir = demo_dir() / "env"
    shutil.rmtree(workdir, ignore_errors=True)
    env = Environment(workdir)
    try:
        env.up()
        supervisor.write_state(state_file(), asdict(env.state()))
        signals.ready = True
        _say("[demo] environment up")
        signals.stopped.wait()
        _say("[demo] stopping")
    except Exception as exc:
        _say(f"[demo] failed: {exc}")
        return 1
    finally:
        state_file().unlink(missing_ok=True)
        env.down()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
