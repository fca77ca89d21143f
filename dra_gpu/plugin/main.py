"""``dra-gpu kubelet-plugin``: flags -> settings -> running plugin until SIGTERM/SIGINT.

Kept thin: settings come from ``settings``, the lifecycle from ``node_plugin``. Exit codes:
0 after a clean stop on a signal, 2 for unusable settings, 1 when start-up fails (the message
says what to fix). Heavy imports (grpc, the Kubernetes client) happen only once a command runs,
so ``dra-gpu --help`` stays fast.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from types import FrameType
from typing import TYPE_CHECKING

from dra_gpu.plugin import settings as plugin_settings

if TYPE_CHECKING:
    from dra_gpu import metrics
    from dra_gpu.devices.model import Device
    from dra_gpu.kube.client import KubeClient
    from dra_gpu.kubeletplugin.driver import Driver
    from dra_gpu.mig.dynamic import DynamicMig
    from dra_gpu.plugin.platforms import Platform
    from dra_gpu.prepare.state import DeviceState

log = logging.getLogger("dra_gpu.plugin")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "kubelet-plugin",
        help="run the node plugin: register with the kubelet, publish ResourceSlices",
        description="Run the DRA kubelet plugin of this node. Every flag can also be set by "
        "the environment variable named in its help.",
    )
    plugin_settings.add_arguments(parser)
    parser.set_defaults(func=run)


def platform_of(settings: plugin_settings.Settings) -> Platform:
    """Real or simulated GPUs, decided once for the process (``platforms``)."""
    from dra_gpu.plugin import platforms

    return platforms.for_node(
        simulate=settings.simulate,
        node_name=settings.node_name,
        driver_root=settings.driver_root,
        host_driver_root=PurePosixPath(settings.host_driver_root),
    )


def device_state(
    settings: plugin_settings.Settings,
    *,
    platform: Platform,
    client: KubeClient,
    inventory: Callable[[], Mapping[str, Device]],
) -> DeviceState:
    """The prepare/unprepare state of this node (``serve`` restores it before serving it).

    Only instances of a rolling update share the node with another instance: there the
    node-wide call lock keeps the two apart. Within an instance claims run concurrently;
    prepare's per-claim locks and the checkpoint's file lock keep that safe.
    """
    import contextlib

    from dra_gpu.kubeletplugin import call_lock
    from dra_gpu.plugin import prepare_core
    from dra_gpu.prepare.sharing.applied import Switches

    return prepare_core.make_state(
        driver_name=settings.driver_name,
        node_name=settings.node_name,
        cdi_root=settings.cdi_root,
        state_dir=settings.state_dir,
        platform=platform,
        sharing=Switches(time_slicing=settings.time_slicing_settings, mps=settings.mps_support),
        inventory=inventory,
        client=client,
        call_lock=(
            call_lock.NodeCallLock(plugin_settings.socket_paths(settings).lock)
            if settings.rolling_update
            else contextlib.nullcontext
        ),
        mig=dynamic_mig(settings, platform),
    )


def dynamic_mig(settings: plugin_settings.Settings, platform: Platform) -> DynamicMig | None:
    """What creates and destroys MIG devices on a node set to ``--mig-mode=dynamic``."""
    if settings.mig_mode != "dynamic":
        return None
    from dra_gpu.mig.dynamic import DynamicMig

    return DynamicMig(
        state_dir=settings.state_dir, instances=platform.mig_instances(settings.state_dir)
    )


# glibc's mallopt parameter for the number of malloc arenas (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8
MALLOC_ARENAS = 2


def limit_malloc_arenas() -> None:
    """At most :data:`MALLOC_ARENAS` malloc arenas instead of glibc's 8 per core.

    glibc gives a thread its own arena when another holds the lock, so the gRPC and worker
    threads of a burst of prepares left 15 arenas holding 5 MiB of RSS (``/proc/PID/smaps``
    after ``bench/reference.py``), and arenas are never given back. The threads that allocate
    run Python under one GIL, so more arenas buy no speed. Not glibc (no ``mallopt``):
    nothing to do.
    """
    import ctypes

    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


def run(args: argparse.Namespace) -> int:
    import os

    limit_malloc_arenas()  # before any thread starts

    try:
        settings = plugin_settings.build_settings(vars(args), os.environ)
    except plugin_settings.SettingsError as err:
        print(f"dra-gpu kubelet-plugin: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return serve(settings, stop)


def serve(settings: plugin_settings.Settings, stop: threading.Event) -> int:
    from dra_gpu.devices import health_rules
    from dra_gpu.kube import capabilities, errors
    from dra_gpu.kube.client import connect
    from dra_gpu.kubeletplugin import slice_api, sockets
    from dra_gpu.plugin import current_devices, health_monitor, inventory, node_plugin
    from dra_gpu.prepare import events

    measured: metrics.PluginMetrics | None = None
    if settings.metrics_address is not None:
        # Only when asked for: prometheus-client costs start-up time and memory otherwise.
        from dra_gpu import metrics

        measured = metrics.PluginMetrics()
    try:
        rules = health_rules.load_rules(settings.health_config)
        platform = platform_of(settings)
        backend = inventory.backend_for(
            platform,
            observe=measured.nvml_call if measured is not None else None,
            mig_dynamic=settings.mig_mode == "dynamic",
        )
        devices, discovery_errors = inventory.discover_with_errors(backend)
        inventory.log_errors(discovery_errors)
        client = connect(settings.kubeconfig)
        detected = capabilities.detect_or_none(
            client, driver=settings.driver_name, node=settings.node_name
        )
    except (
        inventory.InventoryError,
        errors.ApiError,
        health_rules.HealthConfigError,
        capabilities.Unsupported,
    ) as err:
        log.error("cannot start: %s", err)
        return 1
    for level, line in capabilities.plugin_report(detected):
        log.log(level, "%s", line)  # what this cluster supports, and what is refused
    refused = capabilities.dynamic_mig_refusal(detected)
    if settings.mig_mode == "dynamic" and refused is not None:
        log.error("cannot start: %s", refused)
        return 1
    store = slice_api.SliceApi(client, node=settings.node_name, driver=settings.driver_name)
    # The devices now: re-discovery changes them while the plugin runs.
    devices_now = current_devices.Inventory(devices)
    state: DeviceState | None = None
    with_events: events.FailureEvents | None = None

    plugin = node_plugin.NodePlugin(
        settings, store=store, devices=devices, instance=node_plugin.this_instance(settings)
    )

    try:
        published = store.list_slices()
    except errors.ApiError as err:
        log.warning(
            "cannot read the published slices; taints from before a restart are lost: %s", err
        )
        published = []
    monitor = health_monitor.for_plugin(
        settings, rules=rules, devices=devices, plugin=plugin, published=published
    )

    def set_devices(new: Sequence[Device]) -> None:
        monitor.set_devices(new, in_use=state.prepared_devices() if state else None)
        if measured is not None:
            measured.rediscovery_changes.inc()

    devices_now.subscribe(set_devices)

    def published_devices() -> list[tuple[str, str]]:
        health = plugin.health.snapshot().devices
        return [
            (str(d.type), health[d.name].health if d.name in health else "UNKNOWN")
            for d in devices_now.devices()
        ]

    def prepared_counts() -> tuple[int, int]:
        return _prepared_counts(state) if state is not None else (0, 0)

    stop_metrics = None
    if measured is not None and settings.metrics_address is not None:
        measured.watch_state(
            prepared=prepared_counts,
            published=published_devices,
            checkpoint_writes=lambda: state.store.writes if state is not None else (0, 0),
        )
        try:
            stop_metrics = metrics.serve(settings.metrics_address, measured.registry)
        except OSError as err:
            log.error("cannot serve /metrics at %s: %s", settings.metrics_address, err)
            return 1

    log.info(
        "starting: node %s, driver %s, %d devices%s",
        settings.node_name,
        settings.driver_name,
        len(devices),
        f", rolling-update instance {settings.pod_uid}" if settings.rolling_update else "",
    )
    try:
        plugin.start_publishing()
        # The prepare side is imported and built only now, once the publisher runs: its modules
        # (pydantic, the checkpoint models) take longer to load than publishing takes, and
        # publishing needs none of them.
        state = device_state(
            settings, platform=platform, client=client, inventory=devices_now.by_name
        )
        with plugin.exclusive():
            state.start()  # restore: roll back or finish what a crash left, rebuild CDI specs
        # What answers the kubelet: the state, plus Events on failures, plus metrics when asked.
        with_events = events.FailureEvents(state, client, node_name=settings.node_name)
        driver: Driver = with_events if measured is None else measured.measured(with_events)
        plugin.serve(driver)
        watcher = inventory.watcher_for(
            platform,
            backend=backend,
            current=devices,
            errors=discovery_errors,
            listener=devices_now.set,
            rediscover_interval_s=settings.rediscover_interval_s,
            mig_dynamic=settings.mig_mode == "dynamic",
        )
        if watcher is not None:
            watcher.start(plugin.stop_event)
        monitor.start(plugin.stop_event)
        # Start-up is over: what it allocated (modules, inventory, settings) lives as long as the
        # process. Frozen, it is no longer walked by every full garbage collection (20-35 ms on a
        # busy 2-core node, charged to whichever DRA call set it off). Collected first, so no
        # start-up garbage is frozen with it (frozen objects are never freed).
        gc.collect()
        gc.freeze()
        while not stop.wait(0.5):
            pass
    except (sockets.SocketError, OSError) as err:
        log.error("cannot serve: %s", err)
        return 1
    except Exception as err:
        from dra_gpu.prepare.checkpoint import CheckpointError  # loaded by then (device_state)

        if not isinstance(err, CheckpointError):
            raise
        # E.g. a checkpoint written by a newer release: refuse to start, touch nothing.
        log.error("cannot start: %s", err)
        return 1
    finally:
        plugin.stop()
        if with_events is not None:
            with_events.close()
        if stop_metrics is not None:
            stop_metrics()
    return 0


def _prepared_counts(state: DeviceState) -> tuple[int, int]:
    """(claims, devices) prepared on this node, as the checkpoint says."""
    from dra_gpu.prepare import checkpoint

    try:
        claims = state.store.load().claims.values()
    except checkpoint.CheckpointError:
        return (0, 0)
    done = [c for c in claims if c.state == checkpoint.PREPARE_COMPLETED]
    return len(done), sum(len(c.devices) for c in done)
