"""GPU Feature Discovery's node labels as the kubelet plugin writes them, held against the node's
ResourceSlices and against what the driver's own computation wants (any cluster).

A plugin run with ``--node-labels true`` (the chart's default, docs/user/node-pools.md) labels its
Node ``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ... of what it publishes.
:func:`rows` reads, for each node, the three labels a user selects by beside the same three
values read from the node's ResourceSlices (:func:`from_slices`); :func:`wait_labelled` waits
until they are equal (the plugin writes them on its own thread, soon after it publishes);
:func:`section` prints what ``kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,
nvidia.com/gpu.memory`` prints with the slices' verdict beside each row.

:func:`differences` holds every ``nvidia.com/`` label of a node against the labels
``dra_gpu.devices.node_labels`` computes from the published devices (missing, extra, other
values), and :func:`added_outside` names the labels a step added outside ``nvidia.com/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gpu import DRIVER_NAME
from dra_gpu.config.quantity import to_bytes
from dra_gpu.devices import node_labels
from e2e.suite.kube import Kube, wait_for

LABELS = (node_labels.PRODUCT, node_labels.COUNT, node_labels.MEMORY)
FLAGS = ("--node-labels", "true")


@dataclass(frozen=True)
class NodeRow:
    node: str
    labels: tuple[str, str, str]  # product, count, memory as labelled ("" when missing)
    slices: tuple[str, str, str]  # the same, from the node's ResourceSlices

    @property
    def equal(self) -> bool:
        """Product and count equal; memory too where the slices tell it (a node whose GPUs are
        all MIG-enabled publishes only MIG devices, which hold part of a GPU's memory)."""
        known = 3 if self.slices[2] else 2
        return self.labels[:known] == self.slices[:known]

    def verdict(self) -> str:
        if not self.equal:
            return "DIFFERS: " + " ".join(self.slices)
        return "equal" if self.slices[2] else "equal (memory: MIG devices only)"


def from_slices(slices: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(product with spaces as -, physical GPUs, one GPU's memory in MiB) of a node's devices:
    its product of most GPUs, as the labels count them."""
    gpus: dict[str, tuple[str, int]] = {}
    for s in slices:
        for device in s["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            uuid = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")
            if not uuid:
                continue
            product = attrs["productName"]["string"].replace(" ", "-")
            memory = device.get("capacity", {}).get("memory", {}).get("value")
            if "parentUUID" not in attrs and memory:
                gpus[uuid] = (product, to_bytes(memory) >> 20)
            else:
                gpus.setdefault(uuid, (product, 0))
    if not gpus:
        return ("", "", "")
    products = [p for p, _ in gpus.values()]
    top = max(set(products), key=products.count)
    memories = [m for p, m in gpus.values() if p == top and m]
    return (top, str(products.count(top)), str(memories[0]) if memories else "")


def node_labels_of(kube: Kube, node: str) -> dict[str, str]:
    """Every label of ``node``."""
    read = kube.as_dict(kube.core.read_node(node))
    return {str(k): str(v) for k, v in (read["metadata"].get("labels") or {}).items()}


def row(node: str, labels: Mapping[str, str], slices: Sequence[Mapping[str, Any]]) -> NodeRow:
    """One node's row: its labels beside its own slices of this driver (``slices`` may hold
    other nodes' and drivers')."""
    mine = [
        s
        for s in slices
        if s["spec"].get("nodeName") == node and s["spec"].get("driver") == DRIVER_NAME
    ]
    labelled = (labels.get(LABELS[0], ""), labels.get(LABELS[1], ""), labels.get(LABELS[2], ""))
    return NodeRow(node, labelled, from_slices(mine))


def rows(kube: Kube, nodes: Sequence[str]) -> list[NodeRow]:
    slices = kube.slices()
    return [row(name, node_labels_of(kube, name), slices) for name in nodes]


def wait_labelled(kube: Kube, nodes: Sequence[str], *, timeout: float = 60.0) -> list[NodeRow]:
    """The rows once every node carries the labels of its slices."""

    def labelled() -> list[NodeRow] | None:
        table = rows(kube, nodes)
        return table if all(r.equal for r in table) else None

    return wait_for(
        f"the GFD labels of {', '.join(nodes)} equal to their slices", labelled, timeout=timeout
    )


def table_lines(table: Sequence[NodeRow]) -> list[str]:
    """``kubectl get nodes -L ...`` and its rows, with the slices' values beside them."""
    head = ("NAME", "GPU.PRODUCT", "GPU.COUNT", "GPU.MEMORY", "FROM SLICES")
    cells = [(r.node, *r.labels, r.verdict()) for r in table]
    widths = [max(len(str(c[i])) for c in [head, *cells]) for i in range(len(head))]
    lines = ["kubectl get nodes -L " + ",".join(LABELS)]
    for c in [head, *cells]:
        lines.append("  ".join(str(v).ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
    return lines


def section(table: Sequence[NodeRow]) -> str:
    """:func:`table_lines` under a title, indented."""
    title = (
        "Node labels (GPU Feature Discovery's names, written by the plugins;"
        " docs/user/node-pools.md):"
    )
    return "\n".join([title, *("  " + line for line in table_lines(table))])


def driver_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels under ``nvidia.com/``, where the plugin writes."""
    return {k: v for k, v in labels.items() if k.startswith(node_labels.PREFIX)}


def label_lines(labels: Mapping[str, str]) -> list[str]:
    """``key=value`` of every ``nvidia.com/`` label, sorted by key."""
    return [f"{k}={v}" for k, v in sorted(driver_labels(labels).items())]


def differences(wanted: Mapping[str, str], labels: Mapping[str, str]) -> list[str]:
    """How a node's ``nvidia.com/`` labels differ from ``wanted`` (``node_labels.node_labels``
    of its published devices): one line per key missing, extra or with another value; empty
    when they are the same."""
    have = driver_labels(labels)
    out = [f"missing {k}={wanted[k]}" for k in sorted(wanted.keys() - have.keys())]
    out += [f"extra {k}={have[k]}" for k in sorted(have.keys() - wanted.keys())]
    out += [
        f"{k}={have[k]}, wanted {wanted[k]}"
        for k in sorted(wanted.keys() & have.keys())
        if have[k] != wanted[k]
    ]
    return out


def added_outside(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """``key=value`` of each label ``after`` holds outside ``nvidia.com/`` that ``before`` did
    not (or with another value)."""
    return [
        f"{k}={v}"
        for k, v in sorted(after.items())
        if not k.startswith(node_labels.PREFIX) and before.get(k) != v
    ]
