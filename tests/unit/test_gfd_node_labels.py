"""GPU Feature Discovery's labels held against the slices and the driver's computation: what
``make demo`` prints for its nodes and what the GPU demo checks on the real GPU's Node.

Cases: a simulated H200 node labelled from its own devices shows NVIDIA-H200, 8, 143771 in the
``kubectl get nodes -L`` table, "equal" to its slices (other nodes' slices are not counted), the
table under its title as ``make demo`` prints it; a count that differs from the slices is shown
as such; the Node's ``nvidia.com/`` labels against the computed ones name each missing, extra and
other value and ignore labels outside ``nvidia.com/``; a label added outside ``nvidia.com/`` is
named; the GPU demo's three label checks pass for a Node labelled from its published devices and
fail, naming why, for a stale MIG label, a label outside ``nvidia.com/``, devices other than the
published ones, or a Node never labelled.
"""

from __future__ import annotations

from typing import Any

from dra_gpu.devices import node_labels as compute
from dra_gpu.devices.model import Device
from dra_gpu.plugin import inventory, node_plugin, platforms
from dra_gpu.plugin import settings as plugin_settings
from e2e.gpu import gfd_labels
from e2e.suite import node_labels

BEFORE = {"kubernetes.io/hostname": "n1", "kubernetes.io/os": "linux"}


def devices_of(profile: str, node: str = "n1") -> list[Device]:
    platform = platforms.for_node(simulate=profile, node_name=node)
    return inventory.discover(inventory.backend_for(platform))


def slices_of(profile: str, node: str = "n1") -> list[dict[str, Any]]:
    settings = plugin_settings.build_settings({"node_name": node, "simulate": profile}, {})
    rendered = node_plugin.renderer(settings, devices_of(profile, node))("uid-1")
    return [dict(s) for s in rendered]


def labelled(profile: str) -> dict[str, str]:
    """The Node's labels once the plugin labelled it: the kubelet's and the computed ones."""
    return {**BEFORE, **compute.node_labels(devices_of(profile))}


def test_a_node_labelled_from_its_devices_equals_its_slices_in_the_table() -> None:
    slices = slices_of("h200x8") + slices_of("a100x4-mig", node="n2")
    row = node_labels.row("n1", labelled("h200x8"), slices)
    assert row.labels == row.slices == ("NVIDIA-H200", "8", "143771")
    assert row.equal
    lines = node_labels.table_lines([row])
    assert lines[0] == (
        "kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,nvidia.com/gpu.memory"
    )
    assert lines[1].split() == ["NAME", "GPU.PRODUCT", "GPU.COUNT", "GPU.MEMORY", "FROM", "SLICES"]
    assert lines[2].split() == ["n1", "NVIDIA-H200", "8", "143771", "equal"]
    text = node_labels.section([row]).splitlines()  # what make demo prints
    assert text[0].startswith("Node labels (GPU Feature Discovery's names")
    assert text[1:] == ["  " + line for line in lines]


def test_a_count_other_than_the_slices_differs() -> None:
    labels = {**labelled("h200x8"), compute.COUNT: "7"}
    row = node_labels.row("n1", labels, slices_of("h200x8"))
    assert not row.equal
    assert row.verdict() == "DIFFERS: NVIDIA-H200 8 143771"


def test_differences_name_missing_extra_and_other_values_of_nvidia_com_only() -> None:
    wanted = compute.node_labels(devices_of("h200x8"))
    assert node_labels.differences(wanted, labelled("h200x8")) == []
    have = {**labelled("h200x8"), compute.MEMORY: "1", "nvidia.com/mig.strategy": "mixed"}
    del have[compute.PRESENT]
    assert node_labels.differences(wanted, {**have, "team": "ml"}) == [
        "missing nvidia.com/gpu.present=true",
        "extra nvidia.com/mig.strategy=mixed",
        "nvidia.com/gpu.memory=1, wanted 143771",
    ]


def test_labels_added_outside_nvidia_com_are_named() -> None:
    after = {**labelled("h200x8"), "team": "ml", "kubernetes.io/os": "windows"}
    assert node_labels.added_outside(BEFORE, labelled("h200x8")) == []
    assert node_labels.added_outside(BEFORE, after) == ["kubernetes.io/os=windows", "team=ml"]


def _seen(after: dict[str, str], profile: str = "h200x8") -> gfd_labels.Seen:
    return gfd_labels.Seen(node_labels.row("n1", after, slices_of(profile)), BEFORE, after)


def _wanted(profile: str = "h200x8") -> gfd_labels.Wanted:
    devices = devices_of(profile)
    return gfd_labels.Wanted(compute.node_labels(devices), {d.name: d.uuid or "" for d in devices})


def test_the_gpu_demos_label_checks_pass_for_a_node_labelled_from_its_devices() -> None:
    wanted = _wanted()
    checks = gfd_labels.judge(_seen(labelled("h200x8")), wanted, dict(wanted.uuids))
    assert [ok for _what, ok, _detail in checks] == [True, True, True], checks
    assert checks[1][2] == f"{len(wanted.labels)} labels, all equal"
    lines = gfd_labels.lines(_seen(labelled("h200x8")))
    assert lines[2].split()[:4] == ["n1", "NVIDIA-H200", "8", "143771"]
    listed = lines[lines.index("") + 1 :]
    assert listed == sorted(listed) and "nvidia.com/gpu.product=NVIDIA-H200" in listed
    assert len(listed) == len(wanted.labels)  # no label outside nvidia.com/ listed


def test_a_stale_label_or_one_outside_nvidia_com_fails_naming_it() -> None:
    wanted = _wanted()
    after = {**labelled("h200x8"), "nvidia.com/mig-1g.18gb.count": "7", "team": "ml"}
    checks = gfd_labels.judge(_seen(after), wanted, dict(wanted.uuids))
    assert [ok for _what, ok, _detail in checks] == [True, False, False]
    assert checks[1][2] == "extra nvidia.com/mig-1g.18gb.count=7"
    assert checks[2][2] == "team=ml"


def test_labels_of_devices_other_than_the_published_fail() -> None:
    wanted = _wanted()
    published = {**wanted.uuids, "gpu-0": "GPU-elsewhere"}
    _what, ok, detail = gfd_labels.judge(_seen(labelled("h200x8")), wanted, published)[1]
    assert not ok and "GPU-elsewhere" in detail


def test_a_node_never_labelled_fails_every_label_check_but_the_outside_one() -> None:
    wanted = _wanted()
    checks = gfd_labels.judge(_seen(dict(BEFORE)), wanted, dict(wanted.uuids))
    assert [ok for _what, ok, _detail in checks] == [False, False, True]
    assert "missing nvidia.com/gpu.product=NVIDIA-H200" in checks[1][2]
