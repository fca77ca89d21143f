"""The health feed behind the kubelet's health stream, as discovery changes (no grpc).

Cases: devices start HEALTHY; a device discovery lost turns UNHEALTHY with the reason and keeps
the time it was lost across further changes; it is HEALTHY again once found again; a lost device
no prepared claim uses leaves the list.
"""

from __future__ import annotations

from dra_gpu.kubeletplugin.device_health import GONE, HEALTHY, UNHEALTHY, DeviceState, HealthFeed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_lost_device_is_unhealthy_until_found_again() -> None:
    clock = Clock()
    feed = HealthFeed(pool="node-a", clock=clock)
    feed.set_devices(["gpu-0", "gpu-1"])
    assert feed.snapshot().devices == {
        "gpu-0": DeviceState(HEALTHY, 1000),
        "gpu-1": DeviceState(HEALTHY, 1000),
    }

    clock.now = 1060
    feed.set_devices(["gpu-0"])
    assert feed.snapshot().devices["gpu-1"] == DeviceState(UNHEALTHY, 1060, GONE)

    clock.now = 1120
    feed.set_devices(["gpu-0", "gpu-2"])
    devices = feed.snapshot().devices
    assert devices["gpu-1"] == DeviceState(UNHEALTHY, 1060, GONE), "lost since the first time"
    assert devices["gpu-0"] == DeviceState(HEALTHY, 1000)
    assert devices["gpu-2"] == DeviceState(HEALTHY, 1120)

    clock.now = 1180
    feed.set_devices(["gpu-0", "gpu-1", "gpu-2"])
    assert feed.snapshot().devices["gpu-1"] == DeviceState(HEALTHY, 1180)


def test_a_lost_device_nobody_uses_leaves_the_list() -> None:
    feed = HealthFeed(pool="node-a", clock=Clock())
    feed.set_devices(["gpu-0", "gpu-1", "gpu-2"])
    feed.set_devices(["gpu-0"], in_use={"gpu-2"})
    assert set(feed.snapshot().devices) == {"gpu-0", "gpu-2"}
    assert feed.snapshot().devices["gpu-2"].health == UNHEALTHY
