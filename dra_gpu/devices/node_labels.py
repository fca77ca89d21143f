"""The Node labels of a GPU node, in GPU Feature Discovery's names and formats (pure).

Pods and tools select GPU nodes by the labels GPU Feature Discovery (GFD) writes
(``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory``, ...). A DRA-only cluster runs no GFD, so
the kubelet plugin writes the labels of what it publishes (``plugin.node_labels`` applies them);
where GFD runs too, both write the same values (docs/user/node-pools.md says which wins).

Names and value formats follow GFD's labelers (NVIDIA/k8s-device-plugin, ``internal/lm``):

- ``nvidia.com/gpu.present``: ``true``;
- ``nvidia.com/gpu.product``: the product name with spaces as ``-`` (``NVIDIA-H200``);
  ``gpu.count``: the GPUs of that product; ``gpu.memory``: one GPU's memory in MiB;
- ``gpu.family`` (from the compute capability, GFD's table), ``gpu.compute.major/minor``;
- ``cuda.driver.major/minor/rev``: the parts of the kernel driver version as NVML prints it
  (``580``, ``159``, ``04``), ``cuda.runtime.major/minor``: the CUDA version the driver supports;
  and GFD's newer names for the same (``cuda.driver-version.*``, ``cuda.runtime-version.*``);
- ``nvidia.com/mig.capable``: whether any GPU supports MIG;
- the MIG "mixed" strategy, which is how a DRA driver publishes MIG devices (whole GPUs and MIG
  devices side by side): ``nvidia.com/mig.strategy=mixed`` when a GPU has MIG on, and for each
  MIG profile with devices ``nvidia.com/mig-<profile>.count``, ``.product``, ``.memory``,
  ``.multiprocessors``, ``.slices.gi``, ``.slices.ci`` and ``.engines.*``.

Which GPUs: every physical GPU behind a published device (a MIG-enabled GPU is published only
through its MIG devices, and still counts, as in GFD). A node whose GPUs are of more than one
product is labelled with the product of most GPUs (the lowest minor breaks a tie), and
``gpu.count`` counts that product's GPUs, as GFD's labels describe one product.

A label value must match Kubernetes' syntax (63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at
both ends): a product name with other characters has them turned into ``-`` and is cut to 63;
a MIG profile's ``+`` (``1g.5gb+me``) becomes ``-`` in label keys.

:data:`MARKER` tells which nodes carry labels of this driver (``dra-gpu remove-node-labels``
looks for it); :func:`patch` is the JSON merge patch from a node's labels to the wanted ones,
removing the keys this module writes that are no longer wanted and leaving every other label.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from dra_gpu.devices.migprofiles import MIB
from dra_gpu.devices.model import Device, GpuInfo, MigDeviceInfo

PREFIX = "nvidia.com/"
PRESENT = "nvidia.com/gpu.present"
PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"
FAMILY = "nvidia.com/gpu.family"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"
DRIVER_MINOR = "nvidia.com/cuda.driver.minor"
DRIVER_REV = "nvidia.com/cuda.driver.rev"
RUNTIME_MAJOR = "nvidia.com/cuda.runtime.major"
RUNTIME_MINOR = "nvidia.com/cuda.runtime.minor"
DRIVER_VERSION_MAJOR = "nvidia.com/cuda.driver-version.major"
DRIVER_VERSION_MINOR = "nvidia.com/cuda.driver-version.minor"
DRIVER_VERSION_REVISION = "nvidia.com/cuda.driver-version.revision"
DRIVER_VERSION_FULL = "nvidia.com/cuda.driver-version.full"
RUNTIME_VERSION_MAJOR = "nvidia.com/cuda.runtime-version.major"
RUNTIME_VERSION_MINOR = "nvidia.com/cuda.runtime-version.minor"
RUNTIME_VERSION_FULL = "nvidia.com/cuda.runtime-version.full"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_STRATEGY_MIXED = "mixed"
#: On every node this driver labels; not one of GFD's.
MARKER = "nvidia.com/dra-gpu.node-labels"

#: Every fixed key this module may write (the per-profile MIG keys match :data:`_MIG_KEY`).
FIXED_KEYS: frozenset[str] = frozenset(
    {
        PRESENT,
        PRODUCT,
        COUNT,
        MEMORY,
        FAMILY,
        COMPUTE_MAJOR,
        COMPUTE_MINOR,
        DRIVER_MAJOR,
        DRIVER_MINOR,
        DRIVER_REV,
        RUNTIME_MAJOR,
        RUNTIME_MINOR,
        DRIVER_VERSION_MAJOR,
        DRIVER_VERSION_MINOR,
        DRIVER_VERSION_REVISION,
        DRIVER_VERSION_FULL,
        RUNTIME_VERSION_MAJOR,
        RUNTIME_VERSION_MINOR,
        RUNTIME_VERSION_FULL,
        MIG_CAPABLE,
        MIG_STRATEGY,
        MARKER,
    }
)
_MIG_SUFFIXES = (
    "count",
    "product",
    "memory",
    "multiprocessors",
    "slices.gi",
    "slices.ci",
    "engines.copy",
    "engines.decoder",
    "engines.encoder",
    "engines.jpeg",
    "engines.ofa",
)
_MIG_KEY = re.compile(
    r"^nvidia\.com/mig-[a-z0-9.-]+\.(" + "|".join(re.escape(s) for s in _MIG_SUFFIXES) + r")$"
)
_NOT_VALUE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_PROFILE_PARTS = re.compile(r"(?:(?P<ci>\d+)c\.)?(?P<gi>\d+)g\.")
VALUE_MAX = 63
# Compute capability major -> GFD's family name (7 is split by minor: volta, turing).
_FAMILIES: Mapping[int, str] = {
    1: "tesla",
    2: "fermi",
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    8: "ampere",
    9: "hopper",
}

Labels = dict[str, str]


def owned(key: str) -> bool:
    """Whether ``key`` is one this module writes (and so may remove)."""
    return key in FIXED_KEYS or _MIG_KEY.match(key) is not None


def family(major: int, minor: int) -> str:
    """GFD's architecture family of a compute capability (``undefined`` for one it does not
    name)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    return _FAMILIES.get(major, "undefined")


def label_value(text: str) -> str:
    """``text`` as a valid label value: spaces (and anything else a value cannot hold) as
    ``-``, at most 63 characters, alphanumeric at both ends."""
    value = _NOT_VALUE_CHARS.sub("-", text.strip())[:VALUE_MAX]
    return value.strip("-_.")


def physical_gpus(devices: Iterable[Device]) -> list[GpuInfo]:
    """The GPUs behind ``devices``, one each (by UUID), in minor order."""
    by_uuid = {d.gpu.uuid: d.gpu for d in devices}
    return sorted(by_uuid.values(), key=lambda g: g.minor)


def node_labels(devices: Sequence[Device]) -> Labels:
    """The labels of a node publishing ``devices``; empty when it has none."""
    gpus = physical_gpus(devices)
    if not gpus:
        return {}
    counts = Counter(g.product_name for g in gpus)
    product = max(counts, key=lambda name: (counts[name], -_first_minor(gpus, name)))
    first = next(g for g in gpus if g.product_name == product)
    labels: Labels = {
        MARKER: "true",
        PRESENT: "true",
        PRODUCT: label_value(product),
        COUNT: str(counts[product]),
        MEMORY: str(first.memory_bytes // MIB),
        MIG_CAPABLE: "true" if any(g.mig_capable for g in gpus) else "false",
    }
    major, minor = first.cuda_compute_capability
    if major != 0:
        labels |= {
            FAMILY: family(major, minor),
            COMPUTE_MAJOR: str(major),
            COMPUTE_MINOR: str(minor),
        }
    labels |= _versions(first.driver_version, first.cuda_driver_version)
    if any(g.mig_enabled for g in gpus):
        labels[MIG_STRATEGY] = MIG_STRATEGY_MIXED
        migs = [d.mig for d in devices if d.mig is not None]
        labels |= _mig_labels(migs, {g.uuid: g for g in gpus})
    return labels


def _first_minor(gpus: Sequence[GpuInfo], product: str) -> int:
    return min(g.minor for g in gpus if g.product_name == product)


def _versions(driver: str, cuda: str) -> Labels:
    """GFD's version labels: the driver's parts as printed (``04`` stays ``04``), and CUDA's."""
    out: Labels = {}
    parts = driver.strip().split(".")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        rev = parts[2] if len(parts) == 3 else ""
        out |= {
            DRIVER_MAJOR: parts[0],
            DRIVER_MINOR: parts[1],
            DRIVER_REV: rev,
            DRIVER_VERSION_MAJOR: parts[0],
            DRIVER_VERSION_MINOR: parts[1],
            DRIVER_VERSION_REVISION: rev,
            DRIVER_VERSION_FULL: driver.strip(),
        }
    cuda_parts = cuda.strip().split(".")
    if len(cuda_parts) >= 2 and all(p.isdigit() for p in cuda_parts[:2]):
        major, minor = str(int(cuda_parts[0])), str(int(cuda_parts[1]))
        out |= {
            RUNTIME_MAJOR: major,
            RUNTIME_MINOR: minor,
            RUNTIME_VERSION_MAJOR: major,
            RUNTIME_VERSION_MINOR: minor,
            RUNTIME_VERSION_FULL: f"{major}.{minor}",
        }
    return out


def mig_key(profile: str, suffix: str) -> str:
    """``nvidia.com/mig-<profile>.<suffix>``, the profile's ``+`` as ``-``."""
    return f"nvidia.com/mig-{profile.lower().replace('+', '-')}.{suffix}"


def _mig_labels(migs: Sequence[MigDeviceInfo], parents: Mapping[str, GpuInfo]) -> Labels:
    """GFD's mixed-strategy labels: one set per MIG profile that has devices."""
    out: Labels = {}
    by_profile: dict[str, list[MigDeviceInfo]] = {}
    for mig in migs:
        by_profile.setdefault(mig.profile, []).append(mig)
    for profile, same in sorted(by_profile.items()):
        mig = same[0]
        parent = parents.get(mig.parent_uuid)
        model = parent.product_name if parent is not None else ""
        parts = _PROFILE_PARTS.match(profile)
        gi = int(parts["gi"]) if parts else 0
        ci = int(parts["ci"]) if parts and parts["ci"] else gi
        engines = mig.engines
        values: Mapping[str, int | str] = {
            "count": len(same),
            "product": label_value(f"{model}-MIG-{profile}"),
            "memory": mig.memory_bytes // MIB,
            "multiprocessors": engines.multiprocessors,
            "slices.gi": gi,
            "slices.ci": ci,
            "engines.copy": engines.copy_engines,
            "engines.decoder": engines.decoders,
            "engines.encoder": engines.encoders,
            "engines.jpeg": engines.jpeg_engines,
            "engines.ofa": engines.ofa_engines,
        }
        out |= {mig_key(profile, suffix): str(value) for suffix, value in values.items()}
    return out


def patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """The ``metadata.labels`` of a JSON merge patch taking ``current`` to ``wanted`` for the
    keys this module owns (``None`` removes one); empty when nothing changes. Labels it does not
    own are never touched."""
    out: dict[str, str | None] = {k: v for k, v in wanted.items() if current.get(k) != v}
    out |= {k: None for k in current if owned(k) and k not in wanted}
    return out
