"""Settings of the kubelet plugin: flags, their environment variables, and validation.

Design and invariants:
- Every flag can also come from an environment variable, as a DaemonSet passes the downward API
  (``NODE_NAME``, ``POD_UID``). Precedence: flag, then environment, then default.
- Parsing is a pure function of (parsed flags, environment) -> ``Settings`` so it is testable
  without processes; ``Settings`` is frozen and every path in it is absolute.
- Two views of the driver root: ``driver_root`` is where the plugin reads the driver's files (in
  the chart's container, e.g. ``/driver-root``), ``host_driver_root`` where the container
  runtime finds the same files on the host (e.g. ``/``); CDI specs name the latter. The second
  defaults to the first, which is right whenever the root is mounted at its host path.
- Socket names are derived here too (``socket_paths``): the default names, or, when a pod UID is
  given, the rolling-update names that let two instances of the driver run side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path

from dra_gpu import DRIVER_NAME
from dra_gpu.config import strategies
from dra_gpu.devices import shares
from dra_gpu.errors import UserError
from dra_gpu.kubeletplugin import sockets

DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_CDI_ROOT = Path("/var/run/cdi")
DEFAULT_HEALTHZ_ADDRESS = "127.0.0.1"
DEFAULT_REDISCOVER_INTERVAL_S = 60.0
DEFAULT_TELEMETRY_INTERVAL_S = 10.0
DEFAULT_IDLE_AFTER_S = 1800.0
DEFAULT_IDLE_THRESHOLD = 0.01

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
POD_UID_PATTERN = sockets.POD_UID_PATTERN

# (flag dest, environment variable). The flags' defaults are None so that "not given" is visible.
ENV_VARS: Mapping[str, str] = {
    "node_name": "NODE_NAME",
    "driver_name": "DRIVER_NAME",
    "kubeconfig": "KUBECONFIG",
    "simulate": "DRA_GPU_SIMULATE",
    "plugin_registry_dir": "PLUGIN_REGISTRY_DIR",
    "plugin_data_dir": "PLUGIN_DATA_DIR",
    "cdi_root": "CDI_ROOT",
    "state_dir": "STATE_DIR",
    "driver_root": "DRIVER_ROOT",
    "host_driver_root": "HOST_DRIVER_ROOT",
    "pod_uid": "POD_UID",
    "healthz_port": "HEALTHZ_PORT",
    "healthz_address": "HEALTHZ_ADDRESS",
    "log_level": "LOG_LEVEL",
    "rediscover_interval": "REDISCOVER_INTERVAL",
    "health_config": "HEALTH_CONFIG",
    "metrics_address": "METRICS_ADDRESS",
    "time_slicing_settings": "TIME_SLICING_SETTINGS",
    "mps_support": "MPS_SUPPORT",
    "node_labels": "NODE_LABELS",
    "mig_mode": "MIG_MODE",
    "consumable_shares": "CONSUMABLE_SHARES",
    "telemetry_interval": "TELEMETRY_INTERVAL",
    "idle_after": "IDLE_AFTER",
    "idle_threshold": "IDLE_THRESHOLD",
}
MIG_MODES = ("static", "dynamic")


class SettingsError(UserError, ValueError):
    """A flag or environment variable has a value the plugin cannot run with."""


@dataclasses.dataclass(frozen=True)
class Settings:
    node_name: str
    driver_name: str
    kubeconfig: Path | None
    simulate: str | None
    plugin_registry_dir: Path
    plugin_data_dir: Path
    cdi_root: Path
    state_dir: Path
    driver_root: Path
    host_driver_root: Path
    pod_uid: str | None
    healthz_port: int | None
    healthz_address: str
    log_level: str
    # Seconds between NVML re-discoveries; None: discover at start only.
    rediscover_interval_s: float | None = DEFAULT_REDISCOVER_INTERVAL_S
    # XID/ECC classification overrides and the quiet period (health_rules); None: defaults.
    health_config: Path | None = None
    # Where /metrics is served; None: not served.
    metrics_address: tuple[str, int] | None = None
    # Sharing applied to the GPUs (dra_gpu.prepare.sharing, docs/concepts/sharing.md); off: env
    # only.
    time_slicing_settings: bool = False
    mps_support: bool = False
    # Write GPU Feature Discovery's labels of the published GPUs on this node's Node
    # (plugin.node_labels, docs/user/node-pools.md).
    node_labels: bool = False
    # "dynamic": MIG devices are created by prepare (docs/concepts/dynamic-mig.md); "static": as
    # found.
    mig_mode: str = "static"
    # Consumable shares (docs/concepts/sharing.md#consumable-shares): several claims per device,
    # each given an MPS server of its own with its limits when --mps-support is on; None: off.
    consumable_shares: shares.ShareMode | None = None
    # GPU telemetry (plugin.telemetry), with the metrics endpoint only: seconds between passes
    # (None: off), how long a claim stays idle before its GpuIdle Event (None: never), and the
    # utilization under which a device counts as idle.
    telemetry_interval_s: float | None = DEFAULT_TELEMETRY_INTERVAL_S
    idle_after_s: float | None = DEFAULT_IDLE_AFTER_S
    idle_threshold: float = DEFAULT_IDLE_THRESHOLD

    @property
    def rolling_update(self) -> bool:
        return self.pod_uid is not None

    @property
    def sharing_strategies(self) -> frozenset[str]:
        """The sharing strategies this node applies, by name (each row's ``setting`` is a
        switch of this class: tests/unit/test_sharing_strategies.py)."""
        return strategies.enabled_by(
            {s.setting: bool(getattr(self, s.setting)) for s in strategies.STRATEGIES.values()}
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the plugin's flags; each help text names its environment variable."""

    def add(flag: str, dest: str, help_text: str, metavar: str | None = None) -> None:
        env = ENV_VARS[dest]
        parser.add_argument(
            flag, dest=dest, default=None, metavar=metavar, help=f"{help_text} [env {env}]"
        )

    add("--node-name", "node_name", "name of this node (required)")
    add("--driver-name", "driver_name", f"DRA driver name (default {DRIVER_NAME})")
    add("--kubeconfig", "kubeconfig", "kubeconfig file; in-cluster config when absent")
    add(
        "--simulate",
        "simulate",
        "simulate GPUs instead of NVML: a built-in profile name or a profile file "
        "(a file is re-read when it changes)",
        metavar="PROFILE",
    )
    add(
        "--plugin-registry-dir",
        "plugin_registry_dir",
        f"kubelet plugin registry directory (default {DEFAULT_REGISTRY_DIR})",
    )
    add(
        "--plugin-data-dir",
        "plugin_data_dir",
        f"directory of the DRA socket (default {DEFAULT_PLUGINS_DIR}/<driver>)",
    )
    add(
        "--mig-mode",
        "mig_mode",
        "static: publish the MIG devices that exist; dynamic: publish every MIG placement of "
        "GPUs with MIG on and create the MIG device when a claim is prepared (default static)",
    )
    add("--cdi-root", "cdi_root", f"directory for CDI specs (default {DEFAULT_CDI_ROOT})")
    add("--state-dir", "state_dir", "directory for the checkpoint (default: plugin data dir)")
    add(
        "--driver-root",
        "driver_root",
        "root of the NVIDIA driver installation as this process sees it; NVML and the files "
        "mounted into containers are found under it (default /)",
    )
    add(
        "--host-driver-root",
        "host_driver_root",
        "the same root as the container runtime sees it on the host, named in CDI mounts "
        "(default: the driver root)",
    )
    add(
        "--pod-uid",
        "pod_uid",
        "UID of the plugin's pod; turns on rolling-update socket names",
    )
    add("--healthz-port", "healthz_port", "serve HTTP /healthz on this port (default 0: off)")
    add(
        "--healthz-address",
        "healthz_address",
        f"address for /healthz (default {DEFAULT_HEALTHZ_ADDRESS}; "
        "0.0.0.0 for probes on the pod IP)",
    )
    add("--log-level", "log_level", "DEBUG, INFO, WARNING or ERROR (default INFO)")
    add(
        "--rediscover-interval",
        "rediscover_interval",
        "seconds between NVML re-discoveries, so MIG changes and lost GPUs reach the "
        f"ResourceSlices without a restart (default {DEFAULT_REDISCOVER_INTERVAL_S:g}; 0: off)",
        metavar="SECONDS",
    )
    add(
        "--health-config",
        "health_config",
        "YAML/JSON file: which XID and ECC events taint a GPU (Ignore, NoSchedule, NoExecute) "
        "and the quiet period before a tainted GPU is cleared (default: built-in table, 300 s)",
        metavar="FILE",
    )
    add(
        "--metrics-address",
        "metrics_address",
        "serve Prometheus /metrics at HOST:PORT (default empty: off)",
        metavar="HOST:PORT",
    )
    add(
        "--time-slicing-settings",
        "time_slicing_settings",
        "true: set the time-slice interval of a GpuConfig on the GPU at prepare, reset it at "
        "unprepare (default false: the interval reaches the container environment only)",
        metavar="BOOL",
    )
    add(
        "--mps-support",
        "mps_support",
        "true: run an MPS control daemon per claim whose GpuConfig/MigDeviceConfig asks for MPS "
        "(default false: the MPS settings reach the container environment only)",
        metavar="BOOL",
    )
    add(
        "--node-labels",
        "node_labels",
        "true: keep GPU Feature Discovery's labels of this node's GPUs (nvidia.com/gpu.product, "
        "gpu.count, gpu.memory, ...) on its Node (default false)",
        metavar="BOOL",
    )
    add(
        "--consumable-shares",
        "consumable_shares",
        "publish GPUs and MIG devices for several claims at once, by memory (memory), without "
        "a limit (unlimited) or for N claims (an integer); with --mps-support each share gets "
        "an MPS server limited to its memory and compute (default disabled)",
        metavar="MODE",
    )
    add(
        "--telemetry-interval",
        "telemetry_interval",
        "seconds between GPU telemetry samples (utilization, memory, temperature, power, "
        "processes by pod), exported with --metrics-address only "
        f"(default {DEFAULT_TELEMETRY_INTERVAL_S:g}; 0: off)",
        metavar="SECONDS",
    )
    add(
        "--idle-after",
        "idle_after",
        "a claim whose GPUs stay under --idle-threshold this long gets a GpuIdle Warning Event "
        "on it and its pods (e.g. 30m, 90s, 1h; default 30m; 0: off); needs telemetry",
        metavar="DURATION",
    )
    add(
        "--idle-threshold",
        "idle_threshold",
        "SM utilization (0..1) under which a claim's GPU counts as idle "
        f"(default {DEFAULT_IDLE_THRESHOLD:g})",
        metavar="RATIO",
    )


def _pick(values: Mapping[str, object], env: Mapping[str, str], dest: str) -> str | None:
    flag = values.get(dest)
    if flag is not None and flag != "":
        return str(flag)
    from_env = env.get(ENV_VARS[dest], "")
    return from_env or None


def _absolute(raw: str | None, default: Path, what: str) -> Path:
    path = Path(raw) if raw is not None else default
    if not path.is_absolute():
        raise SettingsError(f"{what} must be an absolute path, got {str(path)!r}")
    return path


def _optional_path(raw: str | None) -> Path | None:
    return Path(raw).absolute() if raw else None


def _port(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(f"healthz port must be a number, got {raw!r}") from None
    if not 0 <= port < 65536:
        raise SettingsError(f"healthz port must be in 0..65535 (0: off), got {port}")
    return port or None


def _interval(raw: str | None) -> float | None:
    if raw is None:
        return DEFAULT_REDISCOVER_INTERVAL_S
    try:
        seconds = float(raw)
    except ValueError:
        raise SettingsError(
            f"rediscover interval must be a number of seconds, got {raw!r}"
        ) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise SettingsError(f"rediscover interval must be >= 0 seconds (0: off), got {raw!r}")
    return seconds or None


def _seconds(raw: str | None, default: float, what: str) -> float | None:
    """A number of seconds or a duration (``90s``, ``30m``, ``1h``); 0 is None (off)."""
    if raw is None:
        return default or None
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|h)?\s*", raw)
    if match is None:
        raise SettingsError(f"{what} must be seconds or a duration like 90s, 30m, 1h; got {raw!r}")
    seconds = float(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2] or "s"]
    return seconds or None


def _ratio(raw: str | None, default: float, what: str) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{what} must be a number from 0 to 1, got {raw!r}") from None
    if not 0 <= value <= 1:
        raise SettingsError(f"{what} must be from 0 to 1, got {raw!r}")
    return value


def _metrics_address(raw: str | None) -> tuple[str, int] | None:
    if not raw:
        return None  # off: prometheus-client is not even imported (start-up time, memory)
    from dra_gpu import metrics

    try:
        return metrics.parse_address(raw or "")
    except metrics.AddressError as err:
        raise SettingsError(str(err)) from None


def switch(raw: str | None, what: str) -> bool:
    """A true/false setting (None: false); raises SettingsError naming ``what``."""
    if raw is None:
        return False
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise SettingsError(f"{what} must be true or false, got {raw!r}")
    return value == "true"


def build_settings(values: Mapping[str, object], env: Mapping[str, str]) -> Settings:
    """Settings from parsed flags (``vars(args)``) and the environment; raises SettingsError."""

    def pick(dest: str) -> str | None:
        return _pick(values, env, dest)

    node_name = pick("node_name")
    if node_name is None:
        raise SettingsError("the node name is required: --node-name or NODE_NAME")
    driver = pick("driver_name") or DRIVER_NAME
    if len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        raise SettingsError(f"driver name must be a DNS subdomain of at most 63, got {driver!r}")
    pod_uid = pick("pod_uid")
    if pod_uid is not None and not POD_UID_PATTERN.match(pod_uid):
        raise SettingsError(f"pod UID may hold only letters, digits and '-', got {pod_uid!r}")
    kubeconfig = pick("kubeconfig")
    data_dir = _absolute(pick("plugin_data_dir"), DEFAULT_PLUGINS_DIR / driver, "plugin data dir")
    log_level = (pick("log_level") or "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"log level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    driver_root = _absolute(pick("driver_root"), Path("/"), "driver root")
    mig_mode = pick("mig_mode") or "static"
    if mig_mode not in MIG_MODES:
        raise SettingsError(f"MIG mode must be static or dynamic, got {mig_mode!r}")
    switched = {s.setting: switch(pick(s.setting), s.flag) for s in strategies.STRATEGIES.values()}
    try:
        share_mode = shares.parse_mode(
            pick("consumable_shares"),
            compute=strategies.limits_shares_when(strategies.enabled_by(switched)),
        )
    except shares.ShareModeError as err:
        raise SettingsError(str(err)) from None
    settings = Settings(
        node_name=node_name,
        driver_name=driver,
        kubeconfig=Path(kubeconfig).absolute() if kubeconfig else None,
        simulate=pick("simulate"),
        plugin_registry_dir=_absolute(
            pick("plugin_registry_dir"), DEFAULT_REGISTRY_DIR, "plugin registry dir"
        ),
        plugin_data_dir=data_dir,
        cdi_root=_absolute(pick("cdi_root"), DEFAULT_CDI_ROOT, "CDI root"),
        state_dir=_absolute(pick("state_dir"), data_dir, "state dir"),
        driver_root=driver_root,
        host_driver_root=_absolute(pick("host_driver_root"), driver_root, "host driver root"),
        pod_uid=pod_uid,
        healthz_port=_port(pick("healthz_port")),
        healthz_address=pick("healthz_address") or DEFAULT_HEALTHZ_ADDRESS,
        log_level=log_level,
        rediscover_interval_s=_interval(pick("rediscover_interval")),
        health_config=_optional_path(pick("health_config")),
        metrics_address=_metrics_address(pick("metrics_address")),
        time_slicing_settings=switched["time_slicing_settings"],
        mps_support=switched["mps_support"],
        node_labels=switch(pick("node_labels"), "--node-labels"),
        mig_mode=mig_mode,
        consumable_shares=share_mode,
        telemetry_interval_s=_seconds(
            pick("telemetry_interval"), DEFAULT_TELEMETRY_INTERVAL_S, "--telemetry-interval"
        ),
        idle_after_s=_seconds(pick("idle_after"), DEFAULT_IDLE_AFTER_S, "--idle-after"),
        idle_threshold=_ratio(pick("idle_threshold"), DEFAULT_IDLE_THRESHOLD, "--idle-threshold"),
    )
    for path in dataclasses.astuple(socket_paths(settings)):
        if len(str(path).encode()) > sockets.MAX_PATH:
            raise SettingsError(f"socket path longer than {sockets.MAX_PATH} bytes: {path}")
    return settings


def socket_paths(settings: Settings) -> sockets.SocketPaths:
    """This instance's sockets (``sockets.socket_paths``)."""
    return instance_socket_paths(settings, settings.pod_uid)


def instance_socket_paths(settings: Settings, pod_uid: str | None) -> sockets.SocketPaths:
    """The sockets of the instance with ``pod_uid`` (None: the only instance) on this node."""
    return sockets.socket_paths(
        driver_name=settings.driver_name,
        registry_dir=settings.plugin_registry_dir,
        data_dir=settings.plugin_data_dir,
        pod_uid=pod_uid,
    )
