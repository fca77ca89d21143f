"""Container images built locally: no registry can be reached here, and no Docker runs.

Two images, each a single-layer docker-archive tarball (``manifest.json`` + config JSON + an
uncompressed layer tar), the format both ``ctr images import`` and ``kind load image-archive`` read:

- the sandbox image: a tiny static ``pause`` compiled from ``e2e/pause.c`` with the local gcc;
- the test image: Debian's ``busybox-static`` with every applet linked in ``/bin``.

Invariants: archives are byte-for-byte deterministic for the same inputs (fixed mtimes, owners and
order), so an image's ID only changes when its content does; archives are written atomically into
the version-keyed cache and reused when present.

CLI: ``python -m e2e.images [--out DIR]`` writes both archives and prints ``<name> <path>`` lines.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from e2e.binaries import cache_root

PAUSE_IMAGE = "localhost/dra-gpu/pause:1"
TEST_IMAGE = "localhost/dra-gpu/busybox:1.35"
BUSYBOX = Path("/bin/busybox")
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
_EPOCH = 0  # mtime of every entry: archives stay reproducible


@dataclass(frozen=True)
class Entry:
    """One filesystem entry of a layer: a directory, a regular file, or a symlink."""

    path: str  # relative, no leading slash
    kind: str  # "dir" | "file" | "symlink"
    data: bytes = b""
    mode: int = 0o755
    target: str = ""


@dataclass(frozen=True)
class ImageSpec:
    name: str
    entries: tuple[Entry, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/bin:/usr/bin:/sbin:/usr/sbin",)


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """Deterministic uncompressed tar of ``entries`` (sorted by path, root-owned)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(entry.path)
            info.mtime, info.uid, info.gid, info.mode = _EPOCH, 0, 0, entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
    return buf.getvalue()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def image_config(spec: ImageSpec, layer: bytes) -> bytes:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": list(spec.entrypoint),
            "Cmd": list(spec.cmd) or None,
            "Env": list(spec.env),
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{_sha256(layer)}"]},
        "history": [{"created_by": "dra-gpu e2e/images.py"}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def docker_archive(spec: ImageSpec) -> bytes:
    """A docker-archive tarball holding ``spec`` as one image tagged ``spec.name``."""
    layer = layer_tar(spec.entries)
    config = image_config(spec, layer)
    layer_path = f"blobs/sha256/{_sha256(layer)}"
    config_path = f"blobs/sha256/{_sha256(config)}"
    manifest = [{"Config": config_path, "RepoTags": [spec.name], "Layers": [layer_path]}]
    files = {
        config_path: config,
        layer_path: layer,
        "manifest.json": json.dumps(manifest, separators=(",", ":")).encode(),
    }
    entries = [Entry("blobs", "dir"), Entry("blobs/sha256", "dir")]
    entries += [Entry(p, "file", data=d, mode=0o644) for p, d in files.items()]
    return layer_tar(entries)


def _base_entries() -> list[Entry]:
    dirs = ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "usr", "usr/bin", "root")
    return [
        *(Entry(d, "dir", mode=0o1777 if d == "tmp" else 0o755) for d in dirs),
        Entry("etc/passwd", "file", data=b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644),
        Entry("etc/group", "file", data=b"root:x:0:\n", mode=0o644),
    ]


def busybox_spec(busybox: Path = BUSYBOX) -> ImageSpec:
    """The test image: static busybox with all its applets as symlinks in /bin."""
    if not busybox.is_file():
        raise FileNotFoundError(
            f"{busybox} is missing: install Debian's busybox-static"
            " (python -m e2e.node.binaries does)"
        )
    listed = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    applets = sorted({a for a in listed.stdout.split() if a and a != "busybox"})
    entries = _base_entries()
    entries.append(Entry("bin/busybox", "file", data=busybox.read_bytes(), mode=0o755))
    entries += [Entry(f"bin/{a}", "symlink", target="busybox") for a in applets]
    return ImageSpec(name=TEST_IMAGE, entries=tuple(entries), entrypoint=("/bin/sh",))


def pause_spec(pause_binary: Path) -> ImageSpec:
    entries = _base_entries()
    entries.append(Entry("pause", "file", data=pause_binary.read_bytes(), mode=0o755))
    return ImageSpec(name=PAUSE_IMAGE, entries=tuple(entries), entrypoint=("/pause",))


def build_pause(out: Path) -> Path:
    """Compile ``pause.c`` statically into ``out`` (atomic); reuse it when present."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = ["gcc", "-static", "-Os", "-s", "-o", str(tmp), str(PAUSE_SOURCE)]
    subprocess.run(cmd, check=True)
    tmp.replace(out)
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        f.write(data)
    Path(f.name).replace(path)


def write_archive(path: Path, spec: ImageSpec) -> None:
    """Write ``spec`` as a docker-archive at ``path``, atomically."""
    _write_atomic(path, docker_archive(spec))


def cache_dir() -> Path:
    """Where the node harness keeps the archives (bump the suffix when their content changes)."""
    return cache_root() / "images-v1"


def ensure_images(out_dir: Path) -> dict[str, Path]:
    """Write (when missing) the sandbox and test archives into ``out_dir``; image name -> path."""
    specs: dict[str, Callable[[], ImageSpec]] = {
        PAUSE_IMAGE: lambda: pause_spec(build_pause(out_dir / "pause")),
        TEST_IMAGE: busybox_spec,
    }
    paths: dict[str, Path] = {}
    for name, make in specs.items():
        path = out_dir / (name.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
        if not path.is_file():
            _write_atomic(path, docker_archive(make()))
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.images", description=__doc__)
    parser.add_argument("--out", type=Path, default=cache_dir())
    args = parser.parse_args(argv)
    for name, path in ensure_images(args.out).items():
        print(f"{name} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
