"""The GPU demo's node labels: GPU Feature Discovery's labels the plugin wrote from the real GPU.

The demo's first plugin runs with ``--node-labels true``. Once it has published, the Node
``gpu-node`` carries ``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ... Checks:

- the three a user selects by equal what the node's ResourceSlices say (``e2e.suite.node_labels``,
  as ``make demo`` shows them for the simulated nodes);
- every ``nvidia.com/`` label on the Node is what ``dra_gpu.devices.node_labels`` computes from
  the published devices (discovered here again through NVML, the plugin's backend; the names and
  UUIDs found must be the published ones): no label missing, none extra, no other value;
- the plugin added no label outside ``nvidia.com/`` (the Node's labels before it started against
  after it labelled).

:func:`judge` and :func:`lines` are pure; :func:`observe` reads the cluster and NVML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from e2e.suite import node_labels
from e2e.suite.kube import Kube, WaitTimeout
from e2e.suite.node_labels import NodeRow

Check = tuple[str, bool, str]


@dataclass(frozen=True)
class Seen:
    """The Node's labels before the plugin started and once it labelled the Node."""

    row: NodeRow
    before: Mapping[str, str]
    after: Mapping[str, str]


@dataclass(frozen=True)
class Wanted:
    """What ``node_labels.node_labels`` computes from the devices discovered through NVML, and
    those devices' names -> UUIDs."""

    labels: Mapping[str, str]
    uuids: Mapping[str, str]


def discover(driver_root: Path) -> Wanted:
    """The labels of the devices the plugin's NVML backend finds (read-only NVML queries)."""
    from dra_gpu.devices import naming
    from dra_gpu.devices import node_labels as compute
    from dra_gpu.devices.nvml import NvmlBackend

    devices = naming.build_devices(NvmlBackend(driver_root=driver_root).discover().gpus)
    return Wanted(compute.node_labels(devices), {d.name: d.uuid or "" for d in devices})


def judge(seen: Seen, wanted: Wanted, published: Mapping[str, str]) -> list[Check]:
    """The checks of the labels; ``published``: device name -> UUID from the node's slices."""
    row = seen.row
    differ = node_labels.differences(wanted.labels, seen.after)
    same_devices = dict(wanted.uuids) == dict(published)
    outside = node_labels.added_outside(seen.before, seen.after)
    return [
        (
            "the Node's nvidia.com/gpu.product, gpu.count, gpu.memory equal its ResourceSlices",
            row.equal,
            f"{' '.join(row.labels)}; slices {' '.join(row.slices)}: {row.verdict()}",
        ),
        (
            "every nvidia.com/ label is dra_gpu.devices.node_labels of the published devices",
            same_devices and not differ and bool(wanted.labels),
            (
                f"{len(wanted.labels)} labels, all equal"
                if same_devices and not differ
                else "; ".join(
                    ([] if same_devices else [f"NVML finds {wanted.uuids}, published {published}"])
                    + differ
                )
            ),
        ),
        (
            "the plugin added no Node label outside nvidia.com/",
            not outside,
            ", ".join(outside) or "none",
        ),
    ]


def lines(seen: Seen) -> list[str]:
    """The report's section: the ``kubectl get nodes -L`` table, then every ``nvidia.com/``
    label of the Node, sorted."""
    return [*node_labels.table_lines([seen.row]), "", *node_labels.label_lines(seen.after)]


def observe(kube: Kube, node: str, *, before: Mapping[str, str], timeout: float) -> Seen:
    """The Node's labels once its GFD labels equal its slices, or as they are after ``timeout``
    (a Node never labelled fails the checks rather than ending the demo)."""
    try:
        (row,) = node_labels.wait_labelled(kube, [node], timeout=timeout)
    except WaitTimeout:
        (row,) = node_labels.rows(kube, [node])
    return Seen(row, dict(before), node_labels.node_labels_of(kube, node))
