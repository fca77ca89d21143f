"""The GPU driver unloaded and loaded again (an upgrade) under the running plugin.

Cases: the state machine (``driver_outage``) from loaded to out to back to loaded, with the
outage's length and versions; a reload between two looks; a look that tells nothing; nothing
to re-discover. The taint on every device, besides a GPU's own faults, and never restored from
the slices. How each platform looks at the driver (NVML's init error; a simulated profile's
``driverLoaded``, read again each look). The health monitor: taints and refusal while out,
re-discovery wanted once back, the taint gone and the outage told once the devices were
re-discovered. Prepare: a new claim refused naming the driver state, a prepared claim still
answered from its record, its spec untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pynvml
import pytest
from fake_claims import FakeFetcher, claim, device_state, inventory, ref, result
from nvml_fakes import FakeGpu, FakeNvml

from dra_gpu.devices import health_events, health_rules
from dra_gpu.devices.health_events import Injected
from dra_gpu.devices.model import DriverStatus
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.devices.simulated import DRIVER_NOT_LOADED
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.plugin import device_taints, driver_outage, platforms
from dra_gpu.plugin import inventory as plugin_inventory
from dra_gpu.plugin.driver_outage import Back, Began, Ended, Loaded, Out
from dra_gpu.plugin.health_monitor import HealthMonitor
from dra_gpu.prepare import cdi

DRIVER = "gpu.nvidia.com"
T0 = 1_764_588_278.0  # 2025-12-01T11:24:38Z
OLD = DriverStatus(loaded=True, version="580.159.04", cuda_version="13.0")
NEW = DriverStatus(loaded=True, version="590.48.01", cuda_version="13.1")
GONE = DriverStatus(loaded=False, reason=DRIVER_NOT_LOADED)
KEY = f"{DRIVER}/{device_taints.DRIVER_UNAVAILABLE}"
A, B = ClaimUID("uid-a"), ClaimUID("uid-b")


# --- the state machine ---------------------------------------------------------------------


def test_an_upgrade_goes_out_comes_back_and_ends_with_the_rediscovery() -> None:
    state, change = driver_outage.look(Loaded(), OLD, now=T0)
    assert (state, change) == (Loaded("580.159.04", "13.0"), None)
    state, change = driver_outage.look(state, GONE, now=T0 + 2)
    assert state == Out(T0 + 2, DRIVER_NOT_LOADED, "580.159.04")
    assert change == Began(T0 + 2, DRIVER_NOT_LOADED, "580.159.04")
    assert driver_outage.look(state, GONE, now=T0 + 4) == (state, None)  # still out
    state, change = driver_outage.look(state, NEW, now=T0 + 30)
    assert state == Back(T0 + 2, DRIVER_NOT_LOADED, "580.159.04", "590.48.01", "13.1")
    assert change is None  # the taint stays until the devices are re-discovered
    assert driver_outage.rediscovered(Out(T0, "x", ""), now=T0 + 31)[1] is None
    state, change = driver_outage.rediscovered(state, now=T0 + 31)
    assert state == Loaded("590.48.01", "13.1")
    assert change == Ended(29.0, "580.159.04", "590.48.01", "13.1")
    assert driver_outage.rediscovered(state, now=T0 + 40) == (state, None)


def test_a_reload_between_two_looks_is_an_outage_too() -> None:
    state, change = driver_outage.look(Loaded("580.159.04", "13.0"), NEW, now=T0)
    assert isinstance(state, Back) and state.version == "590.48.01"
    assert change == Began(T0, "driver 580.159.04 replaced by 590.48.01", "580.159.04")


def test_gone_again_before_the_rediscovery_is_the_same_outage() -> None:
    back = Back(T0, DRIVER_NOT_LOADED, "580.159.04", "590.48.01", "13.1")
    state, change = driver_outage.look(back, GONE, now=T0 + 50)
    assert state == Out(T0, DRIVER_NOT_LOADED, "580.159.04") and change is None


def test_a_look_that_tells_nothing_changes_nothing() -> None:
    out = Out(T0, DRIVER_NOT_LOADED, "580.159.04")
    assert driver_outage.look(out, None, now=T0 + 9) == (out, None)
    assert driver_outage.look(Loaded(), None, now=T0) == (Loaded(), None)


def test_without_rediscovery_the_outage_ends_when_the_driver_answers() -> None:
    out = Out(T0, DRIVER_NOT_LOADED, "580.159.04")
    state, change = driver_outage.look(out, NEW, now=T0 + 12, rediscovers=False)
    assert state == Loaded("590.48.01", "13.1")
    assert change == Ended(12.0, "580.159.04", "590.48.01", "13.1")


def test_the_fault_and_the_refusal_name_the_driver_state() -> None:
    assert driver_outage.fault(Loaded()) is None and driver_outage.refusal(Loaded()) is None
    out = Out(T0, DRIVER_NOT_LOADED, "580.159.04")
    fault = driver_outage.fault(out)
    assert fault is not None
    assert (fault.key, fault.effect, fault.first) == ("driver-unavailable", "NoSchedule", T0)
    refused = driver_outage.refusal(out)
    assert refused is not None
    assert "unavailable since 2025-12-01T11:24:38Z (nvmlInit: Driver Not Loaded)" in refused
    assert "the kubelet retries" in refused
    back = Back(T0, DRIVER_NOT_LOADED, "580.159.04", "590.48.01", "13.1")
    assert driver_outage.fault(back) == fault  # the same taint: nothing re-published
    assert "590.48.01 was loaded again" in (driver_outage.refusal(back) or "")
    reason, message = driver_outage.describe(Ended(29.0, "580.159.04", "590.48.01", "13.1"))
    assert reason == "GpuDriverRestored"
    assert "after 29s: 580.159.04 -> 590.48.01 (CUDA 13.1)" in message


# --- taints ----------------------------------------------------------------------------------


def devices(profile: str = "a100x4-mig") -> list[Any]:
    return plugin_inventory.discover(
        plugin_inventory.backend_for(platforms.for_node(simulate=profile, node_name="n"))
    )


def test_the_outage_taints_every_device_beside_a_gpus_own_faults() -> None:
    devs = devices()
    outage = driver_outage.fault(Out(T0, DRIVER_NOT_LOADED, "580.159.04"))
    gpu1 = next(d for d in devs if d.name == "gpu-1-mig-2g10gb-14-0")
    event = health_events.HealthEvent(gpu1.gpu.uuid, "xid", 79, T0 - 60)
    faults = device_taints.record({}, event, health_rules.Rules().classify("xid", 79))
    taints = device_taints.device_taints(DRIVER, devs, faults, outage)
    assert sorted(taints) == sorted(d.name for d in devs)  # MIG devices included
    assert [t["key"] for t in taints["gpu-0"]] == [KEY]
    assert taints["gpu-0"][0] == {
        "key": KEY,
        "value": "nvmlinit-driver-not-loaded.20251201T112438Z",
        "effect": "NoSchedule",
        "timeAdded": "2025-12-01T11:24:38Z",
    }
    assert [t["key"] for t in taints[gpu1.name]] == [f"{DRIVER}/xid-79", KEY]  # NoExecute first
    messages = device_taints.device_messages(devs, faults, outage)
    assert messages["gpu-0"].startswith("driver-unavailable: nvmlInit: Driver Not Loaded")


def test_a_restart_does_not_restore_the_outage_taint() -> None:
    devs = devices("h200x8")
    outage = driver_outage.fault(Out(T0, DRIVER_NOT_LOADED, ""))
    taints = device_taints.device_taints(DRIVER, devs, {}, outage)
    from dra_gpu.kubeletplugin import slices

    published: Any = slices.build_resource_slices(
        devices=devs,
        driver_name=DRIVER,
        node_name="n",
        pool_generation=1,
        node_owner=None,
        taints=taints,
    )
    # the monitor looks at the driver again within seconds of the start
    assert device_taints.restore(published, driver=DRIVER, devices=devs, now=T0 + 60) == {}


# --- looking at the driver -------------------------------------------------------------------


def test_nvml_says_the_driver_is_not_loaded() -> None:
    fake = FakeNvml([FakeGpu(index=0, minor=0)])
    backend = NvmlBackend(nvml=fake)
    assert backend.driver_status() == OLD
    assert fake.calls == [
        "nvmlInit",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlShutdown",
    ]
    fake.fail[("nvmlInit", None)] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert backend.driver_status() == DriverStatus(loaded=False, reason=DRIVER_NOT_LOADED)
    fake.fail[("nvmlInit", None)] = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    status = backend.driver_status()
    assert not status.loaded and "version mismatch" in status.reason
    del fake.fail[("nvmlInit", None)]
    fake.fail[("nvmlSystemGetDriverVersion", None)] = pynvml.NVML_ERROR_UNKNOWN
    status = backend.driver_status()
    assert not status.loaded and "NVML system query failed" in status.reason
    assert fake.calls[-1] == "nvmlShutdown"  # initialised, so shut down again


def test_a_library_older_than_the_loaded_driver_fails_liveness_so_the_pod_restarts() -> None:
    """After a real upgrade the process keeps the old NVML library: only a restart loads the
    new one, so /healthz fails then (and not while the modules are merely out)."""
    fake = FakeNvml([FakeGpu(index=0, minor=0)])
    fake.fail[("nvmlInit", None)] = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    mismatch = NvmlBackend(nvml=fake).driver_status()
    state, _ = driver_outage.look(Loaded(OLD.version, OLD.cuda_version), mismatch, now=T0)
    why = driver_outage.restart_needed(state)
    assert why is not None and "version mismatch" in why and "restart" in why
    out, _ = driver_outage.look(Loaded(OLD.version, OLD.cuda_version), GONE, now=T0)
    assert driver_outage.restart_needed(out) is None  # modules out: wait, do not restart
    assert driver_outage.restart_needed(Loaded(NEW.version, NEW.cuda_version)) is None


PROFILE = (
    'driverVersion: "{version}"\ncudaDriverVersion: "{cuda}"\ndriverLoaded: {loaded}\n'
    "gpus:\n  - product: H200-141GB\n"
)


def test_a_simulated_profile_file_unloads_and_upgrades_the_driver(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(PROFILE.format(version="580.159.04", cuda="13.0", loaded="true"))
    platform = platforms.for_node(simulate=str(path), node_name="n")
    look = platform.driver()
    assert look() == OLD
    path.write_text(PROFILE.format(version="580.159.04", cuda="13.0", loaded="false"))
    assert look() == GONE
    discovery = platform.backend().discover()
    assert discovery.gpus == ()
    assert [(e.index, e.message) for e in discovery.errors] == [
        (None, "NVML could not be initialised: nvmlInit: Driver Not Loaded")
    ]
    path.write_text(PROFILE.format(version="590.48.01", cuda="13.1", loaded="true"))
    assert look() == NEW
    (gpu,) = platform.backend().discover().gpus
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("590.48.01", "13.1")
    path.write_text("gpus: [")  # half written: no news of the driver
    assert look() is None
    assert platforms.for_node(simulate="h200x8", node_name="n").driver()() == OLD


# --- the health monitor ----------------------------------------------------------------------


class Published:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, devices: Any, **kwargs: Any) -> None:
        self.calls.append(([d.name for d in devices], kwargs))

    @property
    def taints(self) -> dict[str, list[str]]:
        last = self.calls[-1][1]["taints"] if self.calls else {}
        return {name: [t["key"] for t in taints] for name, taints in last.items()}


class Looks:
    """The driver as each look finds it, the last one repeated."""

    def __init__(self, *statuses: DriverStatus | None) -> None:
        self.statuses = list(statuses)

    def __call__(self) -> DriverStatus | None:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def upgraded(devs: list[Any], version: str) -> list[Any]:
    """The devices as a re-discovery after the upgrade finds them."""
    from dataclasses import replace

    return [replace(d, gpu=replace(d.gpu, driver_version=version)) for d in devs]


def test_the_monitor_taints_refuses_and_ends_the_outage_after_the_rediscovery(
    tmp_path: Path,
) -> None:
    devs = devices("h200x8")
    published, clock = Published(), Clock()
    told: list[driver_outage.Change] = []
    looks = Looks(OLD, GONE, GONE, NEW)
    mon = HealthMonitor(
        rules=health_rules.Rules(),
        driver=DRIVER,
        devices=devs,
        publish=published,
        probe=lambda gpu: True,
        commands=health_events.CommandFile(tmp_path / health_events.FILE_NAME),
        accept_injected=True,
        clock=clock,
        driver_probe=looks,
        on_driver=told.append,
    )
    assert mon.look_at_driver() is None and published.calls == [] and mon.refusal() is None
    clock.now += 2
    assert isinstance(mon.look_at_driver(), Began)
    assert published.taints == {d.name: [KEY] for d in devs}
    assert "nvmlInit: Driver Not Loaded" in (mon.refusal() or "")
    assert not mon.wants_rediscovery()
    clock.now += 2
    calls = len(published.calls)
    assert mon.look_at_driver() is None and len(published.calls) == calls  # nothing new
    health_events.append(tmp_path / health_events.FILE_NAME, Injected("gpu-3", "xid", 79))
    mon.read_commands()  # a GPU's fault during the outage: both taints
    assert published.taints["gpu-3"] == [f"{DRIVER}/xid-79", KEY]
    clock.now += 26
    assert mon.look_at_driver() is None  # back: the taint stays until re-discovered
    assert mon.wants_rediscovery() and published.taints["gpu-0"] == [KEY]
    assert "590.48.01 was loaded again" in (mon.refusal() or "")
    clock.now += 1
    mon.set_devices(upgraded(devs, "590.48.01"), in_use={"gpu-0"})
    assert published.taints == {"gpu-3": [f"{DRIVER}/xid-79"]}  # the GPU's own fault stays
    assert mon.refusal() is None and not mon.wants_rediscovery()
    assert mon.driver_state == Loaded("590.48.01", "13.1")
    assert told == [
        Began(T0 + 2, DRIVER_NOT_LOADED, "580.159.04"),
        Ended(29.0, "580.159.04", "590.48.01", "13.1"),
    ]


# --- prepare ---------------------------------------------------------------------------------


def test_prepare_refuses_new_claims_and_answers_prepared_ones(tmp_path: Path) -> None:
    refusal: list[str | None] = [None]
    fetcher = FakeFetcher(
        claim("uid-a", [result("gpu-0")]),
        claim("uid-b", [result("gpu-1-mig-2g10gb-14-0")]),
    )
    state = device_state(
        tmp_path, devices=inventory(), claims=fetcher, driver_gate=lambda: refusal[0]
    )
    state.start()
    first = state.prepare([ref("uid-a")])[A]
    assert first.error == ""
    spec = cdi.spec_path(tmp_path / "cdi", A)
    written = spec.read_bytes()
    record = state.store.load().claims[A]

    refusal[0] = driver_outage.refusal(Out(T0, DRIVER_NOT_LOADED, "580.159.04"))
    refused = state.prepare([ref("uid-b")])[B]
    assert refused.kind == "DriverUnavailable"
    assert refused.error.startswith("claim default/claim-uid-b: the NVIDIA driver is unavailable")
    assert "(nvmlInit: Driver Not Loaded)" in refused.error
    assert B not in state.store.load().claims
    assert not cdi.spec_path(tmp_path / "cdi", B).exists()
    again = state.prepare([ref("uid-a")])[A]  # the kubelet asks again: the record answers
    assert again.error == "" and again.devices == first.devices
    assert spec.read_bytes() == written and state.store.load().claims[A] == record

    refusal[0] = None  # the driver is back: the kubelet's retry succeeds
    assert state.prepare([ref("uid-b")])[B].error == ""
    state.close()


def test_start_up_discovery_with_the_driver_unloaded_is_no_start_error(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(PROFILE.format(version="580.159.04", cuda="13.0", loaded="false"))
    backend = plugin_inventory.backend_for(platforms.for_node(simulate=str(path), node_name="n"))
    found, errors = plugin_inventory.discover_with_errors(backend)
    assert found == [] and errors == (
        "backend: NVML could not be initialised: " + DRIVER_NOT_LOADED,
    )
    with pytest.raises(plugin_inventory.NvmlUnavailable, match="Driver Not Loaded"):
        plugin_inventory.rediscover(backend)
