"""Device health streams for the kubelet (``DRAResourceHealth``, v1alpha1 and v1).

Design:
- ``HealthFeed`` (no grpc) holds the current health of every published device and a version
  number that goes up on each change; streams wait on it.
- Each ``NodeWatchResources`` stream sends the complete list at once, again after every change,
  and again every ``resend_s`` as a heartbeat, so the kubelet never reaches
  ``health_check_timeout_seconds`` without news and marks devices Unknown.
- A stream holds one server thread for its life; it ends when the client goes away (the call's
  ``is_active()``) or the feed is closed at shutdown. Waits are short so a vanished client
  frees its thread soon.
- Devices start HEALTHY when discovery reports them. A device that the driver's re-discovery
  no longer finds turns UNHEALTHY and stays listed, while a prepared claim holds it, until it
  is found again.
- A device with a fault the driver reports (``HealthFeed.set_faults``) is UNHEALTHY with the
  fault as its message, until the driver clears it. Being gone wins over a fault: it says more.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

from dra_gpu.kubeletplugin.rpc_methods import CallContext, Method, serialize_message
from dra_gpu.pb import health_v1_pb2, health_v1alpha1_pb2

HEALTHY = "HEALTHY"
UNHEALTHY = "UNHEALTHY"
UNKNOWN = "UNKNOWN"
GONE = "discovery no longer finds this device"
TIMEOUT_S = 120


@dataclasses.dataclass(frozen=True)
class DeviceState:
    health: str
    updated: int  # unix seconds
    message: str = ""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    version: int
    pool: str
    devices: Mapping[str, DeviceState]


class HealthFeed:
    """Health of the devices of one pool; thread-safe."""

    def __init__(self, *, pool: str, clock: Any = time.time) -> None:
        self._pool = pool
        self._clock = clock
        self._cond = threading.Condition()
        self._devices: dict[str, DeviceState] = {}
        self._version = 0
        self._closed = False
        self._faults: dict[str, str] = {}  # device name -> why it is faulty

    def set_devices(self, names: Sequence[str], *, in_use: Collection[str] | None = None) -> None:
        """The discovered devices changed: new ones start HEALTHY, known ones keep their state.

        A device discovery no longer finds (hardware that stopped answering) stays in the
        list as UNHEALTHY while a pod may hold it (``in_use``; None: unknown, keep them all),
        so the kubelet shows it in that pod's status; a lost device nobody uses (e.g. a
        partition the administrator destroyed) leaves the list. A device found again is HEALTHY.
        """
        now = int(self._clock())
        with self._cond:
            old = self._devices
            fresh: dict[str, DeviceState] = {}
            for name in names:
                state = old.get(name)
                if state is None or state.message == GONE:
                    state = self._fault_state(name, now)
                fresh[name] = state
            gone = {
                name: state if state.message == GONE else DeviceState(UNHEALTHY, now, GONE)
                for name, state in old.items()
                if name not in fresh and (in_use is None or name in in_use)
            }
            self._devices = {**fresh, **gone}
            self._bump()

    def _fault_state(self, name: str, now: int) -> DeviceState:
        fault = self._faults.get(name)
        return DeviceState(HEALTHY, now) if fault is None else DeviceState(UNHEALTHY, now, fault)

    def set_faults(self, messages: Mapping[str, str]) -> None:
        """Faulty devices (name -> why) turn UNHEALTHY; those no longer faulty HEALTHY.

        A gone device stays as it is (it turns healthy or faulty when it is found again).
        """
        now = int(self._clock())
        with self._cond:
            messages = {name: text[:1024] for name, text in messages.items()}
            changed = False
            for name, state in self._devices.items():
                if state.message == GONE:
                    continue
                was = self._faults.get(name)
                if messages.get(name) != was:
                    self._devices[name] = DeviceState(
                        UNHEALTHY if name in messages else HEALTHY, now, messages.get(name, "")
                    )
                    changed = True
            self._faults = messages
            if changed:
                self._bump()

    def set(self, name: str, *, health: str, message: str = "") -> None:
        with self._cond:
            if name in self._devices:
                self._devices[name] = DeviceState(health, int(self._clock()), message[:1024])
                self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def snapshot(self) -> Snapshot:
        with self._cond:
            return Snapshot(self._version, self._pool, dict(self._devices))

    def wait_newer(self, version: int, timeout: float) -> Snapshot | None:
        """The state once its version exceeds ``version``; None on timeout or when closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._version > version, timeout)
            if self._closed or self._version <= version:
                return None
            return Snapshot(self._version, self._pool, dict(self._devices))

    @property
    def closed(self) -> bool:
        return self._closed


def _response(pb: ModuleType, snap: Snapshot) -> Any:
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=snap.pool, device_name=name),
                health=pb.HealthStatus.Value(state.health),
                last_updated_time=state.updated,
                health_check_timeout_seconds=TIMEOUT_S,
                message=state.message,
            )
            for name, state in sorted(snap.devices.items())
        ]
    )


def watch(
    feed: HealthFeed, pb: ModuleType, context: CallContext, *, resend_s: float
) -> Iterator[Any]:
    """The stream body shared by both API versions (their messages are wire-identical)."""
    snap = feed.snapshot()
    yield _response(pb, snap)
    last_sent = time.monotonic()
    while context.is_active() and not feed.closed:
        newer = feed.wait_newer(snap.version, timeout=1.0)
        if newer is not None:
            snap = newer
        elif time.monotonic() - last_sent < resend_s:
            continue
        yield _response(pb, snap)
        last_sent = time.monotonic()


def methods(feed: HealthFeed, *, resend_s: float = 30.0) -> list[Method]:
    """``NodeWatchResources`` of DRAResourceHealth v1 and v1alpha1."""

    def method(pb: ModuleType, service: str) -> Method:
        def handle(request: Any, context: CallContext) -> Iterator[Any]:
            return watch(feed, pb, context, resend_s=resend_s)

        return Method(
            f"/{service}/NodeWatchResources",
            pb.NodeWatchResourcesRequest.FromString,
            handle,
            serialize_message,
            streaming=True,
        )

    return [
        method(health_v1_pb2, "v1.DRAResourceHealth"),
        method(health_v1alpha1_pb2, "v1alpha1.DRAResourceHealth"),
    ]
