"""Read the facts a real node's CDI specs need: driver files, device node root, MIG caps.

I/O only; the spec itself is built by the pure :func:`dra_gpu.prepare.cdi.build_spec`.

- Driver root: where the NVIDIA user-space driver lives as the plugin sees it, ``/`` for a
  host install or e.g. ``/run/nvidia/driver`` for a driver container. The files found under it
  are mounted at their path relative to the root. The plugin may see the root under another
  path than the runtime does (``host_driver_root``), so host paths are rewritten to that.
- Device nodes live under ``<driver root>/dev`` when the driver container created them there,
  else under ``/dev``.
- MIG: the kernel exposes each GPU/compute instance's capability device minor in
  ``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` (and ``.../ci<C>/access``)
  as a ``DeviceFileMinor: <n>`` line; the node is ``/dev/nvidia-caps/nvidia-cap<n>``.

A wrong driver root is a clear error (no ``libcuda.so.*`` found) rather than an empty spec, which
would make containers start without a usable GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Final

from dra_gpu.prepare.cdi import CDIError, Mount, RealNode

LIBRARY_DIRS: Final = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
)
BINARY_DIRS: Final = ("usr/bin", "usr/sbin", "bin", "sbin")

# Libraries CUDA applications and the management tools load (NVIDIA's "compute" and "utility").
LIBRARIES: Final = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-cfg.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-opencl.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
)
BINARIES: Final = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)

_MINOR_RE: Final = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


def _find_libraries(root: Path) -> Iterator[Path]:
    for directory in LIBRARY_DIRS:
        base = root / directory
        if not base.is_dir():
            continue
        for name in LIBRARIES:
            # Versioned files and their SONAME links (libcuda.so.1); bind-mounting a link
            # mounts its target at the link's path, so both names resolve in the container.
            yield from sorted(base.glob(f"{name}.*"))


def _find_binaries(root: Path) -> Iterator[Path]:
    for directory in BINARY_DIRS:
        for name in BINARIES:
            path = root / directory / name
            if path.is_file():
                yield path


def driver_mounts(driver_root: Path, *, host_driver_root: PurePosixPath | None) -> list[Mount]:
    """Bind mounts for the driver's user-space files; raises CDIError if there is no driver."""
    host_root = host_driver_root or PurePosixPath(driver_root)
    mounts: dict[str, Mount] = {}
    libraries = list(_find_libraries(driver_root))
    if not any(p.name.startswith("libcuda.so.") for p in libraries):
        raise CDIError(
            f"no NVIDIA driver libraries (libcuda.so.*) under driver root {driver_root} "
            f"(looked in {', '.join(LIBRARY_DIRS)}); check --driver-root"
        )
    for path in (*libraries, *_find_binaries(driver_root)):
        relative = path.relative_to(driver_root).as_posix()
        container_path = "/" + relative
        mounts.setdefault(container_path, Mount(str(host_root / relative), container_path))
    return list(mounts.values())


def dev_root(driver_root: Path, *, host_driver_root: PurePosixPath | None) -> PurePosixPath:
    """Host directory whose ``dev/`` holds the NVIDIA device nodes."""
    if (driver_root / "dev" / "nvidiactl").exists() and driver_root != Path("/"):
        return host_driver_root or PurePosixPath(driver_root)
    return PurePosixPath("/")


def _read_minor(path: Path) -> int:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CDIError(f"cannot read MIG capability {path}: {exc.strerror}") from exc
    match = _MINOR_RE.search(text)
    if match is None:
        raise CDIError(f"no DeviceFileMinor line in {path}")
    return int(match[1])


def mig_caps(
    proc_root: Path, instances: Iterable[tuple[int, int, int]]
) -> dict[tuple[int, int, int], tuple[int, int]]:
    """Capability device minors for each (gpu minor, gi, ci); raises CDIError if unreadable."""
    base = proc_root / "driver" / "nvidia" / "capabilities"
    caps: dict[tuple[int, int, int], tuple[int, int]] = {}
    for minor, gi, ci in instances:
        gi_dir = base / f"gpu{minor}" / "mig" / f"gi{gi}"
        caps[(minor, gi, ci)] = (
            _read_minor(gi_dir / "access"),
            _read_minor(gi_dir / f"ci{ci}" / "access"),
        )
    return caps


def read_real_node(
    *,
    driver_root: Path,
    proc_root: Path = Path("/proc"),
    host_driver_root: PurePosixPath | None = None,
    mig_instances: Iterable[tuple[int, int, int]] = (),
) -> RealNode:
    """All facts for :class:`RealNode`; the MIG part only for the instances asked for."""
    return RealNode(
        dev_root=dev_root(driver_root, host_driver_root=host_driver_root),
        driver_mounts=tuple(driver_mounts(driver_root, host_driver_root=host_driver_root)),
        mig_caps=mig_caps(proc_root, mig_instances),
    )
