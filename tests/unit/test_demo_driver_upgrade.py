"""The demo's driver-upgrade step (``e2e.demo.driver_upgrade``), its pure parts.

Cases: the profile file written for the node gives the same devices as the built-in
``h200x8`` (names, UUIDs, attributes), and with another driver only the versions differ; the
driver unloaded in the file is what the plugin reads as "Driver Not Loaded"; the section printed
after the table says each thing the step saw, and a changed spec or record is not hidden.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dra_gpu.devices import model
from dra_gpu.plugin import inventory, platforms
from e2e.demo import driver_profile, driver_upgrade


def discovered(simulate: str) -> list[model.Device]:
    return inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=simulate, node_name=driver_upgrade.NODE))
    )


def test_the_profile_file_is_the_builtin_profile(tmp_path: Path) -> None:
    path = driver_profile.profile_path(tmp_path)
    path.parent.mkdir()
    driver_profile.write_profile(path)
    assert path.name == "h200x8.yaml"
    assert discovered(str(path)) == discovered("h200x8")

    driver_profile.write_profile(path, driver=driver_profile.NEW)
    upgraded = discovered(str(path))
    assert [d.name for d in upgraded] == [d.name for d in discovered("h200x8")]
    assert {str(d.attributes["driverVersion"]) for d in upgraded} == {"590.48.1"}
    assert {str(d.attributes["cudaDriverVersion"]) for d in upgraded} == {"13.1.0"}
    assert [d.uuid for d in upgraded] == [d.uuid for d in discovered("h200x8")]


def test_the_unloaded_driver_is_what_the_plugin_reads(tmp_path: Path) -> None:
    path = driver_profile.profile_path(tmp_path)
    path.parent.mkdir()
    driver_profile.write_profile(path, loaded=False)
    status = platforms.for_node(simulate=str(path), node_name=driver_upgrade.NODE).driver()()
    assert status == model.DriverStatus(loaded=False, reason="nvmlInit: Driver Not Loaded")


SEEN = driver_upgrade.Seen(
    node="demo-h200-shared",
    before=("580.159.4", "13.0.0"),
    after=("590.48.1", "13.1.0"),
    tainted=8,
    devices=8,
    taint="gpu.nvidia.com/driver-unavailable=nvmlinit-driver-not-loaded.20261206T073537Z:NoSchedule",
    refused="claim demo-driver-upgrade/x: the NVIDIA driver is unavailable since ...",
    after_taints=0,
    retried="pod demo-driver-upgrade/through-the-upgrade Running (the kubelet retried its prepare)",
    kept=(3, 3),
    changed=(),
    restored_event="GpuDriverRestored: the NVIDIA driver is back after 4s: 580.159.04 -> 590.48.01",
    seconds=17.2,
)


def test_the_section_says_what_the_step_saw() -> None:
    text = driver_upgrade.section(SEEN)
    assert text.splitlines() == [
        "Driver upgrade on demo-h200-shared (docs/concepts/device-health.md), 17 s:",
        "  published driverVersion 580.159.4 -> 590.48.1, cudaDriverVersion 13.0.0 -> 13.1.0",
        "  driver unloaded: 8/8 devices tainted gpu.nvidia.com/driver-unavailable="
        "nvmlinit-driver-not-loaded.20261206T073537Z:NoSchedule",
        "  prepare refused: claim demo-driver-upgrade/x: the NVIDIA driver is unavailable "
        "since ...",
        "  driver 590.48.01 loaded: 0 devices tainted; pod demo-driver-upgrade/through-the-upgrade "
        "Running (the kubelet retried its prepare)",
        "  prepared claims kept: 3 CDI specs and 3 checkpoint records unchanged",
        "  Node Event GpuDriverRestored: the NVIDIA driver is back after 4s: "
        "580.159.04 -> 590.48.01",
    ]
    changed = driver_upgrade.section(replace(SEEN, changed=("record uid-a",)))
    assert "  CHANGED: record uid-a" in changed.splitlines()
