"""The devices this node has now: one owner, told by re-discovery, read by everyone else.

Re-discovery (``inventory.Watcher``) calls :meth:`Inventory.set`; the health monitor (which
feeds the publisher and the kubelet's health stream, adding the devices' faults) subscribes to
changes; prepare looks devices up by name (:meth:`Inventory.by_name`). Each change is one
immutable snapshot, so readers on other threads never see half an update.

No lock: the listeners subscribe during start-up, before re-discovery starts, and ``set`` is
called by re-discovery's one thread, which tells the listeners in order. (A lock here was held
while the listeners ran, and they read the checkpoint: file I/O under a listener's lock.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from dra_gpu.devices.model import Device

Listener = Callable[[Sequence[Device]], None]


class Inventory:
    def __init__(self, devices: Sequence[Device]) -> None:
        self._listeners: list[Listener] = []
        self._devices: tuple[Device, ...] = ()
        self._by_name: Mapping[str, Device] = {}
        self._store(devices)

    def _store(self, devices: Sequence[Device]) -> None:
        self._devices = tuple(devices)
        self._by_name = MappingProxyType({d.name: d for d in self._devices})

    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def by_name(self) -> Mapping[str, Device]:
        return self._by_name

    def subscribe(self, listener: Listener) -> None:
        """``listener`` hears of every later change, in the order of subscription (start-up
        only: before re-discovery runs)."""
        self._listeners.append(listener)

    def set(self, devices: Sequence[Device]) -> None:
        """The devices changed: keep them, then tell the subscribers (on this thread, the one
        re-discovery thread, so they hear of the changes one at a time and in order)."""
        self._store(devices)
        for listener in self._listeners:
            listener(self._devices)
