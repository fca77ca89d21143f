"""Device metadata (KEP-5304): the file per claim and request that the claim's CDI spec mounts.

Cases: a prepared claim's spec mounts, read-only, each request's file at the protocol's path
(``resourceclaims/<claim>/<request>/gpu.nvidia.com-metadata.json``), and the file names the
devices with their attributes (UUID, product, PCI bus ID; MIG profile and parent); a claim from a
template goes under ``resourceclaimtemplates/<pod's claim name>``; unprepare removes the files;
start removes files no completed claim owns and rebuilds a completed claim's missing file and
spec (the path from the claim when no earlier file tells it); a repeated prepare puts back a file
removed since.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_claims import DRIVER, NODE, FakeFetcher, claim, device_state, inventory, ref, result

from dra_gpu.kubeletplugin.driver import ClaimRef
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.prepare import cdi, device_metadata
from dra_gpu.prepare.cdi_validate import validate_spec
from dra_gpu.prepare.state import DeviceState

INVENTORY = inventory()
MIG = "gpu-1-mig-1g5gb-19-2"
BASE = "/var/run/kubernetes.io/dra-device-attributes"


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetcher = FakeFetcher()

    def state(self) -> DeviceState:
        return device_state(self.root, devices=INVENTORY, claims=self.fetcher)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def spec(self, uid: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            cdi.spec_path(self.root / "cdi", ClaimUID(uid)).read_text()
        )
        return data

    def mounts(self, uid: str) -> dict[str, list[tuple[str, str, tuple[str, ...]]]]:
        """Device name (without the claim UID) -> its (host, container, options) mounts."""
        return {
            d["name"].removeprefix(f"{uid}-"): [
                (m["hostPath"], m["containerPath"], tuple(m["options"]))
                for m in d["containerEdits"].get("mounts") or []
            ]
            for d in self.spec(uid)["devices"]
        }

    def file(self, uid: str, request: str) -> dict[str, Any]:
        path = device_metadata.host_path(self.state_dir, ClaimUID(uid), request)
        data: dict[str, Any] = json.loads(path.read_text())
        return data


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def attrs(file: dict[str, Any], device: str) -> dict[str, Any]:
    (request,) = file["requests"]
    found = {d["name"]: d for d in request["devices"]}
    assert found[device]["driver"] == DRIVER and found[device]["pool"] == NODE
    return dict(found[device]["attributes"])


def test_the_spec_mounts_each_requests_file_naming_its_devices(node: Node) -> None:
    node.fetcher.add(claim("u1", [result("gpu-0", "train"), result(MIG, "infer")], name="c1"))
    c1 = ClaimRef(uid=ClaimUID("u1"), namespace="default", name="c1")
    state = node.state()
    assert state.prepare([c1])[ClaimUID("u1")].error == ""
    spec = node.spec("u1")
    assert validate_spec(spec) == []
    host = node.state_dir / "dra-device-metadata"
    assert node.mounts("u1") == {
        "gpu-0": [
            (
                str(host / "u1.train.json"),
                f"{BASE}/resourceclaims/c1/train/gpu.nvidia.com-metadata.json",
                ("ro", "bind"),
            )
        ],
        MIG: [
            (
                str(host / "u1.infer.json"),
                f"{BASE}/resourceclaims/c1/infer/gpu.nvidia.com-metadata.json",
                ("ro", "bind"),
            )
        ],
    }

    train = node.file("u1", "train")
    assert (train["apiVersion"], train["kind"]) == (
        "metadata.resource.k8s.io/v1alpha1",
        "DeviceMetadata",
    )
    assert train["metadata"] == {"name": "c1", "namespace": "default", "uid": "u1", "generation": 1}
    assert "podClaimName" not in train
    assert [r["name"] for r in train["requests"]] == ["train"]
    gpu = attrs(train, "gpu-0")
    assert gpu["uuid"] == {"string": INVENTORY["gpu-0"].uuid}
    assert gpu["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
    assert gpu["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    assert gpu["type"] == {"string": "gpu"}

    mig = attrs(node.file("u1", "infer"), MIG)
    assert mig["profile"] == {"string": "1g.5gb"}
    assert mig["uuid"] == {"string": INVENTORY[MIG].uuid}
    assert mig["parentUUID"] == {"string": INVENTORY[MIG].gpu.uuid}
    assert mig["resource.kubernetes.io/pciBusID"] == {"string": "0000:0f:00.0"}

    assert state.unprepare([c1]) == {ClaimUID("u1"): ""}
    assert not any(host.iterdir())


def test_a_claim_from_a_template_goes_under_the_pods_claim_name(node: Node) -> None:
    body = claim("u2", [result("gpu-0", "gpu"), result("gpu-2-mig-4g20gb-5-0", "gpu")])
    body["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "my-gpus"}
    node.fetcher.add(body)
    assert node.state().prepare([ref("u2")])[ClaimUID("u2")].error == ""
    path = f"{BASE}/resourceclaimtemplates/my-gpus/gpu/gpu.nvidia.com-metadata.json"
    assert {m[1] for mounts in node.mounts("u2").values() for m in mounts} == {path}
    file = node.file("u2", "gpu")
    assert file["podClaimName"] == "my-gpus"
    (request,) = file["requests"]
    assert [d["name"] for d in request["devices"]] == ["gpu-0", "gpu-2-mig-4g20gb-5-0"]


def test_start_removes_unowned_files_and_rebuilds_missing_ones(node: Node) -> None:
    body = claim("u3", [result("gpu-0", "gpu")])
    body["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "pc"}
    node.fetcher.add(body)
    assert node.state().prepare([ref("u3")])[ClaimUID("u3")].error == ""
    written = node.file("u3", "gpu")

    # A crash after the record, before the file and the spec: start puts both back, the path
    # from the claim (no earlier file to read it from).
    device_metadata.remove(node.state_dir, ClaimUID("u3"))
    cdi.remove_spec(node.root / "cdi", ClaimUID("u3"))
    orphan = device_metadata.host_path(node.state_dir, ClaimUID("gone"), "gpu")
    orphan.write_text("{}")
    report = node.state().start()
    assert report.problems == ()
    assert not orphan.exists()
    assert node.file("u3", "gpu") == written
    assert {m[1] for mounts in node.mounts("u3").values() for m in mounts} == {
        f"{BASE}/resourceclaimtemplates/pc/gpu/gpu.nvidia.com-metadata.json"
    }

    # Removed by hand since: the kubelet's repeated prepare (answered from the checkpoint) puts
    # it back, its path again from the claim.
    device_metadata.remove(node.state_dir, ClaimUID("u3"))
    assert node.state().prepare([ref("u3")])[ClaimUID("u3")].error == ""
    assert node.file("u3", "gpu") == written


def test_remove_takes_the_claims_files_by_name_or_found_and_leaves_other_claims(
    tmp_path: Path,
) -> None:
    def put(uid: str, request: str) -> Path:
        path = device_metadata.host_path(tmp_path, ClaimUID(uid), request)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
        return path

    mine = [put("u1", "gpu"), put("u1", "mig")]
    other = put("u2", "gpu")
    device_metadata.remove(tmp_path, ClaimUID("u1"), ["gpu", "mig/large"])  # from the record
    assert not any(p.exists() for p in mine) and other.exists()
    mine = [put("u1", "gpu"), put("u1", "mig")]
    device_metadata.remove(tmp_path, ClaimUID("u1"))  # requests unknown: looked for
    assert not any(p.exists() for p in mine) and other.exists()
    device_metadata.remove(tmp_path, ClaimUID("u1"))  # unprepare repeats: nothing there
    assert device_metadata.claims_with_files(tmp_path) == {ClaimUID("u2")}


def test_files_of_release_0_2_0s_layout_are_read_and_removed(node: Node) -> None:
    """0.2.0 wrote <UID>/<request>/metadata.json: after an upgrade its claims keep their files
    until unprepare, and a restarted plugin's rebuilt spec finds the pod's name for the claim."""
    body = claim("u4", [result("gpu-0", "gpu")])
    node.fetcher.add(body)
    assert node.state().prepare([ref("u4")])[ClaimUID("u4")].error == ""
    flat = device_metadata.host_path(node.state_dir, ClaimUID("u4"), "gpu")
    old = node.state_dir / device_metadata.HOST_SUBDIR / "u4" / "gpu" / "metadata.json"
    old.parent.mkdir(parents=True)
    document = json.loads(flat.read_text())
    old.write_text(json.dumps({**document, "podClaimName": "from-0.2.0"}))
    (old.parent / ".metadata.json.tmp-7").write_text("half")  # 0.2.0's write killed midway
    flat.unlink()
    cdi.remove_spec(node.root / "cdi", ClaimUID("u4"))
    assert device_metadata.claims_with_files(node.state_dir) == {ClaimUID("u4")}

    assert node.state().start().problems == ()  # spec and flat file rebuilt; old file kept
    assert old.exists() and not (old.parent / ".metadata.json.tmp-7").exists()
    assert {m[1] for mounts in node.mounts("u4").values() for m in mounts} == {
        f"{BASE}/resourceclaimtemplates/from-0.2.0/gpu/gpu.nvidia.com-metadata.json"
    }
    assert node.state().unprepare([ref("u4")])[ClaimUID("u4")] == ""
    assert not (node.state_dir / device_metadata.HOST_SUBDIR / "u4").exists()
    assert not flat.exists()
