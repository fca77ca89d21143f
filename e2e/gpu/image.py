"""The CUDA check image: what a pod on a real GPU node runs to report what CUDA sees.

One layer, built like the other local images (``e2e.images``: deterministic docker-archive, no
registry, no Docker): static busybox for the shell, ``gpucheck`` (``gpucheck.c``, compiled here
with the machine's gcc) and the glibc it and the driver's user-space files need. The image
carries no NVIDIA file at all: ``libcuda.so.1``, ``libnvidia-ml.so.1`` and ``nvidia-smi`` reach
the container only through the claim's CDI spec, as in production, so a pod without a claim sees
no GPU.

Where the CDI spec puts the driver files depends on the node's driver root: a host install
(``/``) mounts them at their multiarch paths, which the loader searches by default; a driver root
laid out as ``lib64/`` + ``bin/`` (``/usr/local/nvidia`` on the GPU machines here, and on GKE)
mounts them at ``/lib64`` and ``/bin``. ``LD_LIBRARY_PATH`` covers both, without an ldconfig hook.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from e2e.images import node_images as images

CHECK_IMAGE = "localhost/dra-gpu/cuda-check:2"
SOURCE = Path(__file__).with_name("gpucheck.c")
# The C library the check binary links and what libcuda and nvidia-smi load from the image.
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1")
LOADER = "ld-linux-x86-64.so.2"
LIB_DIR = "lib/x86_64-linux-gnu"
ENV = (
    "PATH=/usr/local/bin:/bin:/usr/bin:/sbin:/usr/sbin",
    "LD_LIBRARY_PATH=/lib64:/usr/lib64:/lib/x86_64-linux-gnu",
)


def build_gpucheck(out: Path) -> Path:
    """Compile ``gpucheck.c`` into ``out`` (atomic); reuse it when present."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = ["gcc", "-O2", "-s", "-Wall", "-Werror", "-o", str(tmp), str(SOURCE), "-ldl"]
    subprocess.run(cmd, check=True)
    tmp.replace(out)
    return out


def _host_library(name: str, dirs: tuple[Path, ...]) -> bytes:
    for directory in dirs:
        path = directory / name
        if path.is_file():
            return path.resolve().read_bytes()
    raise FileNotFoundError(f"{name} not found in {', '.join(map(str, dirs))}")


def check_spec(
    gpucheck: Path,
    *,
    busybox: Path = images.BUSYBOX,
    lib_dirs: tuple[Path, ...] = (Path("/lib/x86_64-linux-gnu"), Path("/usr/lib/x86_64-linux-gnu")),
) -> images.ImageSpec:
    """The check image's layer: busybox's, plus ``gpucheck`` and the C library."""
    base = images.busybox_spec(busybox)
    entries = [e for e in base.entries if e.path != "usr"]
    entries += [
        images.Entry(d, "dir")
        for d in ("lib", "lib/x86_64-linux-gnu", "lib64", "usr", "usr/local", "usr/local/bin")
    ]
    entries.append(
        images.Entry("usr/local/bin/gpucheck", "file", data=gpucheck.read_bytes(), mode=0o755)
    )
    for name in GLIBC:
        data = _host_library(name, lib_dirs)
        entries.append(images.Entry(f"{LIB_DIR}/{name}", "file", data=data, mode=0o755))
    loader = _host_library(LOADER, lib_dirs)
    entries.append(images.Entry(f"{LIB_DIR}/{LOADER}", "file", data=loader, mode=0o755))
    entries.append(images.Entry(f"lib64/{LOADER}", "symlink", target=f"../{LIB_DIR}/{LOADER}"))
    return images.ImageSpec(
        name=CHECK_IMAGE, entries=tuple(entries), entrypoint=("/bin/sh",), env=ENV
    )


def ensure_check_image(out_dir: Path) -> Path:
    """Write (when missing) the check image's archive into ``out_dir``; returns its path."""
    # Named by gpucheck.c's digest: an archive is reused while present, so a changed program
    # must get a new name.
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    path = out_dir / f"cuda-check-{digest}.tar"
    if not path.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            spec = check_spec(build_gpucheck(Path(tmp) / "gpucheck"))
            images.write_archive(path, spec)
    return path
