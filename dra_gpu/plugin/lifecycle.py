"""One kubelet-plugin process, from settings to stopped: :class:`KubeletPlugin`.

The composition root of the node plugin. It builds the parts in the order they are needed and
owns them until :meth:`KubeletPlugin.stop`:

1. :meth:`KubeletPlugin.start` discovers the devices through the platform (``platforms``, chosen
   once), connects to the API server and learns what it serves; then starts publishing the
   ResourceSlices at once (their round trips overlap with the rest of start-up);
2. builds the prepare side (``DeviceState``; imported only now: pydantic and the checkpoint
   models take longer to load than publishing takes) and restores it under the node-wide lock;
3. serves the driver to the kubelet (DRA socket, then registration), then starts re-discovery,
   the health monitor and, with ``--node-labels``, the Node's labels (``node_labels``).

Every part is an attribute set once; the callbacks the parts call later (re-discovery, /metrics)
are methods that read those attributes, never closures over a half-built state. A failed start
raises :class:`StartError` with the reason, after stopping what had started.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dra_gpu.errors import UserError
from dra_gpu.plugin import (
    current_devices,
    driver_outage,
    health_monitor,
    inventory,
    node_plugin,
    published,
)
from dra_gpu.plugin import settings as plugin_settings

if TYPE_CHECKING:
    from dra_gpu import metrics
    from dra_gpu.devices.model import Device, GpuBackend
    from dra_gpu.kube.capabilities import Capabilities
    from dra_gpu.kube.client import KubeClient
    from dra_gpu.kube.objects import ResourceSlice
    from dra_gpu.kubeletplugin.claim_status import ClaimStatusWriter
    from dra_gpu.kubeletplugin.driver import Step
    from dra_gpu.kubeletplugin.events import EventPoster
    from dra_gpu.kubeletplugin.publisher import SliceStore
    from dra_gpu.mig.dynamic import DynamicMig
    from dra_gpu.plugin.mig_binding import MigBinder
    from dra_gpu.plugin.node_labels import NodeLabeler
    from dra_gpu.plugin.platforms import Platform
    from dra_gpu.prepare.state import DeviceState

log = logging.getLogger("dra_gpu.plugin")


class StartError(UserError, RuntimeError):
    """The plugin cannot start; the message says what to fix."""


class KubeletPlugin:
    """The parts of a running plugin process; :meth:`start` builds and starts them."""

    def __init__(self, settings: plugin_settings.Settings) -> None:
        self.settings = settings
        # Only when asked for: prometheus-client costs start-up time and memory otherwise.
        self.measured: metrics.PluginMetrics | None = None
        self._stop_metrics: Callable[[], None] | None = None
        # Set once each, in start-up order (``_start``); None until then.
        self._plugin: node_plugin.NodePlugin | None = None
        self._devices: current_devices.Inventory | None = None
        self._monitor: health_monitor.HealthMonitor | None = None
        self._state: DeviceState | None = None
        self._events: EventPoster | None = None
        self._status: ClaimStatusWriter | None = None
        self._labeler: NodeLabeler | None = None  # with --node-labels
        self._steps: list[Step] = []  # what the kit runs after each call, in order
        # Dynamic MIG devices are created when allocated, before the pod binds (KEP-5007).
        self._binds_ahead = False
        self._binder: MigBinder | None = None

    @classmethod
    def start(cls, settings: plugin_settings.Settings) -> KubeletPlugin:
        """A started plugin; raises :class:`StartError` (having stopped what it started)."""
        running = cls(settings)
        try:
            running._start()
        except BaseException:
            running.stop()
            raise
        return running

    def _start(self) -> None:
        from dra_gpu.devices import health_rules
        from dra_gpu.kube import capabilities, errors
        from dra_gpu.kube.client import connect
        from dra_gpu.kubeletplugin import slice_api, sockets

        settings = self.settings
        if settings.metrics_address is not None:
            from dra_gpu import metrics

            self.measured = metrics.PluginMetrics()
        try:
            rules = health_rules.load_rules(settings.health_config)
            platform = platform_of(settings)
            backend = inventory.backend_for(
                platform,
                observe=self.measured.nvml_call if self.measured is not None else None,
                mig_dynamic=settings.mig_mode == "dynamic",
            )
            driver_probe = platform.driver(
                observe=self.measured.nvml_call if self.measured is not None else None
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
            raise StartError(str(err)) from err
        for level, line in capabilities.plugin_report(detected):
            log.log(level, "%s", line)  # what this cluster supports, and what is refused
        refused = capabilities.dynamic_mig_refusal(detected)
        if settings.mig_mode == "dynamic" and refused is not None:
            raise StartError(refused)
        # Dynamic MIG devices created before the pod binds (KEP-5007), where the server keeps
        # binding conditions; elsewhere at prepare, as before, said once.
        self._binds_ahead = settings.mig_mode == "dynamic" and capabilities.mig_before_binding(
            detected
        )
        note = capabilities.binding_conditions_note(detected)
        if settings.mig_mode == "dynamic" and note is not None:
            log.info("%s", note)

        store = slice_api.SliceApi(client, node=settings.node_name, driver=settings.driver_name)
        # The devices now: re-discovery changes them while the plugin runs.
        self._devices = current_devices.Inventory(devices)
        self._plugin = plugin = node_plugin.NodePlugin(
            settings,
            store=store,
            devices=devices,
            instance=node_plugin.this_instance(settings),
            binding=(
                published.mig_binding_conditions(settings.driver_name)
                if self._binds_ahead
                else None
            ),
        )
        self._monitor = health_monitor.for_plugin(
            settings,
            rules=rules,
            devices=devices,
            plugin=plugin,
            published=_published_slices(store),
            driver_probe=driver_probe,
            rediscovers=platform.rediscovery(settings.rediscover_interval_s) is not None,
            on_driver=self._driver_changed,
        )
        monitor = self._monitor
        plugin.watch_liveness(lambda: driver_outage.restart_needed(monitor.driver_state))
        self._devices.subscribe(self._devices_changed)
        if settings.node_labels:
            from dra_gpu.plugin import node_labels

            self._labeler = node_labels.NodeLabeler(client, settings.node_name)
            self._labeler.set_devices(devices)
            self._devices.subscribe(self._labeler.set_devices)
        self._serve_metrics()
        log.info(
            "starting: node %s, driver %s, %d devices%s",
            settings.node_name,
            settings.driver_name,
            len(devices),
            f", rolling-update instance {settings.pod_uid}" if settings.rolling_update else "",
        )
        try:
            plugin.start_publishing()
            self._start_prepare_side(platform, client, detected)
            self._serve_kubelet(platform, backend, devices, discovery_errors)
            self._start_telemetry(platform, client)
        except (sockets.SocketError, OSError) as err:
            raise StartError(f"cannot serve: {err}") from err
        except Exception as err:
            # Loaded by then (the prepare side); importing it earlier would delay publishing.
            from dra_gpu.prepare.checkpoint import CheckpointError

            if not isinstance(err, CheckpointError):
                raise
            # E.g. a checkpoint written by a newer release: refuse to start, touch nothing.
            raise StartError(str(err)) from err

    def _serve_metrics(self) -> None:
        if self.measured is None or self.settings.metrics_address is None:
            return
        from dra_gpu import metrics

        self.measured.watch_state(
            prepared=self._prepared_counts,
            published=self._published_devices,
            checkpoint_writes=self._checkpoint_writes,
        )
        try:
            self._stop_metrics = metrics.serve(
                self.settings.metrics_address, self.measured.registry
            )
        except OSError as err:
            raise StartError(
                f"cannot serve /metrics at {self.settings.metrics_address}: {err}"
            ) from err

    def _start_prepare_side(
        self, platform: Platform, client: KubeClient, detected: Capabilities | None
    ) -> None:
        from dra_gpu.kubeletplugin import claim_status, events
        from dra_gpu.prepare import device_status

        assert self._plugin is not None and self._devices is not None
        assert self._monitor is not None
        settings = self.settings
        source = events.component(settings.driver_name)
        self._events = poster = events.EventPoster(client)
        mig = dynamic_mig(settings, platform, keep_ahead=self._binds_ahead)
        self._state = state = device_state(
            settings,
            platform=platform,
            client=client,
            inventory=self._devices.by_name,
            poster=poster,
            driver_gate=self._monitor.refusal,
            mig=mig,
        )
        with self._plugin.exclusive():
            state.start()  # restore: roll back or finish what a crash left, rebuild CDI specs
        if mig is not None and self._binds_ahead:
            from dra_gpu.plugin import mig_binding

            self._binder = mig_binding.MigBinder(
                client,
                driver=settings.driver_name,
                node=settings.node_name,
                mig=mig,
                inventory=self._devices.by_name,
                claims=state,
                on_refused=self._monitor.set_other_taints,  # the refused placement tainted
                # Its pods listed once the node's slices are published: a fleet starting
                # together opens fewer connections at once (docs/development/scale.md).
                slices_published=self._plugin.publisher.wait_synced,
            )
        # Written after the answer, by its own thread: the claims' status.devices.
        self._status = claim_status.ClaimStatusWriter(
            client,
            driver=settings.driver_name,
            entries_of=device_status.entries_of(
                state.store, driver=settings.driver_name, inventory=self._devices.by_name
            ),
            observe=self.measured.claim_status if self.measured is not None else None,
            forbidden_hint=detected.device_status_permission if detected is not None else "",
        )
        self._status.start()
        # After each call, in order: metrics (when asked for), Events on failed claims, the
        # claims' device status.
        if self.measured is not None:
            self._steps.append(self.measured)
        self._steps += [
            events.FailureEvents(poster, node_name=settings.node_name, source=source),
            self._status,
        ]

    def _serve_kubelet(
        self,
        platform: Platform,
        backend: GpuBackend,
        devices: Sequence[Device],
        discovery_errors: Sequence[str],
    ) -> None:
        assert self._plugin is not None and self._state is not None
        assert self._devices is not None and self._monitor is not None
        self._plugin.serve(self._state, self._steps)
        watcher = inventory.watcher_for(
            platform,
            backend=backend,
            current=devices,
            errors=discovery_errors,
            listener=self._devices.set,
            rediscover_interval_s=self.settings.rediscover_interval_s,
            mig_dynamic=self.settings.mig_mode == "dynamic",
            urgent=self._monitor.wants_rediscovery,  # the driver is back: its devices now
        )
        if watcher is not None:
            watcher.start(self._plugin.stop_event)
        self._monitor.start(self._plugin.stop_event)
        if self._labeler is not None:
            self._labeler.start(self._plugin.stop_event)
        if self._binder is not None:
            # Its first pass repairs what a plugin killed before reporting left (ahead entries).
            self._binder.start(self._plugin.stop_event)
        # Start-up is over: what it allocated (modules, inventory, settings) lives as long as the
        # process. Frozen, it is no longer walked by every full garbage collection (20-35 ms on a
        # busy 2-core node, charged to whichever DRA call set it off). Collected first, so no
        # start-up garbage is frozen with it (frozen objects are never freed).
        gc.collect()
        gc.freeze()

    def _start_telemetry(self, platform: Platform, client: KubeClient) -> None:
        """GPU telemetry by claim and pod (``telemetry_wiring``), with /metrics only."""
        if self.measured is None or self._plugin is None or self._state is None:
            return
        from dra_gpu.plugin import telemetry_wiring

        assert self._devices is not None and self._monitor is not None
        telemetry_wiring.start(
            self.settings,
            platform=platform,
            client=client,
            devices=self._devices.devices,
            store=self._state.store,
            registry=self.measured.registry,
            stop=self._plugin.stop_event,
            observe=self.measured.nvml_call,
            health_events=self._monitor.event_counts,
        )

    # --- what the parts call back -------------------------------------------------------------

    def _devices_changed(self, new: Sequence[Device]) -> None:
        """Re-discovery found other devices: publish them (prepared ones stay listed)."""
        state = self._state
        assert self._monitor is not None  # subscribed once the monitor exists
        self._monitor.set_devices(new, in_use=state.prepared_devices() if state else None)
        if self.measured is not None:
            self.measured.rediscovery_changes.inc()

    def _driver_changed(self, change: driver_outage.Change) -> None:
        """The driver went out or came back (the health monitor's thread): an Event on the
        Node (queued, posted by the Event poster's thread) and /metrics."""
        from dra_gpu.kubeletplugin import events

        if self.measured is not None:
            if isinstance(change, driver_outage.Began):
                self.measured.driver_outage_began()
            else:
                self.measured.driver_outage_ended(change.seconds)
        if self._events is None:  # before the prepare side (start-up): the log has it
            return
        reason, message = driver_outage.describe(change)
        node = self.settings.node_name
        self._events.post(
            events.warning_event(
                {"kind": "Node", "name": node, "uid": node},
                namespace="default",
                reason=reason,
                message=message,
                host=node,
                source=events.component(self.settings.driver_name),
                event_type="Warning" if isinstance(change, driver_outage.Began) else "Normal",
            )
        )

    def _published_devices(self) -> list[tuple[str, str]]:
        """(type, health) of each published device, for /metrics."""
        if self._plugin is None or self._devices is None:
            return []
        health = self._plugin.health.snapshot().devices
        return [
            (str(d.type), health[d.name].health if d.name in health else "UNKNOWN")
            for d in self._devices.devices()
        ]

    def _prepared_counts(self) -> tuple[int, int]:
        """(claims, devices) prepared on this node, as the checkpoint says."""
        from dra_gpu.prepare import checkpoint

        if self._state is None:
            return (0, 0)
        try:
            claims = self._state.store.load().claims.values()
        except (checkpoint.CheckpointError, OSError):  # OSError: its lock not taken in time, too
            return (0, 0)
        done = [c for c in claims if c.state == checkpoint.PREPARE_COMPLETED]
        return len(done), sum(len(c.devices) for c in done)

    def _checkpoint_writes(self) -> tuple[int, int]:
        return self._state.store.writes if self._state is not None else (0, 0)

    def stop(self) -> None:
        """Stop serving and publishing (sockets removed, slices left); safe more than once."""
        if self._plugin is not None:
            self._plugin.stop()
        if self._status is not None:
            self._status.stop()
        if self._events is not None:
            self._events.close()
        if self._stop_metrics is not None:
            self._stop_metrics()
            self._stop_metrics = None


def _published_slices(store: SliceStore) -> list[ResourceSlice]:
    """The slices published before this start (their taints carry over), or none."""
    from dra_gpu.kube import errors

    try:
        return store.list_slices()
    except errors.ApiError as err:
        log.warning(
            "cannot read the published slices; taints from before a restart are lost: %s", err
        )
        return []


def platform_of(settings: plugin_settings.Settings) -> Platform:
    """Real or simulated GPUs, decided once for the process (``platforms``)."""
    from pathlib import PurePosixPath

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
    poster: EventPoster,
    driver_gate: Callable[[], str | None] | None = None,
    mig: DynamicMig | None = None,
) -> DeviceState:
    """The prepare/unprepare state of this node (:class:`KubeletPlugin` restores it before
    serving it).

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
        sharing=Switches.of(settings.sharing_strategies),
        inventory=inventory,
        client=client,
        poster=poster,
        call_lock=(
            call_lock.NodeCallLock(plugin_settings.socket_paths(settings).lock)
            if settings.rolling_update
            else contextlib.nullcontext
        ),
        mig=mig if mig is not None else dynamic_mig(settings, platform),
        driver_gate=driver_gate,
    )


def dynamic_mig(
    settings: plugin_settings.Settings, platform: Platform, *, keep_ahead: bool = False
) -> DynamicMig | None:
    """What creates and destroys MIG devices on a node set to ``--mig-mode=dynamic``;
    ``keep_ahead``: the binder runs (MIG devices made before binding are its to repair)."""
    if settings.mig_mode != "dynamic":
        return None
    from dra_gpu.mig.dynamic import DynamicMig

    return DynamicMig(
        state_dir=settings.state_dir,
        instances=platform.mig_instances(settings.state_dir),
        keep_ahead=keep_ahead,
    )
