"""What Kubernetes 1.37 asks of the driver, checked against NVML on a real GPU (``e2e.gpu.demo``).

For the pod ``cuda-one`` (one GPU from a ResourceClaimTemplate):

- its claim's ``status.devices`` has our driver's entry for the allocated device, with the GPU's
  UUID, product and PCI bus ID in ``data`` (KEP-4817);
- the container read its device metadata file (KEP-5304) from
  ``/var/run/kubernetes.io/dra-device-attributes``: the file names the claim and the device, and
  its ``uuid``, ``productName`` and ``resource.kubernetes.io/pciBusID`` are NVML's;
- the published ``resource.kubernetes.io/numaNode`` is NVML's NUMA node of the GPU, or sysfs's
  where NVML does not know it, and is absent where neither does (a VM's GPU reads ``-1``).

NVML is asked here directly (``pynvml``), not through the plugin's code, so a mistake in the
plugin's reading shows as a mismatch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gpu import DRIVER_NAME

METADATA_DIR = "/var/run/kubernetes.io/dra-device-attributes"
# What the check pod prints for each metadata file it finds, one JSON document between markers.
METADATA_SCRIPT = (
    f"for f in $(find {METADATA_DIR} -name '*-metadata.json' 2>/dev/null); do "
    'echo "metadata-file: $f"; cat "$f"; echo; echo metadata-end; done'
)
_METADATA_RE = re.compile(r"^metadata-file: (\S+)\n(.*?)\nmetadata-end$", re.MULTILINE | re.DOTALL)
ATTR_PCI = "resource.kubernetes.io/pciBusID"
ATTR_NUMA = "resource.kubernetes.io/numaNode"


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML (and sysfs) say of one GPU."""

    uuid: str
    product: str
    pci_bus_id: str  # the sysfs form, 0000:00:06.0
    numa_node: int | None  # None: unknown (NVML NotSupported and sysfs -1)
    numa_source: str


def nvml_facts(uuid: str, *, sysfs: Path = Path("/sys")) -> NvmlFacts:
    import pynvml

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        product = str(pynvml.nvmlDeviceGetName(h))
        bus = str(pynvml.nvmlDeviceGetPciInfo(h).busId)
        # NVML pads the domain to 8 digits (00000000:00:06.0); sysfs and Kubernetes use 4.
        domain, rest = bus.lower().split(":", 1)
        pci = f"{int(domain, 16):04x}:{rest}"
        numa: int | None = None
        source = "NVML"
        try:
            numa = int(pynvml.nvmlDeviceGetNumaNodeId(h))
        except (pynvml.NVMLError, AttributeError) as err:
            source = f"NVML: {err}"
        if numa is None or numa < 0:
            raw = (sysfs / "bus" / "pci" / "devices" / pci / "numa_node").read_text().strip()
            source += f"; sysfs numa_node {raw}"
            numa = int(raw) if int(raw) >= 0 else None
        return NvmlFacts(uuid, product, pci, numa, source)
    finally:
        pynvml.nvmlShutdown()


def metadata_files(log: str) -> dict[str, dict[str, Any]]:
    """Container path -> the metadata document the container printed."""
    found: dict[str, dict[str, Any]] = {}
    for path, text in _METADATA_RE.findall(log):
        try:
            found[path] = json.loads(text)
        except ValueError:
            found[path] = {"unparsed": text}
    return found


def plain(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes as a slice or metadata file writes them (``{"string": v}``), as plain values."""
    return {k: next(iter(v.values())) for k, v in attributes.items() if isinstance(v, dict) and v}


def metadata_device(document: Mapping[str, Any], device: str) -> dict[str, Any] | None:
    """Plain attributes of ``device`` (ours) in a metadata document; None if it is not there."""
    for request in document.get("requests") or []:
        for d in request.get("devices") or []:
            if d.get("driver") == DRIVER_NAME and d.get("name") == device:
                return plain(d.get("attributes") or {})
    return None


def status_entry(claim: Mapping[str, Any], device: str) -> dict[str, Any] | None:
    """Our driver's ``status.devices`` entry for ``device``."""
    for entry in (claim.get("status") or {}).get("devices") or []:
        if entry.get("driver") == DRIVER_NAME and entry.get("device") == device:
            return dict(entry)
    return None


@dataclass(frozen=True)
class Finding:
    what: str
    ok: bool
    detail: str


def check(
    *,
    claim: Mapping[str, Any],
    device: str,
    published: Mapping[str, Any],
    log: str,
    nvml: NvmlFacts,
) -> list[Finding]:
    """The three checks, each with what was seen."""
    out: list[Finding] = []
    entry = status_entry(claim, device) or {}
    data = entry.get("data") or {}
    ready = [c.get("status") for c in entry.get("conditions") or [] if c.get("type") == "Ready"]
    out.append(
        Finding(
            "claim status.devices: our entry with NVML's UUID, product and PCI bus ID in data",
            data.get("uuid") == nvml.uuid
            and data.get("productName") == nvml.product
            and str(data.get("pciBusID", "")).lower() == nvml.pci_bus_id
            and ready == ["True"],
            json.dumps(entry, sort_keys=True),
        )
    )
    files = metadata_files(log)
    attrs = next(
        (a for doc in files.values() if (a := metadata_device(doc, device)) is not None), None
    )
    seen = attrs or {}
    out.append(
        Finding(
            "metadata file read in the container: NVML's UUID, product and PCI bus ID",
            len(files) == 1
            and seen.get("uuid") == nvml.uuid
            and seen.get("productName") == nvml.product
            and str(seen.get(ATTR_PCI, "")).lower() == nvml.pci_bus_id,
            f"{sorted(files)}: uuid={seen.get('uuid')} productName={seen.get('productName')} "
            f"pciBusID={seen.get(ATTR_PCI)}",
        )
    )
    numa = published.get(ATTR_NUMA)
    out.append(
        Finding(
            "published numaNode is NVML's (absent where the GPU's NUMA node is unknown)",
            numa == nvml.numa_node and seen.get(ATTR_NUMA) == nvml.numa_node,
            f"published {numa}, metadata {seen.get(ATTR_NUMA)}, NVML/sysfs {nvml.numa_node} "
            f"({nvml.numa_source})",
        )
    )
    return out
