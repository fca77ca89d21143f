"""GPU Feature Discovery's labels of a node, computed from what the plugin publishes.

Cases: the real H200 of shared/fixtures read through NVML gets exactly GFD's labels and values
(product with spaces as ``-``, memory in MiB, the driver version's parts as printed); the
simulated profiles: eight H200s count 8; the A100 node with MIG counts its four physical GPUs
(MIG-enabled ones too) and gets the mixed-strategy labels of each MIG profile with devices; a
node of two products is labelled with the product of most GPUs; a product name a label value
cannot hold is made valid; GFD's family table; the merge patch sets what differs, removes only
the keys the plugin writes, and is empty when nothing changes; a node without GPUs loses them;
``apply`` sends one merge patch of the change to the node's path, none when nothing changes;
the labeler's thread patches at start and again after a re-discovery changes the devices, and a
re-discovery that changes nothing sends no patch.
"""

from __future__ import annotations

import queue
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from nvml_fakes import FakeGpu, FakeNvml

from dra_gpu.devices import naming, node_labels
from dra_gpu.devices.node_labels import node_labels as labels_of
from dra_gpu.devices.nvml import NvmlBackend
from dra_gpu.plugin import inventory, platforms
from dra_gpu.plugin import node_labels as applier

VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def simulated(profile: str) -> list[Any]:
    return inventory.discover(
        inventory.backend_for(platforms.for_node(simulate=profile, node_name="n1"))
    )


def test_the_fixture_h200_gets_gfds_labels(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(index=0, minor=0)])
    try:
        discovery = NvmlBackend(nvml=fake, sysfs_root=tmp_path).discover()
    finally:
        fake.release.set()
    assert labels_of(naming.build_devices(discovery.gpus)) == {
        "nvidia.com/dra-gpu.node-labels": "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "143771",  # 150754820096 bytes
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver.major": "580",
        "nvidia.com/cuda.driver.minor": "159",
        "nvidia.com/cuda.driver.rev": "04",  # as NVML prints it, as GFD writes it
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.driver-version.minor": "159",
        "nvidia.com/cuda.driver-version.revision": "04",
        "nvidia.com/cuda.driver-version.full": "580.159.04",
        "nvidia.com/cuda.runtime.major": "13",
        "nvidia.com/cuda.runtime.minor": "0",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "nvidia.com/cuda.runtime-version.full": "13.0",
        "nvidia.com/mig.capable": "true",
    }


def test_eight_simulated_h200s() -> None:
    labels = labels_of(simulated("h200x8"))
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == (
        "NVIDIA-H200",
        "8",
    )
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert "nvidia.com/mig.strategy" not in labels


def test_mig_node_counts_physical_gpus_and_gets_the_mixed_strategy_labels() -> None:
    devices = simulated("a100x4-mig")
    # MIG-enabled GPUs are published through their MIG devices only, and still count.
    assert len({d.gpu.uuid for d in devices}) == 4 > sum(d.type == "gpu" for d in devices)
    labels = labels_of(devices)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    migs = [d.mig for d in devices if d.mig is not None]
    profiles = {m.profile for m in migs}
    for profile in profiles:
        key = node_labels.mig_key(profile, "count")
        assert labels[key] == str(sum(m.profile == profile for m in migs)), key
    assert labels["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert labels["nvidia.com/mig-3g.20gb.slices.gi"] == "3"
    assert labels["nvidia.com/mig-1g.5gb-me.count"] == "1"  # "+me": "+" is no key character
    three = next(m for m in migs if m.profile == "3g.20gb")
    assert labels["nvidia.com/mig-3g.20gb.memory"] == str(three.memory_bytes >> 20)
    assert labels["nvidia.com/mig-3g.20gb.multiprocessors"] == str(three.engines.multiprocessors)
    for key, value in labels.items():
        prefix, _, name = key.partition("/")
        assert prefix == "nvidia.com" and KEY_NAME.match(name), key
        assert VALUE.match(value) and len(value) <= 63, (key, value)
        assert node_labels.owned(key), key


def test_two_products_label_the_one_of_most_gpus() -> None:
    h200 = simulated("h200x8")[:3]
    h100 = simulated("h100x8")[:5]
    labels = labels_of([*h200, *h100])
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.count"]) == (
        "NVIDIA-H100-80GB-HBM3",
        "5",
    )


def test_label_values_are_always_valid() -> None:
    assert node_labels.label_value("NVIDIA H200 NVL") == "NVIDIA-H200-NVL"
    assert node_labels.label_value("Tesla (T4) / x") == "Tesla--T4----x"
    assert node_labels.label_value("A" * 80) == "A" * 63
    assert node_labels.label_value(" GPU ") == "GPU"


@pytest.mark.parametrize(
    ("cc", "family"),
    [((7, 0), "volta"), ((7, 5), "turing"), ((8, 6), "ampere"), ((9, 0), "hopper")],
)
def test_gfd_families(cc: tuple[int, int], family: str) -> None:
    assert node_labels.family(*cc) == family
    assert node_labels.family(42, 0) == "undefined"


def test_patch_changes_only_what_differs_and_only_keys_it_writes() -> None:
    wanted = labels_of(simulated("h200x8"))
    current = {
        **wanted,
        "nvidia.com/gpu.count": "7",  # stale
        "nvidia.com/mig.strategy": "mixed",  # no longer true
        "nvidia.com/mig-1g.18gb.count": "2",  # a MIG profile gone
        "nvidia.com/gpu.machine": "HGX",  # GFD's, not ours
        "kubernetes.io/hostname": "n1",
    }
    assert node_labels.patch(current, wanted) == {
        "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.strategy": None,
        "nvidia.com/mig-1g.18gb.count": None,
    }
    assert node_labels.patch(wanted, wanted) == {}


def test_a_node_without_gpus_loses_the_labels() -> None:
    wanted = labels_of(simulated("h200x8"))
    assert labels_of([]) == {}
    removal = node_labels.patch({**wanted, "team": "ml"}, labels_of([]))
    assert removal == dict.fromkeys(wanted)


class Client:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.sent: list[tuple[str, str, Any, str]] = []

    def request(
        self, method: str, path: str, *, body: Any = None, content_type: str = "", **_: Any
    ) -> dict[str, Any]:
        self.sent.append((method, path, body, content_type))
        return {"metadata": {"name": "n1", "labels": self.labels}}


def test_apply_sends_one_merge_patch_to_the_node() -> None:
    client = Client({"kubernetes.io/hostname": "n1"})
    wanted = labels_of(simulated("h200x8"))
    change = applier.apply(client, "n1", wanted)  # type: ignore[arg-type]
    assert change == wanted
    get, patch = client.sent
    assert get[:2] == ("GET", "/api/v1/nodes/n1")
    assert patch == (
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"labels": wanted}},
        "application/merge-patch+json",
    )
    same = Client(dict(wanted))
    assert applier.apply(same, "n1", wanted) == {}  # type: ignore[arg-type]
    assert [s[0] for s in same.sent] == ["GET"]


class Node:
    """A Node whose labels merge patches change; each patch is queued for the test."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {"kubernetes.io/hostname": "n1"}
        self.patches: queue.Queue[dict[str, Any]] = queue.Queue()

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "PATCH":
            for key, value in body["metadata"]["labels"].items():
                if value is None:
                    self.labels.pop(key, None)
                else:
                    self.labels[key] = value
            self.patches.put(body["metadata"]["labels"])
        return {"metadata": {"name": "n1", "labels": dict(self.labels)}}


def test_the_labeler_follows_rediscovery_on_its_own_thread() -> None:
    node = Node()
    labeler = applier.NodeLabeler(node, "n1")  # type: ignore[arg-type]
    eight = simulated("h200x8")
    labeler.set_devices(eight)
    stop = threading.Event()
    labeler.start(stop)
    try:
        first = node.patches.get(timeout=60)
        assert first["nvidia.com/gpu.count"] == "8"
        labeler.set_devices(eight[:5])  # re-discovery: three GPUs gone
        assert node.patches.get(timeout=60) == {"nvidia.com/gpu.count": "5"}
        labeler.set_devices(eight[:5])  # the same again: nothing to send
        labeler.set_devices([])  # every GPU gone: every label of ours removed
        removal = node.patches.get(timeout=60)
        assert set(removal) == set(first) and set(removal.values()) == {None}
        assert node.labels == {"kubernetes.io/hostname": "n1"}
        assert node.patches.empty()
    finally:
        stop.set()
