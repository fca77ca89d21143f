"""CDI specs: naming, content for real and simulated nodes, validation, atomic files.

Cases:
- file and device-ID naming follow NVIDIA's layout;
- simulated specs stand /dev/null in for every NVIDIA node and describe each device in env;
- real specs carry exactly the claimed GPUs' nodes, MIG capability nodes read from /proc, the
  control nodes, and the driver files mounted read-only; a wrong driver root is a clear error;
- cdiVersion is the minimum the fields need; the validator rejects each broken spec by rule;
- writes leave no temp file; remove is idempotent; listing ignores other vendors' specs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from dra_gpu.config import default_gpu_config, default_mig_device_config, normalized
from dra_gpu.config import parse_opaque_config as parse
from dra_gpu.kubeletplugin.ids import ClaimUID, DeviceName
from dra_gpu.prepare import cdi, cdi_host
from dra_gpu.prepare.cdi_validate import minimum_version, validate_spec
from e2e import cdi_validator

UID = ClaimUID("0b5c2a7e-1111-4c2e-9a55-2f1f6f1d0c11")

GPU0 = cdi.ClaimDevice(
    name=DeviceName("gpu-0"),
    type="gpu",
    uuid="GPU-aaaa",
    minor=0,
    product_name="NVIDIA H200",
    config=default_gpu_config(),
)
MIG1 = cdi.ClaimDevice(
    name=DeviceName("gpu-1-mig-1g18gb-19-6"),
    type="mig",
    uuid="MIG-bbbb",
    minor=1,
    product_name="NVIDIA H200",
    config=default_mig_device_config(),
    mig_profile="1g.18gb",
    gi_id=7,
    ci_id=0,
)


def env_of(spec: dict[str, Any], index: int | None = None) -> list[str]:
    edits = spec["containerEdits"] if index is None else spec["devices"][index]["containerEdits"]
    return list(edits["env"])


def node_paths(edits: dict[str, Any]) -> list[str]:
    return [n["path"] for n in edits.get("deviceNodes", [])]


def test_naming() -> None:
    assert cdi.spec_path(Path("/var/run/cdi"), UID) == Path(
        f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{UID}.json"
    )
    assert cdi.device_id(UID, DeviceName("gpu-0")) == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"


def test_simulated_spec_describes_each_device() -> None:
    mps = normalized(
        parse(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}},
            }
        )
    )
    mig = cdi.ClaimDevice(**{**MIG1.__dict__, "config": mps})
    spec = cdi.build_spec(
        claim_uid=UID, claim_ref="ns/c", devices=[GPU0, mig], node=cdi.SimulatedNode()
    )
    assert validate_spec(spec) == []
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-{MIG1.name}"]
    # Spec-level edits are merged across a container's claims: nothing claim-specific there.
    assert env_of(spec) == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert env_of(spec, 0) == [
        "GPU_DEVICE_0=gpu-0",
        "GPU_DEVICE_0_UUID=GPU-aaaa",
        "GPU_DEVICE_0_TYPE=gpu",
        "GPU_DEVICE_0_PRODUCT=NVIDIA H200",
        "GPU_DEVICE_0_CLAIM=ns/c",
        "GPU_DEVICE_0_SHARING_STRATEGY=TimeSlicing",
        "GPU_DEVICE_0_TIMESLICE_INTERVAL=Default",
    ]
    mig_env = env_of(spec, 1)
    assert "GPU_DEVICE_1_MIG_1G18GB_19_6=gpu-1-mig-1g18gb-19-6" in mig_env
    assert "GPU_DEVICE_1_MIG_1G18GB_19_6_MIG_PROFILE=1g.18gb" in mig_env
    assert "GPU_DEVICE_1_MIG_1G18GB_19_6_SHARING_STRATEGY=MPS" in mig_env
    assert "GPU_DEVICE_1_MIG_1G18GB_19_6_MPS_ACTIVE_THREAD_PERCENTAGE=25" in mig_env
    nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += spec["containerEdits"]["deviceNodes"]
    assert {n["hostPath"] for n in nodes} == {"/dev/null"}
    assert node_paths(spec["devices"][0]["containerEdits"]) == ["/dev/nvidia0"]
    assert node_paths(spec["devices"][1]["containerEdits"]) == ["/dev/nvidia1"]
    assert node_paths(spec["containerEdits"]) == list(cdi.CONTROL_NODES)


def test_two_claims_in_one_container_do_not_hide_each_others_devices() -> None:
    # The runtime merges the env of every CDI device a container gets, later entries winning.
    gpu1 = cdi.ClaimDevice(**{**GPU0.__dict__, "name": DeviceName("gpu-1"), "minor": 1})
    first = cdi.build_spec(
        claim_uid=UID, claim_ref="ns/a", devices=[GPU0], node=cdi.SimulatedNode()
    )
    second = cdi.build_spec(
        claim_uid=ClaimUID("u2"), claim_ref="ns/b", devices=[gpu1], node=cdi.SimulatedNode()
    )
    merged: dict[str, str] = {}
    for spec in (first, second):
        for entry in env_of(spec) + env_of(spec, 0):
            key, _, value = entry.partition("=")
            merged[key] = value
    assert merged["GPU_DEVICE_0"] == "gpu-0" and merged["GPU_DEVICE_0_CLAIM"] == "ns/a"
    assert merged["GPU_DEVICE_1"] == "gpu-1" and merged["GPU_DEVICE_1_CLAIM"] == "ns/b"


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    root = tmp_path / "driver"
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    (libdir / "libcuda.so.580.1").write_text("elf")
    (libdir / "libcuda.so.1").symlink_to("libcuda.so.580.1")
    (libdir / "libnvidia-ml.so.580.1").write_text("elf")
    (libdir / "libunrelated.so.1").write_text("elf")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!")
    return root


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    gi = tmp_path / "proc/driver/nvidia/capabilities/gpu1/mig/gi7"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 66\nDeviceFileMode: 292\n")
    (gi / "ci0/access").write_text("DeviceFileMinor: 67\nDeviceFileMode: 292\n")
    return tmp_path / "proc"


def test_real_spec_has_exactly_the_claimed_nodes_and_driver_files(
    driver_root: Path, proc_root: Path
) -> None:
    node = cdi_host.read_real_node(
        driver_root=driver_root,
        proc_root=proc_root,
        host_driver_root=PurePosixPath("/run/nvidia/driver"),
        mig_instances=[(1, 7, 0)],
    )
    spec = cdi.build_spec(claim_uid=UID, claim_ref="ns/c", devices=[MIG1], node=node)
    assert validate_spec(spec) == []
    assert node_paths(spec["devices"][0]["containerEdits"]) == [
        "/dev/nvidia1",
        "/dev/nvidia-caps/nvidia-cap66",
        "/dev/nvidia-caps/nvidia-cap67",
    ]
    assert all("hostPath" not in n for n in spec["containerEdits"]["deviceNodes"])
    mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
    assert set(mounts) == {
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.1",
        "/usr/bin/nvidia-smi",
    }
    smi = mounts["/usr/bin/nvidia-smi"]
    assert smi["hostPath"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert "ro" in smi["options"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in env_of(spec)


def test_real_dev_nodes_from_driver_container(driver_root: Path) -> None:
    (driver_root / "dev").mkdir()
    (driver_root / "dev/nvidiactl").write_text("")
    node = cdi_host.read_real_node(driver_root=driver_root)
    spec = cdi.build_spec(claim_uid=UID, claim_ref="ns/c", devices=[GPU0], node=node)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": f"{driver_root}/dev/nvidia0"}
    ]
    assert spec["cdiVersion"] == "0.5.0"


def test_wrong_driver_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(cdi.CDIError, match=r"no NVIDIA driver libraries.*--driver-root"):
        cdi_host.read_real_node(driver_root=tmp_path)


def test_missing_mig_capability_is_a_clear_error(driver_root: Path, tmp_path: Path) -> None:
    with pytest.raises(cdi.CDIError, match="cannot read MIG capability"):
        cdi_host.read_real_node(
            driver_root=driver_root, proc_root=tmp_path, mig_instances=[(1, 7, 0)]
        )
    node = cdi_host.read_real_node(driver_root=driver_root)
    with pytest.raises(cdi.CDIError, match="no MIG capability nodes known for gpu-1-mig"):
        cdi.build_spec(claim_uid=UID, claim_ref="ns/c", devices=[MIG1], node=node)


def test_no_devices_is_an_error() -> None:
    with pytest.raises(cdi.CDIError, match="no devices"):
        cdi.build_spec(claim_uid=UID, claim_ref="ns/c", devices=[], node=cdi.SimulatedNode())


def _valid() -> dict[str, Any]:
    return {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/gpu",
        "devices": [{"name": "dev0", "containerEdits": {"env": ["A=1"]}}],
    }


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = _valid()
    target: Any = spec
    keys = path.split("/")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    target[keys[-1]] = value
    return spec


# Specs the validator must refuse, and the problem it names.
REJECTED = [
    pytest.param({"kind": "a.com/b", "devices": []}, "cdiVersion: must be one of", id="no-ver"),
    pytest.param(_with("cdiVersion", "0.2.9"), "cdiVersion: must be one of", id="bad-ver"),
    pytest.param(_with("kind", "gpu"), "kind: must be vendor/class", id="kind-no-slash"),
    pytest.param(_with("kind", "a.com/b/c"), "kind: must be vendor/class", id="kind-2-slash"),
    pytest.param(_with("kind", "-a.com/b"), "kind: invalid vendor", id="vendor-dash"),
    pytest.param(_with("kind", "a.com/b-"), "kind: invalid class", id="class-end-dash"),
    pytest.param(_with("devices", []), "devices: must be a non-empty list", id="no-devs"),
    pytest.param(_with("devices/0/name", "a b"), "invalid device name", id="name-space"),
    pytest.param(_with("devices/0/name", "dev-"), "invalid device name", id="name-end"),
    pytest.param(
        _with("devices/0/containerEdits", {}), "at least one container edit", id="no-edits"
    ),
    pytest.param(_with("extra", 1), "spec.extra: unknown field", id="unknown-top"),
    pytest.param(_with("devices/0/foo", 1), "devices[0].foo: unknown field", id="unknown-dev"),
    pytest.param(_with("devices/0/containerEdits/env", ["NOEQ"]), "must be NAME=value", id="env"),
    pytest.param(
        _with("devices/0/containerEdits/deviceNodes", [{"path": "dev/x"}]),
        "must be an absolute path",
        id="node-relative",
    ),
    pytest.param(
        _with("devices/0/containerEdits/deviceNodes", [{"path": "/dev/x", "type": "x"}]),
        "must be one of b, c, u, p",
        id="node-type",
    ),
    pytest.param(
        _with("devices/0/containerEdits/deviceNodes", [{"path": "/d", "permissions": "rx"}]),
        "may hold only r, w, m",
        id="node-perms",
    ),
    pytest.param(
        _with("devices/0/containerEdits/deviceNodes", [{"path": "/d", "major": "1"}]),
        "major: must be an integer",
        id="node-major",
    ),
    pytest.param(
        _with("devices/0/containerEdits/mounts", [{"hostPath": "/a"}]),
        "containerPath: must be a non-empty string",
        id="mount-no-target",
    ),
    pytest.param(
        _with("devices/0/containerEdits/hooks", [{"hookName": "boot", "path": "/x"}]),
        "must be an OCI hook name",
        id="hook-name",
    ),
    pytest.param(
        _with(
            "devices/0/containerEdits/hooks",
            [{"hookName": "poststop", "path": "/x", "timeout": 0}],
        ),
        "timeout: must be an integer >= 1",
        id="hook-timeout",
    ),
    pytest.param(
        _with("devices/0/containerEdits/deviceNodes", [{"path": "/d", "hostPath": "/e"}]),
        "cdiVersion: 0.3.0 is too old for the fields used (needs 0.5.0)",
        id="hostpath-needs-0.5",
    ),
    pytest.param(
        _with("devices/0/name", "0dev"),
        "needs 0.5.0",
        id="digit-name-needs-0.5",
    ),
    pytest.param(_with("annotations", {"a": "b"}), "needs 0.6.0", id="annotations-0.6"),
    pytest.param(_with("kind", "a.com/b.c"), "needs 0.6.0", id="class-dot-0.6"),
]


@pytest.mark.parametrize(("spec", "problem"), REJECTED)
def test_validator_rejects(spec: dict[str, Any], problem: str) -> None:
    problems = validate_spec(spec)
    assert any(problem in p for p in problems), problems


def test_validator_duplicate_device_names() -> None:
    spec = _valid()
    spec["devices"].append(copy.deepcopy(spec["devices"][0]))
    assert validate_spec(spec) == ["devices[1].name: duplicate device name 'dev0'"]


def test_minimum_version_of_a_plain_spec() -> None:
    assert validate_spec(_valid()) == []
    assert minimum_version(_valid()) == "0.3.0"
    assert minimum_version(_with("devices/0/containerEdits/additionalGids", [5])) == "0.7.0"


def test_write_is_atomic_and_remove_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "cdi"
    spec = cdi.build_spec(claim_uid=UID, claim_ref="n/c", devices=[GPU0], node=cdi.SimulatedNode())
    path = cdi.write_spec(root, UID, spec)
    assert json.loads(path.read_text()) == spec
    assert sorted(p.name for p in root.iterdir()) == [path.name]
    (root / "other-vendor_x.json").write_text("{}")
    (root / f".{path.name}.tmp-123").write_text("partial")
    assert cdi.list_specs(root) == {UID: path}
    assert cdi.remove_temp_files(root) == 1
    assert cdi.remove_spec(root, UID) is True
    assert cdi.remove_spec(root, UID) is False
    assert cdi.list_specs(root) == {}


def test_write_refuses_invalid_spec(tmp_path: Path) -> None:
    with pytest.raises(cdi.CDIError, match="invalid CDI spec"):
        cdi.write_spec(tmp_path, UID, _with("kind", "nokind"))
    assert list(tmp_path.iterdir()) == []


# The reference CDI library (Go, `cdi.ReadSpec`: what container runtimes load specs with) as the
# oracle of the hand-written validator: it refuses what ours refuses, and takes what we write.
# It runs or fails: a validator that does not build fails these tests, never skips them.
@pytest.fixture(scope="module")
def reference_validator() -> None:
    try:
        cdi_validator.ensure()
    except cdi_validator.ValidatorUnavailable as exc:
        pytest.fail(f"reference CDI validator not available: {exc}")


def _reference_problems(spec: dict[str, Any], tmp_path: Path) -> list[str]:
    path = tmp_path / "vendor.com-test.json"
    path.write_text(json.dumps(spec))
    return cdi_validator.validate([path])


# Where ours is stricter than the library, on purpose: the runtime would fail the container later.
STRICTER_THAN_THE_LIBRARY = {
    "node-relative": "runc refuses a device node whose container path is not absolute",
    "hook-timeout": "the OCI runtime spec wants a hook timeout > 0",
}


@pytest.mark.parametrize(
    ("spec", "problem"), [p for p in REJECTED if p.id not in STRICTER_THAN_THE_LIBRARY]
)
def test_the_reference_library_refuses_what_the_validator_refuses(
    reference_validator: None, spec: dict[str, Any], problem: str, tmp_path: Path
) -> None:
    assert _reference_problems(spec, tmp_path) != [], f"the Go library accepts it ({problem})"


def test_the_reference_library_takes_the_specs_we_write(
    reference_validator: None, tmp_path: Path
) -> None:
    real = cdi.build_spec(
        claim_uid=UID, claim_ref="ns/c", devices=[GPU0, MIG1], node=cdi.SimulatedNode()
    )
    assert validate_spec(real) == []
    assert _reference_problems(real, tmp_path) == []
    assert _reference_problems(_valid(), tmp_path) == []
