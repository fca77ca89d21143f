"""Turns GPU health events into taints and health-stream faults, and clears them again.

Design:
- One lock guards the inventory and the faults (``device_taints.Faults``). Each change is
  handed to ``publish`` (the node plugin: slices + health stream) with the taints and fault
  messages of every device, so the ResourceSlices and the kubelet's view say the same.
- Events arrive from NVML's event loop (``submit``, any thread) and from the command file
  (``health_events``): injected events (simulated nodes only) and administrators' clears.
- ``run`` reads the command file every ``poll_s`` and once a second looks for GPUs that have
  been quiet for the quiet period; those recover if they are still discovered and their
  ``probe`` succeeds (a lost GPU never recovers).
- Every ``driver_look_s`` ``run`` also looks at the kernel driver (``driver_probe``) and feeds
  ``driver_outage``'s state machine: while the driver is out every device carries the
  ``driver-unavailable`` taint and :meth:`refusal` tells prepare why new claims wait; once it
  is back, re-discovery (which asks :meth:`wants_rediscovery` every second) publishes the
  devices as they are now, :meth:`set_devices` ends the outage, and ``on_driver`` hears of its
  beginning and its end (the Node's Events and /metrics), outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from dra_gpu.devices import health_rules
from dra_gpu.devices.health_events import FILE_NAME, Clear, CommandFile, HealthEvent, Injected
from dra_gpu.devices.model import Device
from dra_gpu.kube.objects import ResourceSlice
from dra_gpu.plugin import device_taints, driver_outage
from dra_gpu.plugin.platforms import DriverProbe
from dra_gpu.plugin.settings import Settings

if TYPE_CHECKING:
    from dra_gpu.devices.nvml_events import NvmlEventLoop
    from dra_gpu.plugin.node_plugin import NodePlugin

log = logging.getLogger(__name__)

JSON = device_taints.JSON
Publish = Callable[..., None]  # NodePlugin.set_devices
Probe = Callable[[str], bool]  # GPU UUID -> it answers
OnDriver = Callable[[driver_outage.Change], None]
# How often the driver is looked at: an unloaded driver is tainted within seconds. On NVML a
# look is nvmlInit, two version queries and nvmlShutdown.
DRIVER_LOOK_S = 2.0


class EventSource(Protocol):
    def start(self, stop: threading.Event) -> object: ...


class HealthMonitor:
    def __init__(
        self,
        *,
        rules: health_rules.Rules,
        driver: str,
        devices: Sequence[Device],
        publish: Publish,
        probe: Probe,
        commands: CommandFile | None,
        accept_injected: bool,
        clock: Callable[[], float] = time.time,
        poll_s: float = 0.2,
        source: EventSource | None = None,
        faults: device_taints.Faults | None = None,
        driver_probe: DriverProbe | None = None,
        rediscovers: bool = True,
        on_driver: OnDriver | None = None,
        driver_look_s: float = DRIVER_LOOK_S,
    ) -> None:
        self._rules = rules
        self._driver = driver
        self._publish = publish
        self._probe = probe
        self._commands = commands
        self._accept_injected = accept_injected
        self._clock = clock
        self._poll_s = poll_s
        self._source = source
        self._lock = threading.RLock()
        self._devices: list[Device] = list(devices)
        self._in_use: Collection[str] | None = None
        self._faults: device_taints.Faults = faults or {}
        self._seen: dict[tuple[str, str], int] = {}  # (GPU UUID, event kind) -> events
        self._driver_probe = driver_probe
        self._rediscovers = rediscovers
        self._on_driver = on_driver
        self._driver_look_s = driver_look_s
        self._outage: driver_outage.State = driver_outage.Loaded()
        # Set under the lock, read without it by prepare's threads (one reference, read
        # whole): a prepare never waits for a publish in progress to learn the driver is out.
        self._refusal: str | None = None
        # Device name -> taints from elsewhere than GPU health: dynamic MIG placements the GPU
        # refused before binding (``mig_binding``), so the scheduler allocates another one.
        self._other_taints: dict[str, list[JSON]] = {}

    @property
    def faults(self) -> device_taints.Faults:
        with self._lock:
            return self._faults

    @property
    def driver_state(self) -> driver_outage.State:
        with self._lock:
            return self._outage

    def refusal(self) -> str | None:
        """Why a new prepare must wait for the driver now, or None (prepare's gate)."""
        return self._refusal

    def wants_rediscovery(self) -> bool:
        """Whether the driver is back and its devices wait for a re-discovery (re-discovery
        asks this every second, and then discovers at once, changed or not)."""
        with self._lock:
            return isinstance(self._outage, driver_outage.Back)

    def set_devices(self, devices: Sequence[Device], *, in_use: Collection[str] | None) -> None:
        """A new inventory (from re-discovery): published with the faults of its GPUs; after
        a driver outage, the end of it (its taint goes in the same publish)."""
        with self._lock:
            self._devices, self._in_use = list(devices), in_use
            change = self._driver_to_locked(
                driver_outage.rediscovered(self._outage, now=self._clock())
            )
            self._publish_locked()
        self._tell(change)

    def look_at_driver(self) -> driver_outage.Change | None:
        """One look at the kernel driver (outside the lock: NVML calls); publish when the
        outage's taint comes or goes."""
        if self._driver_probe is None:
            return None
        status = self._driver_probe()
        with self._lock:
            before = driver_outage.fault(self._outage)
            change = self._driver_to_locked(
                driver_outage.look(
                    self._outage, status, now=self._clock(), rediscovers=self._rediscovers
                )
            )
            if driver_outage.fault(self._outage) != before:
                self._publish_locked()
        self._tell(change)
        return change

    def _driver_to_locked(
        self, moved: tuple[driver_outage.State, driver_outage.Change | None]
    ) -> driver_outage.Change | None:
        self._outage, change = moved
        self._refusal = driver_outage.refusal(self._outage)
        return change

    def _tell(self, change: driver_outage.Change | None) -> None:
        if change is None:
            return
        reason, message = driver_outage.describe(change)
        if isinstance(change, driver_outage.Began):
            log.error("%s: %s", reason, message)
        else:
            log.warning("%s: %s", reason, message)
        if self._on_driver is not None:
            self._on_driver(change)

    def set_other_taints(self, taints: Mapping[str, Sequence[JSON]]) -> None:
        """Taints of devices for reasons other than their GPU's health (published with the
        health taints; a device keeps at most the API's 16)."""
        with self._lock:
            new = {name: list(t) for name, t in taints.items() if t}
            if new == self._other_taints:
                return
            self._other_taints = new
            self._publish_locked()

    def _publish_locked(self) -> None:
        outage = driver_outage.fault(self._outage)
        taints = device_taints.device_taints(self._driver, self._devices, self._faults, outage)
        for name, more in self._other_taints.items():
            taints[name] = [*taints.get(name, []), *more][: device_taints.MAX_TAINTS_PER_DEVICE]
        self._publish(
            self._devices,
            in_use=self._in_use,
            taints=taints,
            faults=device_taints.device_messages(self._devices, self._faults, outage),
        )

    def event_counts(self) -> dict[tuple[str, str], int]:
        """(GPU UUID, event kind) -> events seen since start, taken or ignored (for /metrics)."""
        with self._lock:
            return dict(self._seen)

    def submit(self, event: HealthEvent) -> None:
        """One event on a GPU: taint its devices if the rules say so."""
        with self._lock:
            key = (event.gpu, event.kind)
            self._seen[key] = self._seen.get(key, 0) + 1
        try:
            rule = self._rules.classify(event.kind, event.code)
        except health_rules.HealthConfigError as err:
            log.error("GPU %s: %s", event.gpu, err)
            return
        what = f"XID {event.code}" if event.kind == health_rules.XID else event.kind
        with self._lock:
            before = self._faults
            self._faults = device_taints.record(before, event, rule)
            if self._faults is before:
                log.info("GPU %s: %s (%s): ignored", event.gpu, what, rule.reason)
                return
            log.warning("GPU %s: %s (%s): tainted %s", event.gpu, what, rule.reason, rule.effect)
            self._publish_locked()

    def clear(self, gpu: str, *, why: str) -> bool:
        with self._lock:
            if gpu not in self._faults:
                return False
            self._faults = device_taints.clear(self._faults, gpu)
            log.warning("GPU %s: taints cleared (%s)", gpu, why)
            self._publish_locked()
            return True

    def read_commands(self) -> None:
        if self._commands is None:
            return
        for line, command in self._commands.read():
            if isinstance(command, Exception):
                log.error("%s: ignored line %r: %s", self._commands.path, line, command)
                continue
            with self._lock:
                gpu = device_taints.gpu_of(self._devices, command.device)
            if gpu is None:
                log.error("%s: no device %r on this node", self._commands.path, command.device)
            elif isinstance(command, Clear):
                if not self.clear(gpu, why=f"cleared by an administrator through {command.device}"):
                    log.info("GPU %s: nothing to clear", gpu)
            elif isinstance(command, Injected) and not self._accept_injected:
                log.error(
                    "%s: injected events are accepted only on simulated nodes, ignored %r",
                    self._commands.path,
                    line,
                )
            else:
                self.submit(HealthEvent(gpu, command.kind, command.code, self._clock()))

    def recover(self) -> list[str]:
        """Clear the GPUs that have been quiet long enough and answer their probe."""
        with self._lock:
            faults, devices = self._faults, self._devices
        discovered = {d.gpu.uuid for d in devices}

        def healthy(gpu: str) -> bool:
            return gpu in discovered and self._probe(gpu)

        back = device_taints.recovered(
            faults, now=self._clock(), quiet_s=self._rules.quiet_period_s, healthy=healthy
        )
        quiet_s = self._rules.quiet_period_s
        cleared = []
        with self._lock:  # an event may have come in while the probes ran
            now = self._clock()
            for gpu in back:
                if all(now - f.last >= quiet_s for f in self._faults.get(gpu, {}).values()):
                    self.clear(gpu, why=f"quiet for {quiet_s:g}s and probed healthy")
                    cleared.append(gpu)
        return cleared

    def run(self, stop: threading.Event) -> None:
        last_recovery = last_look = 0.0
        while not stop.wait(self._poll_s):
            try:
                self.read_commands()
                if time.monotonic() - last_look >= self._driver_look_s:
                    last_look = time.monotonic()
                    self.look_at_driver()
                if time.monotonic() - last_recovery >= 1.0:
                    last_recovery = time.monotonic()
                    self.recover()
            except Exception:
                log.exception("device health monitor failed; continuing")

    def start(self, stop: threading.Event) -> None:
        """Start the monitor's thread and its event source's (NVML)."""
        if self._source is not None:
            self._source.start(stop)
        thread = threading.Thread(target=self.run, args=(stop,), name="health-monitor", daemon=True)
        thread.start()


def for_plugin(
    settings: Settings,
    *,
    rules: health_rules.Rules,
    devices: Sequence[Device],
    plugin: NodePlugin,
    published: Sequence[ResourceSlice],
    driver_probe: DriverProbe | None = None,
    rediscovers: bool = True,
    on_driver: OnDriver | None = None,
) -> HealthMonitor:
    """The monitor of a plugin about to start: NVML's events on real GPUs, injected ones on
    simulated GPUs; the command file in the state directory on both. ``published``: the slices
    an earlier instance left, whose taints are restored (and published again before start).
    ``driver_probe``, ``rediscovers``, ``on_driver``: the driver's outages (``HealthMonitor``)."""
    simulated = settings.simulate is not None
    loop: NvmlEventLoop | None = None
    if not simulated:
        from dra_gpu.devices.nvml_events import NvmlEventLoop

        def on_event(event: HealthEvent) -> None:
            monitor.submit(event)

        loop = NvmlEventLoop(on_event=on_event, driver_root=settings.driver_root)
    monitor = HealthMonitor(
        rules=rules,
        driver=settings.driver_name,
        devices=devices,
        publish=plugin.set_devices,
        probe=loop.probe if loop is not None else lambda gpu: True,
        commands=CommandFile(settings.state_dir / FILE_NAME),
        accept_injected=simulated,
        source=loop,
        faults=device_taints.restore(
            published, driver=settings.driver_name, devices=devices, now=time.time()
        ),
        driver_probe=driver_probe,
        rediscovers=rediscovers,
        on_driver=on_driver,
    )
    if monitor.faults:
        log.warning(
            "restored the taints of GPUs %s from the published slices", sorted(monitor.faults)
        )
        monitor.set_devices(devices, in_use=None)
    return monitor
