"""Pack what a GPU machine without Go, apt or network needs to run the GPU node demo.

``python -m e2e.gpu.stage [--out .gpu-stage] [--part-mib 56] [--bench]`` (on a machine that has
built the harness's binaries, e.g. after ``make test`` or ``make demo``):

- the cache entries a real node and the control plane use (Kubernetes binaries, etcd,
  containerd + ctr + shim, runc), in the cache's own layout, so the harness on the GPU machine
  finds them and builds nothing;
- the local images (sandbox, busybox) and the CUDA check image (``e2e.gpu.image``);
- the CNI plugins (``bridge``, ``host-local``, ``loopback``) and libseccomp (runc's) from this
  machine;
- wheels of the runtime dependencies (``requirements.lock``) for the GPU machine's Python
  (``--python-version``, default 3.12), downloaded with pip here.

One xz-compressed tar, cut into parts of at most ``--part-mib`` MiB (the GPU machine here accepts
64 MiB a call, repository included), with a ``manifest`` of the parts' SHA-256 so the far side
knows when it holds all of them and that none was cut short, and of ``requirements.lock``, so that
parts staged for other dependencies are refused. ``e2e/gpu/remote.sh`` is the far
side. Binaries are stripped already (``-s -w``); xz roughly quarters them.

``--bench``: only what ``bench/reference.py`` needs there (the control plane, the Go example
driver built by ``bench/reference.py`` here, the wheels), for ``remote.sh bench``: the
side-by-side comparison on a GPU node's cores.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e import binaries
from e2e.gpu import image
from e2e.images import node_images as images
from e2e.node import binaries as node_binaries

REPO = Path(__file__).resolve().parents[2]
CNI_PLUGINS = ("bridge", "host-local", "loopback")
# Where bench/reference.py builds the Go example driver in the cache (its module's version).
REFERENCE_DIR = "dra-example-driver"
REFERENCE_BINARY = "dra-example-kubeletplugin"
SECCOMP = Path("/usr/lib/x86_64-linux-gnu/libseccomp.so.2")


@dataclass(frozen=True)
class Item:
    source: Path
    name: str  # path inside the stage archive


def cache_items() -> list[Item]:
    """The cached binaries and images, at their path relative to the cache root."""
    built = binaries.ensure(binaries.ALL_COMPONENTS)
    nodes = node_binaries.ensure_node_binaries()
    archives = images.ensure_images(images.cache_dir())
    check = image.ensure_check_image(images.cache_dir())
    root = binaries.cache_root()
    paths: list[Path] = [*built.values(), *archives.values(), check, nodes.runc]
    paths += [nodes.containerd_dir / b for b, *_ in node_binaries.CONTAINERD.packages]
    items = [Item(p, f"cache/{p.relative_to(root).as_posix()}") for p in paths]
    items += [Item(nodes.cni_bin_dir / n, f"cni/{n}") for n in CNI_PLUGINS]
    # runc links libseccomp; remote.sh puts this copy on the path where the host lacks one.
    items.append(Item(SECCOMP, "lib/libseccomp.so.2"))
    return items


def bench_items() -> list[Item]:
    """The control plane and the Go example driver (built here by ``bench/reference.py``)."""
    built = binaries.ensure(binaries.CONTROL_PLANE)
    root = binaries.cache_root()
    references = sorted(root.glob(f"{REFERENCE_DIR}-*/{REFERENCE_BINARY}"))
    if not references:
        raise SystemExit(
            f"no {REFERENCE_BINARY} in {root}: run `python bench/reference.py` here once first"
        )
    paths = [*built.values(), references[-1]]
    return [Item(p, f"cache/{p.relative_to(root).as_posix()}") for p in paths]


def download_wheels(dest: Path, *, python_version: str) -> list[Item]:
    """Binary wheels of the locked runtime dependencies for the target Python."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        *(sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"),
        *("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"),
        *("--python-version", python_version, "-d", str(dest)),
        *("-r", str(REPO / "requirements.lock")),
    ]
    subprocess.run(cmd, check=True)
    return [Item(p, f"wheels/{p.name}") for p in sorted(dest.glob("*.whl"))]


def write_parts(items: Iterable[Item], out: Path, *, part_bytes: int) -> list[Path]:
    """Write the items as one .tar.xz cut into parts; returns the parts, in order. ``xz -T0``
    compresses on every core (Python's lzma uses one, and the binaries are ~600 MB)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    packed = out / ".stage.tar.xz"
    try:
        with open(packed, "wb") as sink:
            xz = subprocess.Popen(["xz", "-T0", "-6", "-c"], stdin=subprocess.PIPE, stdout=sink)
            assert xz.stdin is not None
            with xz.stdin, tarfile.open(fileobj=xz.stdin, mode="w|") as tar:
                for item in items:
                    tar.add(item.source.resolve(), arcname=item.name)
            if xz.wait() != 0:
                raise RuntimeError(f"xz failed with exit code {xz.returncode}")
        parts: list[Path] = []
        with open(packed, "rb") as src:
            while chunk := src.read(part_bytes):
                part = out / f"part-{len(parts):02d}"
                part.write_bytes(chunk)
                parts.append(part)
    finally:
        packed.unlink(missing_ok=True)
    # The lock too: remote.sh checks it against the repository it runs in, so parts staged for
    # other dependencies (an old .gpu-stage/) are refused instead of failing at an import.
    hashed = [*parts, REPO / "requirements.lock"]
    manifest = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in hashed)
    (out / "manifest").write_text(manifest)
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.gpu.stage", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / ".gpu-stage")
    parser.add_argument("--part-mib", type=int, default=56)
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument(
        "--bench", action="store_true", help="only what bench/reference.py needs (remote.sh bench)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wanted = bench_items() if args.bench else cache_items()
        items = wanted + download_wheels(Path(tmp), python_version=args.python_version)
        parts = write_parts(items, args.out, part_bytes=args.part_mib << 20)
    total = sum(p.stat().st_size for p in parts)
    print(f"{len(items)} files in {len(parts)} part(s), {total / 2**20:.1f} MiB in {args.out}")
    for part in parts:
        print(f"  {part.name} {part.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
