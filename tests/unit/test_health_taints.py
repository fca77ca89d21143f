"""GPU health events -> device taints and health-stream faults, and back.

Cases: the classification table (application XIDs ignored, configurable, bad configuration
named); a fault taints the GPU and every MIG device of it with a valid label value and the
first event's time; recovery needs the quiet period and a passing probe (never a lost GPU);
the monitor reads injected events and clears from the command file, refuses injections on
NVML nodes, and publishes slices and health stream together; taints from elsewhere (a refused
dynamic MIG placement) are published beside the health taints and go when withdrawn.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest

from dra_gpu.devices import health_events, health_rules
from dra_gpu.devices.health_events import Clear, HealthEvent, Injected
from dra_gpu.devices.model import Device
from dra_gpu.kube.objects import ResourceSlice
from dra_gpu.kubeletplugin import device_health, slices
from dra_gpu.plugin import device_taints, inventory, platforms
from dra_gpu.plugin.health_monitor import HealthMonitor

DRIVER = "gpu.nvidia.com"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
T0 = 1_764_588_278.0  # 2025-12-01T11:24:38Z


def devices(profile: str = "a100x4-mig") -> list[Device]:
    return inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=profile, node_name="n"))
    )


def test_application_xids_are_ignored_and_hardware_xids_taint() -> None:
    rules = health_rules.Rules()
    for xid in (13, 31, 43, 45, 68, 109):
        assert rules.classify("xid", xid).effect == "Ignore"
    assert rules.classify("xid", 79).effect == "NoExecute"
    assert rules.classify("xid", 92).effect == "NoSchedule"
    assert rules.classify("xid", 999) == health_rules.DEFAULT_UNKNOWN_XID
    assert rules.classify("ecc-double-bit").effect == "NoExecute"
    assert rules.classify("ecc-single-bit").effect == "Ignore"


def test_configuration_overrides_the_table(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(
        "quietPeriodSeconds: 20\n"
        "xids: {'13': NoSchedule, '79': Ignore, default: NoExecute}\n"
        "events: {ecc-single-bit: NoSchedule}\n"
    )
    rules = health_rules.load_rules(path)
    assert rules.quiet_period_s == 20
    assert rules.classify("xid", 13).effect == "NoSchedule"
    assert rules.classify("xid", 79).effect == "Ignore"
    assert rules.classify("xid", 999).effect == "NoExecute"
    assert rules.classify("ecc-single-bit").effect == "NoSchedule"
    assert rules.classify("xid", 48).effect == "NoExecute"  # untouched entries stay


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("xids: {'79': Evict}", "xids['79']"),
        ("xids: {seventy: NoSchedule}", "'seventy'"),
        ("events: {ecc-triple-bit: NoSchedule}", "ecc-triple-bit"),
        ("quietPeriodSeconds: -1", "quietPeriodSeconds"),
        ("quietPeriod: 5", "quietPeriod"),
        ("[1, 2]", "must be a mapping"),
    ],
)
def test_bad_configuration_names_the_entry(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(text)
    with pytest.raises(health_rules.HealthConfigError, match=re.escape(named)):
        health_rules.load_rules(path)


def published_slices(devs: list[Device], taints: dict[str, Any]) -> list[ResourceSlice]:
    built = slices.build_resource_slices(
        devices=devs,
        driver_name=DRIVER,
        node_name="n",
        pool_generation=1,
        node_owner=None,
        taints=taints,
    )
    return cast("list[ResourceSlice]", built)  # the kit's plain dicts, as the API would list


def fault_on(gpu: str, kind: str = "xid", code: int = 79, at: float = T0) -> device_taints.Faults:
    event = HealthEvent(gpu, kind, code, at)
    return device_taints.record({}, event, health_rules.Rules().classify(kind, code))


def test_a_fault_taints_the_gpu_and_its_mig_devices() -> None:
    devs = devices()
    mig = next(d for d in devs if d.name == "gpu-1-mig-2g10gb-14-0")
    taints = device_taints.device_taints(DRIVER, devs, fault_on(mig.gpu.uuid))
    on_gpu1 = sorted(d.name for d in devs if d.name.startswith("gpu-1-"))
    assert len(on_gpu1) == 4 and sorted(taints) == on_gpu1
    (taint,) = taints[mig.name]
    assert taint == {
        "key": "gpu.nvidia.com/xid-79",
        "value": "gpu-has-fallen-off-the-bus.20251201T112438Z",
        "effect": "NoExecute",
        "timeAdded": "2025-12-01T11:24:38Z",
    }
    body = published_slices(devs, taints)
    published = {d["name"]: d.get("taints") for s in body for d in s["spec"]["devices"]}
    assert published[mig.name] == [taint] and published["gpu-0"] is None


def test_taint_values_are_label_values_however_long_the_reason() -> None:
    fault = device_taints.Fault("xid-1", "NoSchedule", "x" * 80 + " (configured!)", T0, T0)
    value = device_taints.taint_value(fault)
    assert len(value) <= 63 and LABEL_VALUE.match(value), value


def test_slices_with_taints_hold_at_most_64_devices() -> None:
    devs = devices("h200x8") * 9  # names repeat; only the slicing is looked at
    args: dict[str, Any] = dict(
        devices=devs, driver_name=DRIVER, node_name="n", pool_generation=1, node_owner=None
    )
    assert len(slices.build_resource_slices(**args)) == 1
    tainted = {"gpu-0": [{"key": "k", "effect": "NoSchedule"}]}
    assert len(slices.build_resource_slices(**args, taints=tainted)) == 2


def test_recovery_needs_quiet_and_a_passing_probe() -> None:
    faults = fault_on("GPU-a")
    probe_ok = lambda gpu: True  # noqa: E731
    assert device_taints.recovered(faults, now=T0 + 29, quiet_s=30, healthy=probe_ok) == []
    assert device_taints.recovered(faults, now=T0 + 30, quiet_s=30, healthy=probe_ok) == ["GPU-a"]
    lost = lambda gpu: False  # noqa: E731
    assert device_taints.recovered(faults, now=T0 + 9999, quiet_s=30, healthy=lost) == []
    # a new event of the same kind starts the quiet period again
    again = device_taints.record(
        faults, HealthEvent("GPU-a", "xid", 79, T0 + 25), health_rules.Rules().classify("xid", 79)
    )
    assert device_taints.recovered(again, now=T0 + 30, quiet_s=30, healthy=probe_ok) == []
    assert again["GPU-a"]["xid-79"].first == T0


class Published:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, devices: Any, **kwargs: Any) -> None:
        self.calls.append(kwargs)

    @property
    def taints(self) -> dict[str, Any]:
        return dict(self.calls[-1]["taints"]) if self.calls else {}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def monitor(
    tmp_path: Path, *, simulated: bool = True, probe: bool = True, quiet: float = 30
) -> tuple[HealthMonitor, Published, Clock, Path]:
    path = tmp_path / health_events.FILE_NAME
    published, clock = Published(), Clock()
    mon = HealthMonitor(
        rules=health_rules.Rules(quiet_period_s=quiet),
        driver=DRIVER,
        devices=devices("h200x8"),
        publish=published,
        probe=lambda gpu: probe,
        commands=health_events.CommandFile(path),
        accept_injected=simulated,
        clock=clock,
    )
    return mon, published, clock, path


def send(mon: HealthMonitor, path: Path, command: health_events.Command) -> None:
    """What ``dra-gpu health`` writes, read by the monitor as its loop would."""
    health_events.append(path, command)
    mon.read_commands()


def test_injected_events_taint_and_recover_after_the_quiet_period(tmp_path: Path) -> None:
    mon, published, clock, path = monitor(tmp_path)
    send(mon, path, Injected("gpu-2", "xid", 13))
    assert published.calls == []  # an application XID changes nothing
    send(mon, path, Injected("gpu-2", "xid", 48))
    assert list(published.taints) == ["gpu-2"]
    assert "XID 48: double-bit ECC error (NoExecute" in published.calls[-1]["faults"]["gpu-2"]
    clock.now += 29
    assert mon.recover() == [] and list(published.taints) == ["gpu-2"]
    clock.now += 1
    assert len(mon.recover()) == 1 and published.taints == {}


def test_a_lost_gpu_keeps_its_taints(tmp_path: Path) -> None:
    mon, published, clock, path = monitor(tmp_path, probe=False)
    send(mon, path, Injected("gpu-1", "xid", 79))
    clock.now += 3600
    assert mon.recover() == [] and list(published.taints) == ["gpu-1"]
    # gone from discovery (probe or not): still not recovered
    mon2, _, clock2, path2 = monitor(tmp_path / "b")
    send(mon2, path2, Injected("gpu-1", "xid", 79))
    mon2.set_devices([d for d in devices("h200x8") if d.name != "gpu-1"], in_use=None)
    clock2.now += 3600
    assert mon2.recover() == []


def test_an_administrator_clears_a_gpu(tmp_path: Path) -> None:
    mon, published, _, path = monitor(tmp_path)
    send(mon, path, Injected("gpu-5", "ecc-double-bit"))
    assert list(published.taints) == ["gpu-5"]
    send(mon, path, Clear("gpu-5"))
    assert published.taints == {}


def test_real_gpus_take_no_injected_events_but_take_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mon, published, _, path = monitor(tmp_path, simulated=False)
    send(mon, path, Injected("gpu-5", "xid", 79))
    assert published.calls == []
    assert "accepted only on simulated nodes" in caplog.text
    mon.submit(HealthEvent(devices("h200x8")[5].gpu.uuid, "xid", 79, T0))  # from NVML
    send(mon, path, Clear("gpu-5"))
    assert published.taints == {}


def test_bad_command_lines_are_reported_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mon, published, _, path = monitor(tmp_path)
    with path.open("a") as f:
        f.write(
            '{"device": "gpu-1", "kind": "xid"}\nnot json\n{"device": "gpu-9", "clear": true}\n'
        )
    send(mon, path, Injected("gpu-1", "xid", 74))
    assert list(published.taints) == ["gpu-1"]
    assert "needs its XID" in caplog.text and "not JSON" in caplog.text
    assert "no device 'gpu-9'" in caplog.text


def test_health_stream_shows_faults_and_recovery() -> None:
    feed = device_health.HealthFeed(pool="n", clock=lambda: T0)
    feed.set_devices(["gpu-0", "gpu-1"])
    feed.set_faults({"gpu-1": "XID 79: gpu has fallen off the bus"})
    states = feed.snapshot().devices
    assert states["gpu-1"].health == "UNHEALTHY" and "XID 79" in states["gpu-1"].message
    assert states["gpu-0"].health == "HEALTHY"
    feed.set_devices(["gpu-0", "gpu-1", "gpu-2"])  # re-discovery keeps the fault
    assert feed.snapshot().devices["gpu-1"].health == "UNHEALTHY"
    feed.set_faults({})
    assert {s.health for s in feed.snapshot().devices.values()} == {"HEALTHY"}


def test_a_restart_restores_the_published_taints_unchanged() -> None:
    devs = devices()
    mig = next(d for d in devs if d.name == "gpu-1-mig-2g10gb-14-0")
    faults = fault_on(mig.gpu.uuid, code=94)
    taints = device_taints.device_taints(DRIVER, devs, faults)
    taints["gpu-0"] = [{"key": "example.com/pinned", "value": "rma", "effect": "NoExecute"}]
    published = published_slices(devs, taints)
    later = T0 + 3600
    restored = device_taints.restore(published, driver=DRIVER, devices=devs, now=later)
    assert list(restored) == [mig.gpu.uuid]  # someone else's taint is not ours to restore
    again = device_taints.device_taints(DRIVER, devs, restored)
    assert again == {k: v for k, v in taints.items() if k != "gpu-0"}  # same value, same time
    # the quiet period starts again at the restart
    assert device_taints.recovered(restored, now=later + 29, quiet_s=30, healthy=bool) == []
    gone = [d for d in devs if not d.name.startswith("gpu-1-")]
    assert device_taints.restore(published, driver=DRIVER, devices=gone, now=later) == {}


def test_the_health_command_appends_what_the_plugin_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dra_gpu import cli

    reader = health_events.CommandFile(tmp_path / health_events.FILE_NAME)
    assert cli.main(["health", "--state-dir", str(tmp_path), "inject", "gpu-1", "xid", "79"]) == 0
    assert cli.main(["health", "--state-dir", str(tmp_path), "clear", "gpu-1"]) == 0
    assert [c for _, c in reader.read()] == [Injected("gpu-1", "xid", 79), Clear("gpu-1")]
    assert cli.main(["health", "--state-dir", str(tmp_path), "inject", "gpu-1", "xid"]) == 2
    assert "needs its XID" in capsys.readouterr().err


def test_other_taints_are_published_beside_the_health_taints(tmp_path: Path) -> None:
    mon, published, _, path = monitor(tmp_path)
    refused = {"key": f"{DRIVER}/mig-failed", "value": "placement-refused", "effect": "NoSchedule"}
    mon.set_other_taints({"gpu-3": [refused]})
    assert published.taints == {"gpu-3": [refused]}
    calls = len(published.calls)
    mon.set_other_taints({"gpu-3": [refused]})  # unchanged: nothing published
    assert len(published.calls) == calls
    send(mon, path, Injected("gpu-3", "xid", 79))
    keys = [t["key"] for t in published.taints["gpu-3"]]
    assert keys == [f"{DRIVER}/xid-79", f"{DRIVER}/mig-failed"]
    send(mon, path, Clear("gpu-3"))  # an administrator's clear is about health only
    assert published.taints == {"gpu-3": [refused]}
    mon.set_other_taints({})
    assert published.taints == {}
