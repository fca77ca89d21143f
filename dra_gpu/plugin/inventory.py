"""What the node has to publish: discovery through a backend, and re-discovery on change.

- ``--simulate NAME`` uses a built-in simulated profile; ``--simulate PATH`` a profile file;
  otherwise NVML, loaded from under the driver root. Discovery errors of single GPUs are logged
  and those GPUs left out; they never stop the plugin.
- A profile *file* is polled (``FileWatcher``, default every second) by its modification time,
  size and inode, so a test or a demo can change the node's inventory while the plugin runs. A
  file that no longer parses is reported and the last good inventory kept.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from dra_gpu.devices import naming
from dra_gpu.devices.model import Device, GpuBackend

log = logging.getLogger(__name__)

Listener = Callable[[Sequence[Device]], None]


class InventoryError(RuntimeError):
    """Discovery cannot run at all (bad profile, NVML missing); the message says why."""


def backend_for(
    *, simulate: str | None, node_name: str, driver_root: Path = Path("/")
) -> GpuBackend:
    if simulate is None:
        from dra_gpu.devices import nvml  # pynvml only on real nodes

        return nvml.NvmlBackend(driver_root=driver_root)
    from dra_gpu.devices import simulated

    try:
        profile = simulated.resolve_profile(simulate)
    except simulated.ProfileError as err:
        raise InventoryError(str(err)) from err
    return simulated.SimulatedBackend(profile=profile, node_name=node_name)


def discover(backend: GpuBackend) -> list[Device]:
    found = backend.discover()
    for error in found.errors:
        log.error("GPU discovery: %s (left out of the published devices)", error)
    try:
        return naming.build_devices(found.gpus)
    except ValueError as err:
        raise InventoryError(f"cannot name the discovered devices: {err}") from err


def profile_file(simulate: str | None) -> Path | None:
    """The file behind ``--simulate``, or None for a built-in profile or NVML."""
    if simulate is None:
        return None
    from dra_gpu.devices import simulated

    if simulate in simulated.BUILTIN_PROFILES:
        return None
    return Path(simulate)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class FileWatcher:
    """Re-discovers when the simulated profile file changes and tells the listener."""

    def __init__(
        self, *, path: Path, node_name: str, listener: Listener, interval_s: float = 1.0
    ) -> None:
        self._path = path
        self._node_name = node_name
        self._listener = listener
        self._interval_s = interval_s
        self._seen = _signature(path)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name="inventory-watch", daemon=True
        )
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval_s):
            signature = _signature(self._path)
            if signature is None or signature == self._seen:
                continue
            self._seen = signature
            try:
                backend = backend_for(simulate=str(self._path), node_name=self._node_name)
                devices = discover(backend)
            except InventoryError as err:
                log.error("simulated profile %s changed but cannot be used: %s", self._path, err)
                continue
            log.info("simulated profile %s changed: %d devices", self._path, len(devices))
            self._listener(devices)
