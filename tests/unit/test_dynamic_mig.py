"""Dynamic MIG: partitions as counters, the instances prepare creates, crash safety.

Cases:
- for every MIG table (A100, H100, the real H200's), the counters allow exactly the layouts
  ``migprofiles.layout_errors`` allows, over thousands of random layouts; seven ``1g`` fill a
  GPU and an eighth does not fit; ``3g + 2g + 1g + 1g`` fits;
- published: every (profile, placement) named as the static MIG device, no uuid, consuming
  its memory slices; the counter sets in slices of their own (at most 8 per slice), at most 64
  devices per slice; a static node publishes as before;
- the simulated GPU's instances survive a new object (a plugin restart) and refuse overlaps;
- the NVML path against the NVML fakes with the H200 table: create makes a GI + CI at the
  placement, discovery sees it, destroy removes it; a failed CI creation leaves no GI;
- prepare creates the MIG device and hands its UUID to CDI, unprepare destroys it; a crash
  right after creation (before the checkpoint completes) leaves no instance after the restart;
  an administrator's instance is never destroyed and a claim on a placement it overlaps fails,
  naming it.
"""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest
from fake_claims import FakeFetcher, claim, device_state, result
from nvml_fakes import FakeGpu, FakeMig, FakeNvml

from dra_gpu.devices import migprofiles, naming, partitions, simulated
from dra_gpu.devices.model import Device, GpuInfo, MigPartition
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.kubeletplugin import slices
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.mig.dynamic import DynamicMig
from dra_gpu.mig.instances import InstanceError, MigInstance, SimulatedInstances
from dra_gpu.mig.nvml_instances import NvmlInstances
from dra_gpu.prepare import device_metadata, device_status
from dra_gpu.prepare.checkpoint import Checkpoint
from dra_gpu.prepare.plan import ClaimRef
from dra_gpu.prepare.state import DeviceState

NODE = "node-a"


def dynamic_devices(profile: str = "h100x8-mig") -> list[Device]:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES[profile], node_name=NODE
    )
    return naming.build_devices(partitions.DynamicMigBackend(backend).discover().gpus)


@pytest.mark.parametrize("table", migprofiles.TABLES.values(), ids=lambda t: t.key)
def test_counters_allow_exactly_the_valid_layouts(table: migprofiles.MigTable) -> None:
    parts = partitions.partitions(table, 0)
    counters = partitions.gpu_counters(table)
    rng = random.Random(table.key)
    valid_seen = invalid_seen = 0
    for _ in range(3000):
        chosen = rng.sample(parts, rng.randint(1, 7))
        layout = [(p.profile, p.start) for p in chosen]
        valid = not migprofiles.layout_errors(table, layout)
        assert partitions.fits(counters, chosen) == valid, layout
        valid_seen += valid
        invalid_seen += not valid
    assert valid_seen > 50 and invalid_seen > 50  # both sides were really tried


def test_seven_1g_fill_an_h100_and_a_mixed_layout_fits() -> None:
    table = migprofiles.H100_80GB
    parts = {(p.profile, p.start): p for p in partitions.partitions(table, 0)}
    counters = partitions.gpu_counters(table)
    seven = [parts[("1g.10gb", s)] for s in range(7)]
    assert partitions.fits(counters, seven)
    assert not any(
        partitions.fits(counters, [*seven, p]) for p in parts.values() if p.profile == "1g.10gb"
    )
    mix = [parts[("3g.40gb", 4)], parts[("2g.20gb", 0)], parts[("1g.10gb", 2)]]
    assert partitions.fits(counters, [*mix, parts[("1g.10gb", 3)]])
    assert not partitions.fits(counters, [*mix, parts[("1g.10gb", 1)]])  # overlaps the 2g
    assert not partitions.fits(counters, [parts[("7g.80gb", 0)], parts[("1g.10gb", 6)]])


def first_fit(order: list[MigPartition], counters: dict[str, int], wanted: list[str]) -> bool:
    """What the scheduler does: each claim takes the first published device that still fits."""
    chosen: list[MigPartition] = []
    for profile in wanted:
        fit = [p for p in order if p.profile == profile and partitions.fits(counters, [*chosen, p])]
        if not fit:
            return False
        chosen.append(fit[0])
    return True


def test_published_order_packs_a_mixed_layout_in_any_arrival_order() -> None:
    table = migprofiles.H100_80GB
    order = partitions.partitions(table, 0)
    counters = partitions.gpu_counters(table)
    mix = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert all(first_fit(order, counters, list(p)) for p in itertools.permutations(mix))
    assert first_fit(order, counters, ["1g.10gb"] * 7)
    assert first_fit(order, counters, ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"])


def test_published_partitions_keep_static_names_and_consume_their_slices() -> None:
    devices = dynamic_devices()
    assert len(devices) == 8 * 25
    by_name = {d.name: d for d in devices}
    three_g = by_name["gpu-2-mig-3g40gb-9-4"]
    assert three_g.uuid is None and "uuid" not in three_g.attributes
    assert three_g.attributes["profile"] == "3g.40gb"
    (api,) = slices.device_to_api(three_g)["consumesCounters"]
    assert api["counterSet"] == "gpu-2-counter-set"
    assert {k for k in api["counters"] if k.startswith("memory-slice")} == {
        f"memory-slice-{i}" for i in range(4, 8)
    }
    full = by_name["gpu-2-mig-7g80gb-0-0"]
    assert full.partition is not None
    assert dict(full.partition.consumes) == dict(full.partition.gpu_counters)


def test_counters_get_slices_of_their_own_within_the_api_limits() -> None:
    objs = slices.build_resource_slices(
        devices=dynamic_devices(),
        driver_name="gpu.nvidia.com",
        node_name=NODE,
        pool_generation=1,
        node_owner=None,
    )
    counter_slices = [s for s in objs if "sharedCounters" in s["spec"]]
    device_slices = [s for s in objs if "devices" in s["spec"]]
    assert len(counter_slices) == 1 and len(counter_slices[0]["spec"]["sharedCounters"]) == 8
    assert all("devices" not in s["spec"] for s in counter_slices)
    assert all(len(s["spec"]["devices"]) <= 64 for s in device_slices)
    assert sum(len(s["spec"]["devices"]) for s in device_slices) == 200
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in objs} == {len(objs)}
    names = {c["name"] for s in counter_slices for c in s["spec"]["sharedCounters"]}
    used = {
        c["counterSet"]
        for s in device_slices
        for d in s["spec"]["devices"]
        for c in d["consumesCounters"]
    }
    assert used == names


def test_a_static_node_publishes_as_before() -> None:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["a100x4-mig"], node_name=NODE
    )
    devices = naming.build_devices(backend.discover().gpus)
    objs = slices.build_resource_slices(
        devices=devices,
        driver_name="gpu.nvidia.com",
        node_name=NODE,
        pool_generation=1,
        node_owner=None,
    )
    assert len(objs) == 1 and "sharedCounters" not in objs[0]["spec"]
    assert all("consumesCounters" not in d for d in objs[0]["spec"]["devices"])


def gpu0(devices: list[Device]) -> GpuInfo:
    return devices[0].gpu


def partition(devices: list[Device], name: str) -> Device:
    return next(d for d in devices if d.name == name)


def test_simulated_instances_persist_and_follow_the_placement_rules(tmp_path: Path) -> None:
    devices = dynamic_devices()
    path = tmp_path / "sim.json"
    first = SimulatedInstances(path, node_name=NODE)
    three_g = partition(devices, "gpu-0-mig-3g40gb-9-4").partition
    assert three_g is not None
    made = first.create(gpu0(devices), three_g)
    assert (made.start, made.size, made.profile) == (4, 4, "3g.40gb")
    again = SimulatedInstances(path, node_name=NODE)  # a restarted plugin
    assert again.list(gpu0(devices).uuid) == [made]
    overlapping = partition(devices, "gpu-0-mig-1g10gb-19-5").partition
    assert overlapping is not None
    with pytest.raises(InstanceError, match="memory slice 5 already used"):
        again.create(gpu0(devices), overlapping)
    assert again.destroy(gpu0(devices).uuid, made)
    assert not again.destroy(gpu0(devices).uuid, made)
    assert again.list(gpu0(devices).uuid) == []


def h200_fake(migs: list[FakeMig] | None = None) -> FakeNvml:
    return FakeNvml([FakeGpu(index=0, minor=0, mig_mode=(1, 1), migs=migs or [])])


def h200_devices(fake: FakeNvml, tmp_path: Path) -> list[Device]:
    backend = partitions.DynamicMigBackend(NvmlBackend(nvml=fake, sysfs_root=tmp_path))
    return naming.build_devices(backend.discover().gpus)


def test_nvml_creates_and_destroys_on_the_h200_tables(tmp_path: Path) -> None:
    fake = h200_fake()
    devices = h200_devices(fake, tmp_path)
    assert len(devices) == 25  # the real H200's profiles, every placement
    nvml = NvmlInstances(NvmlBackend(nvml=fake, sysfs_root=tmp_path))
    two_g = partition(devices, "gpu-0-mig-2g35gb-14-2")
    assert two_g.partition is not None
    made = nvml.create(two_g.gpu, two_g.partition)
    assert (made.profile, made.start, made.size, made.gi_profile_id) == ("2g.35gb", 2, 2, 14)
    found = NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover().gpus[0].mig_devices
    assert [(m.uuid, m.profile, m.placement_start) for m in found] == [(made.uuid, "2g.35gb", 2)]
    assert nvml.list(two_g.gpu.uuid) == [made]
    assert nvml.destroy(two_g.gpu.uuid, made)
    assert fake.gpus[0].migs == []
    assert not nvml.destroy(two_g.gpu.uuid, made)


def test_nvml_failed_compute_instance_leaves_no_gpu_instance(tmp_path: Path) -> None:
    fake = h200_fake()
    devices = h200_devices(fake, tmp_path)
    nvml = NvmlInstances(NvmlBackend(nvml=fake, sysfs_root=tmp_path))
    fake.fail[("nvmlGpuInstanceCreateComputeInstance", 0)] = 2  # NVML_ERROR_INVALID_ARGUMENT
    one_g = partition(devices, "gpu-0-mig-1g18gb-19-0")
    assert one_g.partition is not None
    with pytest.raises(InstanceError, match="nvmlGpuInstanceCreateComputeInstance"):
        nvml.create(one_g.gpu, one_g.partition)
    assert fake.gpus[0].migs == []


class Node:
    """A dynamic-MIG node: fake API, the simulated GPUs' instances, restartable state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.devices = {d.name: d for d in dynamic_devices()}
        self.fetcher = FakeFetcher()
        self.reports: list[tuple[str, str]] = []

    @property
    def sim(self) -> SimulatedInstances:
        return SimulatedInstances(self.root / "state" / "simulated-mig.json", node_name=NODE)

    def state(self, **kwargs: object) -> DeviceState:
        kwargs.setdefault("mig", DynamicMig(state_dir=self.root / "state", instances=self.sim))
        return device_state(
            self.root,
            devices=self.devices,
            claims=self.fetcher,
            report=lambda reason, msg: self.reports.append((reason, msg)),
            **kwargs,  # type: ignore[arg-type]
        )

    def instances(self) -> list[MigInstance]:
        return self.sim.list(self.devices["gpu-0-mig-1g10gb-19-0"].gpu.uuid)


def ref(uid: str) -> ClaimRef:
    return ClaimRef(uid=ClaimUID(uid), namespace="default", name=f"claim-{uid}")


class _Crash(Exception):
    pass


def test_prepare_creates_and_unprepare_destroys(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-3g40gb-9-0", pool=NODE)]))
    state = node.state()
    out = state.prepare([ref("u1")])[ClaimUID("u1")]
    assert out.error == ""
    (made,) = node.instances()
    assert (made.profile, made.start) == ("3g.40gb", 0)
    spec = (tmp_path / "cdi").glob("*.json")
    assert made.uuid in next(spec).read_text()  # the container gets the created device
    assert state.prepare([ref("u1")])[ClaimUID("u1")].error == ""  # idempotent
    assert len(node.instances()) == 1
    assert state.unprepare([ref("u1")]) == {"u1": ""}
    assert node.instances() == []


def test_the_created_devices_uuid_is_in_the_record_status_and_metadata(tmp_path: Path) -> None:
    """What dcgm-exporter-style tools read to attribute a created MIG device to a pod: the
    claim's device status, the metadata file, and a spec rebuilt from the record (issue 42)."""
    node = Node(tmp_path)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-3g40gb-9-0", pool=NODE)]))
    state = node.state()
    assert state.prepare([ref("u1")])[ClaimUID("u1")].error == ""
    (made,) = node.instances()
    (record_device,) = state.store.load().claims[ClaimUID("u1")].devices
    assert record_device.uuid == made.uuid
    of = device_status.entries_of(
        state.store, driver="gpu.nvidia.com", inventory=lambda: node.devices
    )
    (entry,) = of(ClaimUID("u1")) or []
    assert entry["data"]["uuid"] == made.uuid
    assert entry["data"]["parentUUID"] == gpu0(list(node.devices.values())).uuid
    (meta,) = (tmp_path / "state" / device_metadata.HOST_SUBDIR).glob("*.json")
    assert made.uuid in meta.read_text()
    for spec in (tmp_path / "cdi").glob("*.json"):
        spec.unlink()  # start rebuilds it from the record
    node.state().start()
    (spec,) = (tmp_path / "cdi").glob("*.json")
    assert made.uuid in spec.read_text()


def test_start_fills_in_the_uuid_release_0_2_0_left_empty(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-3g40gb-9-0", pool=NODE)]))
    state = node.state()
    assert state.prepare([ref("u1")])[ClaimUID("u1")].error == ""
    (made,) = node.instances()

    def as_0_2_0(cp: Checkpoint) -> Checkpoint:
        record = cp.claims["u1"]
        devices = tuple(d.model_copy(update={"uuid": ""}) for d in record.devices)
        return cp.with_claim("u1", record.model_copy(update={"devices": devices}))

    state.store.update(as_0_2_0, durable=True)
    restarted = node.state()
    restarted.start()
    (record_device,) = restarted.store.load().claims[ClaimUID("u1")].devices
    assert record_device.uuid == made.uuid
    assert node.instances() == [made]


def test_crash_after_creation_leaves_no_orphan_after_restart(tmp_path: Path) -> None:
    live, frozen = Node(tmp_path / "live"), Node(tmp_path / "frozen")
    for node in (live, frozen):
        node.fetcher.add(claim("u1", [result("gpu-0-mig-1g10gb-19-3", pool=NODE)]))

    def crash(step: str) -> None:
        if step == "after-mig-created":  # the disk as a SIGKILL at this point leaves it
            shutil.copytree(live.root, frozen.root)
            raise _Crash(step)

    live.state(fault=crash).prepare([ref("u1")])
    assert len(frozen.instances()) == 1

    restarted = frozen.state()
    report = restarted.start()
    assert frozen.instances() == []
    assert len(report.mig_destroyed) == 1 and "claim u1" in report.mig_destroyed[0]
    assert [r for r, _ in frozen.reports] == ["MigDeviceDestroyed"]
    out = restarted.prepare([ref("u1")])[ClaimUID("u1")]  # the kubelet's retry
    assert out.error == "" and len(frozen.instances()) == 1
    assert restarted.start().mig_destroyed == ()  # a completed claim keeps its device
    assert len(frozen.instances()) == 1


def test_an_administrators_instance_is_left_alone(tmp_path: Path) -> None:
    node = Node(tmp_path)
    admin_part = node.devices["gpu-0-mig-2g20gb-14-0"].partition
    assert admin_part is not None
    admin = node.sim.create(node.devices["gpu-0-mig-2g20gb-14-0"].gpu, admin_part)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-1g10gb-19-1", pool=NODE)]))
    state = node.state()
    assert state.start().mig_destroyed == ()
    out = state.prepare([ref("u1")])[ClaimUID("u1")]
    assert admin.uuid in out.error and "not created by this driver" in out.error
    assert node.instances() == [admin]
    assert node.state().start().mig_destroyed == ()
    assert node.instances() == [admin]


def test_a_lost_checkpoint_keeps_the_device_and_its_spec(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-2g20gb-14-2", pool=NODE)]))
    assert node.state().prepare([ref("u1")])[ClaimUID("u1")].error == ""
    (made,) = node.instances()
    for path in (tmp_path / "state").glob("checkpoint.*"):
        path.unlink()  # the record is gone, the spec is not

    restarted = node.state()
    assert restarted.start().mig_destroyed == ()  # adopted from its spec: still prepared
    assert node.instances() == [made]
    assert restarted.prepare([ref("u1")])[ClaimUID("u1")].error == ""  # planned again
    (spec,) = (tmp_path / "cdi").glob("*.json")
    assert made.uuid in spec.read_text()
    assert node.instances() == [made]


class _BrokenDestroy(SimulatedInstances):
    def destroy(self, gpu_uuid: str, instance: MigInstance) -> bool:
        raise InstanceError(f"nvmlGpuInstanceDestroy: In use by another client ({instance})")


def test_a_device_that_cannot_be_destroyed_fails_unprepare_until_it_can(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.fetcher.add(claim("u1", [result("gpu-0-mig-1g10gb-19-0", pool=NODE)]))
    assert node.state().prepare([ref("u1")])[ClaimUID("u1")].error == ""
    broken = _BrokenDestroy(node.sim.path, node_name=NODE)
    stuck = device_state(
        tmp_path,
        devices=node.devices,
        claims=node.fetcher,
        mig=DynamicMig(state_dir=tmp_path / "state", instances=broken),
    )
    error = stuck.unprepare([ref("u1")])[ClaimUID("u1")]
    assert error.startswith("unprepare default/claim-u1: nvmlGpuInstanceDestroy: In use"), error
    assert len(node.instances()) == 1
    assert node.state().unprepare([ref("u1")]) == {"u1": ""}  # the kubelet's retry
    assert node.instances() == []
