"""PCI naming: NVML bus IDs to the sysfs form, and the PCIe root of a device from sysfs.

``resource.kubernetes.io/pciBusID`` uses the sysfs spelling ``0000:00:06.0`` (4-digit domain,
lower case) while NVML prints ``00000000:00:06.0``. The PCIe root is the first component of the
device's resolved sysfs path: ``/sys/bus/pci/devices/<busid>`` is a link into
``/sys/devices/pci<domain>:<bus>/...``, and devices under one root share a root complex, which
is what ``matchAttribute: resource.kubernetes.io/pcieRoot`` is for (GPU next to its NIC).
The device's ``numa_node`` file holds its NUMA node, or ``-1`` when the firmware does not say
(what a VM typically reads).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_BUS_ID = re.compile(
    r"^(?P<domain>[0-9a-fA-F]{1,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)
_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def normalize_bus_id(raw: str | bytes) -> str:
    """``b"00000000:00:06.0"`` -> ``"0000:00:06.0"``. Raises ValueError on anything else."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    m = _BUS_ID.match(text.strip().rstrip("\x00"))
    if m is None:
        raise ValueError(f"not a PCI bus ID: {text!r}")
    domain = int(m["domain"], 16)
    return f"{domain:04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn']}"


def pcie_root(bus_id: str, *, sysfs_root: Path = Path("/sys")) -> str | None:
    """``"pci0000:00"`` for a device, or None when sysfs has no (resolvable) entry for it."""
    link = sysfs_root / "bus" / "pci" / "devices" / bus_id
    if not link.exists():
        return None
    for part in Path(os.path.realpath(link)).parts:
        if _ROOT.match(part):
            return part
    return None


def numa_node(bus_id: str, *, sysfs_root: Path = Path("/sys")) -> int | None:
    """The device's NUMA node from sysfs; None when absent, unreadable or ``-1`` (unknown)."""
    path = sysfs_root / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
