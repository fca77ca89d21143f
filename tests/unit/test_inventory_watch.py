"""Re-discovery while the plugin runs (``dra_gpu.plugin.inventory.Watcher``).

Cases: NVML-style watching publishes a change only after two discoveries in a row agree, so a
GPU that fails one NVML pass is not taken out and put back; a lasting loss and a recovery are
published; a GPU's discovery error is logged when it starts and when it ends, not every pass;
an unusable discovery keeps the last inventory; a profile file is re-read only when it changed;
which watcher a node gets (file, NVML, none).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from dra_gpu.devices import naming, simulated
from dra_gpu.devices.model import Device, Discovery, DiscoveryError
from dra_gpu.plugin import inventory, platforms
from e2e import waiting

GPUS = (
    simulated.SimulatedBackend(profile=simulated.BUILTIN_PROFILES["h200x8"], node_name="n")
    .discover()
    .gpus
)
ALL = naming.build_devices(GPUS)


class ScriptedBackend:
    """Answers each discovery with the next scripted pass: how many GPUs answered."""

    def __init__(self, *passes: int) -> None:
        self.passes = list(passes)

    def discover(self) -> Discovery:
        answered = self.passes.pop(0)
        errors = tuple(
            DiscoveryError(index=i, message="GPU is lost") for i in range(answered, len(GPUS))
        )
        return Discovery(gpus=GPUS[:answered], errors=errors)


class Heard:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, devices: Sequence[Device]) -> None:
        self.calls.append([d.name for d in devices])


def nvml_watcher(backend: ScriptedBackend, heard: Heard) -> inventory.Watcher:
    watcher = inventory.watcher_for(
        platforms.for_node(simulate=None, node_name="n"),
        backend=backend,
        current=ALL,
        errors=(),
        listener=heard,
        rediscover_interval_s=60.0,
    )
    assert watcher is not None
    return watcher


def test_one_failed_pass_does_not_take_a_gpu_out() -> None:
    heard = Heard()
    watcher = nvml_watcher(ScriptedBackend(7, 8, 7, 8), heard)
    assert [watcher.check() for _ in range(4)] == [False] * 4
    assert heard.calls == []


def test_a_lasting_loss_and_the_recovery_are_published() -> None:
    heard = Heard()
    watcher = nvml_watcher(ScriptedBackend(7, 7, 7, 8, 8), heard)
    assert [watcher.check() for _ in range(5)] == [False, True, False, False, True]
    assert heard.calls == [[d.name for d in ALL[:7]], [d.name for d in ALL]]


def test_a_gpu_error_is_logged_when_it_starts_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watcher = nvml_watcher(ScriptedBackend(7, 7, 7, 8), Heard())
    with caplog.at_level(logging.INFO, logger=inventory.__name__):
        for _ in range(4):
            watcher.check()
    lost = [r for r in caplog.records if "GPU index 7: GPU is lost" in r.getMessage()]
    assert [r.levelno for r in lost] == [logging.ERROR, logging.WARNING]
    assert "recovered" in lost[1].getMessage()


def test_an_unusable_discovery_keeps_the_last_inventory(caplog: pytest.LogCaptureFixture) -> None:
    def broken(force: bool) -> Sequence[Device]:
        raise inventory.InventoryError("NVML library not found")

    heard = Heard()
    watcher = inventory.Watcher(
        poll=broken, listener=heard, current=ALL, interval_s=1.0, what="NVML inventory"
    )
    assert watcher.check() is False
    assert heard.calls == []
    assert "NVML inventory cannot be used: NVML library not found" in caplog.text


def test_an_unexpected_error_does_not_end_the_watch(caplog: pytest.LogCaptureFixture) -> None:
    answers: list[Sequence[Device] | Exception] = [RuntimeError("NVML: Unknown Error"), ALL[:7]]

    def poll(force: bool) -> Sequence[Device]:
        answer = answers.pop(0) if answers else ALL[:7]
        if isinstance(answer, Exception):
            raise answer
        return answer

    heard = Heard()
    stop = threading.Event()
    watcher = inventory.Watcher(
        poll=poll, listener=heard, current=ALL, interval_s=0.01, what="NVML inventory"
    )
    thread = watcher.start(stop)
    try:
        waiting.wait_for("the change after the error", lambda: heard.calls, timeout=10, every=0.01)
    finally:
        stop.set()
        thread.join(5)
    assert heard.calls[0] == [d.name for d in ALL[:7]]
    assert "NVML inventory: re-discovery failed" in caplog.text


def test_a_profile_file_is_read_again_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("gpus:\n  - product: H200-141GB\n    count: 2\n")
    platform = platforms.for_node(simulate=str(path), node_name="n")
    poll = inventory.file_poll(path, lambda: inventory.discover(inventory.backend_for(platform)))
    assert poll(False) is None
    path.write_text("gpus:\n  - product: H200-141GB\n    count: 3  # one more\n")
    devices = poll(False)
    assert devices is not None and [d.name for d in devices] == ["gpu-0", "gpu-1", "gpu-2"]
    assert poll(False) is None
    forced = poll(True)  # the driver is back: discovered though the file did not change
    assert forced is not None and [d.name for d in forced] == ["gpu-0", "gpu-1", "gpu-2"]


class Unloaded:
    """A backend whose driver is unloaded: NVML as a whole fails, no GPU is read."""

    def discover(self) -> Discovery:
        message = "NVML could not be initialised: nvmlInit: Driver Not Loaded"
        return Discovery(gpus=(), errors=(DiscoveryError(None, message),))


def test_an_unloaded_driver_keeps_the_devices_published(caplog: pytest.LogCaptureFixture) -> None:
    heard = Heard()
    watcher = inventory.Watcher(
        poll=inventory.backend_poll(Unloaded()),
        listener=heard,
        current=ALL,
        interval_s=1.0,
        confirm=2,
        what="NVML inventory",
    )
    assert [watcher.check() for _ in range(3)] == [False] * 3
    assert heard.calls == []  # not an empty inventory: the devices stay (tainted by the monitor)
    assert "Driver Not Loaded; the last inventory stays published" in caplog.text


def test_a_profile_file_with_the_driver_unloaded_keeps_the_devices(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("gpus:\n  - product: H200-141GB\n    count: 2\n")
    platform = platforms.for_node(simulate=str(path), node_name="n")
    heard = Heard()
    watcher = inventory.watcher_for(
        platform,
        backend=inventory.backend_for(platform),
        current=ALL[:2],
        errors=(),
        listener=heard,
        rediscover_interval_s=None,
    )
    assert watcher is not None
    path.write_text("driverLoaded: false\ngpus:\n  - product: H200-141GB\n    count: 2\n")
    assert watcher.check() is False
    assert heard.calls == []


def test_an_urgent_check_tells_the_listener_even_without_a_change() -> None:
    heard = Heard()
    watcher = nvml_watcher(ScriptedBackend(8, 8), heard)
    assert watcher.check() is False  # the same devices: nothing to tell
    assert watcher.check(urgent=True) is True  # the driver is back: tell, changed or not
    assert heard.calls == [[d.name for d in ALL]]


def test_the_watch_discovers_at_once_when_urgent() -> None:
    heard = Heard()
    stop = threading.Event()
    urgent = threading.Event()  # the monitor's "the driver is back"
    watcher = inventory.Watcher(
        poll=lambda force: ALL if force else None,
        listener=heard,
        current=ALL,
        interval_s=3600.0,  # the regular pass never comes during the test
        what="NVML inventory",
        urgent=urgent.is_set,
    )
    thread = watcher.start(stop)
    try:
        assert heard.calls == []
        urgent.set()
        waiting.wait_for("the urgent discovery", lambda: heard.calls, timeout=10, every=0.05)
    finally:
        stop.set()
        thread.join(5)
    assert heard.calls[0] == [d.name for d in ALL]


@pytest.mark.parametrize(
    ("simulate", "interval", "expected"),
    [
        (None, 60.0, "NVML inventory"),
        (None, None, None),
        ("h200x8", 60.0, None),
    ],
    ids=["nvml", "nvml-off", "built-in-profile"],
)
def test_which_watcher_a_node_gets(
    simulate: str | None, interval: float | None, expected: str | None
) -> None:
    watcher = inventory.watcher_for(
        platforms.for_node(simulate=simulate, node_name="n"),
        backend=ScriptedBackend(),
        current=ALL,
        errors=(),
        listener=Heard(),
        rediscover_interval_s=interval,
    )
    assert (watcher and watcher.what) == expected
