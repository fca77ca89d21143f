"""What the node has to publish: discovery through a backend, and re-discovery on change.

- The backend is the platform's (``platforms``: a simulated profile or NVML). Discovery errors
  of single GPUs are logged and those GPUs left out; they never stop the plugin.
- ``Watcher`` re-discovers periodically and tells a listener when the devices changed:
  - a profile *file* every second, by its modification time, size and inode, so a test or a
    demo can change the node's inventory while the plugin runs; a file that no longer parses is
    reported and the last good inventory kept;
  - NVML every ``--rediscover-interval`` (60 s by default), so an administrator's MIG change
    and a GPU that stops answering reach the ResourceSlices without a restart. A change is
    published only once two discoveries in a row agree, so one failed NVML call does not take
    devices out and put them back a minute later. Single-GPU errors are logged when they start
    and when they end, not on every pass.
- A re-discovery that cannot use NVML at all (the driver unloaded for an upgrade) changes
  nothing: the devices stay published, and the health monitor taints them while the driver is
  out (``driver_outage``). Once the driver is back the monitor wants the devices as they are
  now: ``Watcher`` asks ``urgent`` every second and then discovers at once (a profile file
  changed or not) and tells the listener even when nothing changed, which ends the outage.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dra_gpu.devices import naming
from dra_gpu.devices.model import Device, Discovery, GpuBackend

# InventoryError is raised here too; defined with the platforms, which import nothing of this.
from dra_gpu.plugin.platforms import InventoryError as InventoryError
from dra_gpu.plugin.platforms import NvmlObserver, Platform

log = logging.getLogger(__name__)

Listener = Callable[[Sequence[Device]], None]


def backend_for(
    platform: Platform,
    *,
    observe: NvmlObserver | None = None,
    mig_dynamic: bool = False,
) -> GpuBackend:
    """The platform's backend (each NVML call reported to ``observe``); with ``mig_dynamic``
    MIG GPUs are published as partitions; raises InventoryError."""
    backend = platform.backend(observe=observe)
    if not mig_dynamic:
        return backend
    from dra_gpu.devices.partitions import DynamicMigBackend

    return DynamicMigBackend(backend)


def discover(backend: GpuBackend) -> list[Device]:
    devices, errors = discover_with_errors(backend)
    log_errors(errors)
    return devices


def log_errors(now: Iterable[str], before: Iterable[str] = ()) -> None:
    """Log the GPU errors that are new since ``before``, and those that went away."""
    now, before = frozenset(now), frozenset(before)
    for error in sorted(now - before):
        log.error("GPU discovery: %s (left out of the published devices)", error)
    for error in sorted(before - now):
        log.warning("GPU discovery recovered from: %s", error)


class NvmlUnavailable(InventoryError):
    """A re-discovery found NVML unusable as a whole: the last inventory stays published."""


def rediscover(backend: GpuBackend) -> tuple[list[Device], tuple[str, ...]]:
    """``discover_with_errors`` for re-discovery; raises NvmlUnavailable when the backend as a
    whole failed (no GPU read), so that an unloaded driver does not unpublish every device."""
    found = backend.discover()
    whole = [e for e in found.errors if e.index is None]
    if whole and not found.gpus:
        raise NvmlUnavailable(f"{whole[0]}; the last inventory stays published")
    return _named(found)


def discover_with_errors(backend: GpuBackend) -> tuple[list[Device], tuple[str, ...]]:
    """The devices, and the errors of GPUs left out; raises InventoryError."""
    return _named(backend.discover())


def _named(found: Discovery) -> tuple[list[Device], tuple[str, ...]]:
    try:
        return naming.build_devices(found.gpus), tuple(str(e) for e in found.errors)
    except ValueError as err:
        raise InventoryError(f"cannot name the discovered devices: {err}") from err


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


# force -> the devices now, or None when there is nothing new to look at (never with force)
Poll = Callable[[bool], Sequence[Device] | None]
URGENT_TICK_S = 1.0  # how often ``urgent`` is asked


def _never() -> bool:
    return False


class Watcher:
    """Calls ``poll`` every ``interval_s`` and tells the listener when the devices changed.

    ``poll`` returns the devices now, or None when there is nothing new to look at; it may
    raise InventoryError (logged, the last inventory stays). ``confirm`` is how many polls in a
    row must return the same new devices before the listener hears of them. ``urgent`` is asked
    every second: when True, a poll runs at once, forced, and the listener hears of its devices
    whether they changed or not (see the module docstring).
    """

    def __init__(
        self,
        *,
        poll: Poll,
        listener: Listener,
        current: Sequence[Device],
        interval_s: float,
        confirm: int = 1,
        what: str,
        urgent: Callable[[], bool] = _never,
    ) -> None:
        self._poll = poll
        self._listener = listener
        self._current = list(current)
        self._interval_s = interval_s
        self._confirm = confirm
        self.what = what
        self._urgent = urgent
        self._candidate: list[Device] | None = None
        self._seen = 0

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name="inventory-watch", daemon=True
        )
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        last = time.monotonic()
        while not stop.wait(min(self._interval_s, URGENT_TICK_S)):
            try:
                urgent = self._urgent()
                if urgent or time.monotonic() - last >= self._interval_s:
                    last = time.monotonic()
                    self.check(urgent=urgent)
            except Exception:
                # A bug or an unexpected library error must not end re-discovery for good.
                log.exception("%s: re-discovery failed", self.what)

    def check(self, *, urgent: bool = False) -> bool:
        """One poll; True when the listener was told of the devices (new ones, or any when
        ``urgent``)."""
        try:
            polled = self._poll(urgent)
        except InventoryError as err:
            log.error("%s cannot be used: %s", self.what, err)
            return False
        if polled is None:
            return False
        devices = list(polled)
        if urgent:
            log.info("%s discovered at once: %d devices", self.what, len(devices))
            self._current, self._candidate, self._seen = devices, None, 0
            self._listener(devices)
            return True
        if devices == self._current:
            self._candidate, self._seen = None, 0
            return False
        if devices != self._candidate:
            self._candidate, self._seen = devices, 0
        self._seen += 1
        if self._seen < self._confirm:
            return False
        log.info("%s changed: %d devices (were %d)", self.what, len(devices), len(self._current))
        self._current, self._candidate, self._seen = devices, None, 0
        self._listener(devices)
        return True


def file_poll(path: Path, discover_now: Callable[[], Sequence[Device]]) -> Poll:
    """Re-discovers (``discover_now``) from a simulated profile file when the file changed
    (or when forced)."""
    seen = _signature(path)

    def poll(force: bool) -> Sequence[Device] | None:
        nonlocal seen
        signature = _signature(path)
        if signature is None or (signature == seen and not force):
            return None
        seen = signature
        return discover_now()

    return poll


def backend_poll(backend: GpuBackend, *, reported: Sequence[str] = ()) -> Poll:
    """Re-discovers through ``backend``; logs a GPU's error when it starts and when it ends.

    ``reported``: the errors already logged (at start). Raises NvmlUnavailable.
    """
    before = tuple(reported)

    def poll(force: bool) -> Sequence[Device]:
        nonlocal before
        devices, errors = rediscover(backend)
        log_errors(errors, before)
        before = errors
        return devices

    return poll


def _discover_profile(backend: GpuBackend) -> list[Device]:
    devices, errors = rediscover(backend)
    log_errors(errors)
    return devices


def watcher_for(
    platform: Platform,
    *,
    backend: GpuBackend,
    current: Sequence[Device],
    errors: Sequence[str],
    listener: Listener,
    rediscover_interval_s: float | None,
    mig_dynamic: bool = False,
    urgent: Callable[[], bool] = _never,
) -> Watcher | None:
    """What keeps the inventory fresh (a profile file's watcher, NVML's), or None.

    ``urgent``: when to discover at once (the health monitor's ``wants_rediscovery``)."""
    how = platform.rediscovery(rediscover_interval_s)
    if how is None:
        return None
    poll = (
        backend_poll(backend, reported=errors)
        if how.changed_file is None
        else file_poll(
            how.changed_file,
            lambda: _discover_profile(backend_for(platform, mig_dynamic=mig_dynamic)),
        )
    )
    return Watcher(
        poll=poll,
        listener=listener,
        current=current,
        interval_s=how.interval_s,
        confirm=how.confirm,
        what=how.what,
        urgent=urgent,
    )
