"""The Dockerfile's Python base image, made locally from Debian packages (no registry reachable).

The Dockerfile's public base (``PYTHON_IMAGE``, a ``python:<v>-slim-<release>`` image) is a Debian
``<release>`` root with Python. Its local equivalent: ``debootstrap --variant=minbase`` of the same
release from the mirror this machine's apt uses, with Debian's ``python3``, ``python3-venv`` (the
Dockerfile makes a virtualenv) and ``python-is-python3`` (it calls ``python``), apt's caches
removed, imported with ``docker import``. The build passes it as ``--build-arg PYTHON_IMAGE=...``:
the Dockerfile users build is unchanged.

Cached by its inputs (release, packages, mirror): the root file system as a tarball under
``<cache>/base-image/<key>.tar`` (reused by a fresh engine) and the image tag
``localhost/dra-gpu/python-base:<key>``; ``debootstrap`` runs (about 40 s) only when neither
exists.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from e2e.binaries import cache_root
from e2e.images.docker_engine import DockerEngine, Log
from e2e.node.binaries import ensure_debian_packages

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
PACKAGES = ("python3", "python3-venv", "python-is-python3")
REPOSITORY = "localhost/dra-gpu/python-base"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def dockerfile_base(dockerfile: Path = DOCKERFILE) -> str:
    """The default of the Dockerfile's ``PYTHON_IMAGE`` argument: the public base users get."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{dockerfile} has no `ARG PYTHON_IMAGE=<image>` line")
    return match.group(1)


def debian_release(image: str) -> str:
    """The Debian release a ``python:<version>-slim-<release>`` image is built on."""
    match = re.fullmatch(r"python:[\d.]+-slim-([a-z]+)", image)
    if match is None:
        raise ValueError(
            f"base image {image!r} does not name its Debian release "
            "(expected python:<version>-slim-<release>)"
        )
    return match.group(1)


def apt_mirror(release: str, sources: str) -> str:
    """The first Debian archive URI ``sources`` (one-line or deb822 format) lists for ``release``.

    Security and update suites live elsewhere (``<release>-security``, ``<release>-updates``);
    debootstrap needs the main archive."""
    for line in sources.splitlines():  # one-line format: deb [options] URI SUITE COMPONENTS
        fields = re.sub(r"\[[^]]*\]", "", line).split()
        if len(fields) >= 3 and fields[0] == "deb" and fields[2] == release:
            return fields[1]
    for stanza in re.split(r"\n\s*\n", sources):  # deb822: URIs: / Suites: fields
        stanza_fields: dict[str, str] = dict(
            re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE)
        )
        if release in stanza_fields.get("Suites", "").split() and "URIs" in stanza_fields:
            return stanza_fields["URIs"].split()[0]
    raise ValueError(f"no apt source lists the Debian release {release!r}")


def host_apt_sources(paths: tuple[Path, ...] = APT_SOURCES) -> str:
    texts = []
    for path in paths:
        files = [path]
        if path.is_dir():
            files = sorted(path.glob("*.list")) + sorted(path.glob("*.sources"))
        texts += [f.read_text() for f in files if f.is_file()]
    return "\n\n".join(texts)


def cache_key(release: str, mirror: str, packages: tuple[str, ...] = PACKAGES) -> str:
    inputs = {"release": release, "mirror": mirror, "packages": sorted(packages), "v": 1}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def debootstrap(
    release: str, mirror: str, out: Path, log: Log, packages: tuple[str, ...] = PACKAGES
) -> None:
    """A minimal root of ``release`` with ``packages``, tarred into ``out`` (atomically)."""
    ensure_debian_packages(("debootstrap",))
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".rootfs-") as tmp:
        root = Path(tmp) / "root"
        log(f"[base-image] debootstrap {release} with {', '.join(packages)}")
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}"]
        proc = subprocess.run(
            [*argv, release, str(root), mirror], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        # What a slim image leaves out too: package caches and lists, logs.
        for junk in ("var/cache/apt", "var/lib/apt/lists", "var/log"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True)
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["tar", "--numeric-owner", "-C", str(root), "-cf", str(tar), "."], check=True
        )
        tar.replace(out)


def debian_source(dockerfile: Path = DOCKERFILE) -> tuple[str, str]:
    """The Debian release of the Dockerfile's base and the archive this machine's apt uses."""
    release = debian_release(dockerfile_base(dockerfile))
    return release, apt_mirror(release, host_apt_sources())


def import_rootfs(
    engine: DockerEngine,
    ref: str,
    rootfs: Path,
    log: Log,
    *,
    packages: tuple[str, ...] = PACKAGES,
    changes: tuple[str, ...] = (),
) -> str:
    """``ref`` in ``engine``: the root tarball ``rootfs`` imported (with ``docker import
    --change`` each of ``changes``), debootstrapped with ``packages`` when missing too."""
    if engine.image_id(ref):
        return ref
    if not rootfs.is_file():
        debootstrap(*debian_source(), rootfs, log, packages)
    log(f"[base-image] docker import {rootfs.name} as {ref}")
    engine.docker("import", *(a for c in changes for a in ("--change", c)), str(rootfs), ref)
    return ref


def ensure_base_image(engine: DockerEngine, log: Log, dockerfile: Path = DOCKERFILE) -> str:
    """The local equivalent of the Dockerfile's base, in ``engine``; returns its reference."""
    key = cache_key(*debian_source(dockerfile))
    changes = (
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        'CMD ["python3"]',
    )
    rootfs = cache_root() / "base-image" / f"{key}.tar"
    return import_rootfs(engine, f"{REPOSITORY}:{key}", rootfs, log, changes=changes)
