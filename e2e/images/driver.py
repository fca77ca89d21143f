"""The driver's image, built with ``docker build`` from the repository's own Dockerfile.

Where no registry is reachable and the package index sits behind a TLS proxy whose CA only the
host trusts, the build still uses the Dockerfile users build, with two build arguments:

- ``PYTHON_IMAGE``: the local equivalent of the public base (``e2e.images.base``);
- ``BUILD_IMAGE`` (the build stage's base): that base plus the wheels of ``requirements.lock``
  (and of the build backend pyproject.toml names), downloaded on the host by the host's pip,
  which trusts the proxy, and ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` pointing at them. pip in the
  build installs offline; the build runs with ``--network none``. The runtime stage starts again
  from ``PYTHON_IMAGE``: no wheel, CA or pip setting reaches the image.

Wheels are cached under ``<cache>/wheels/<key>/`` (key: the lock, the build requirements and the
base's Python), downloaded once. ``build(..., context=)`` builds another source tree (an earlier
release's, for the upgrade from it): its own Dockerfile, lock and build requirements, so its
wheels get their own key.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.binaries import cache_root
from e2e.images.base import REPO_ROOT, ensure_base_image
from e2e.images.docker_engine import DockerEngine, Log

LOCK = REPO_ROOT / "requirements.lock"
PYPROJECT = REPO_ROOT / "pyproject.toml"
BUILD_REPOSITORY = "localhost/dra-gpu/python-build"
# glibc of the base's release (bookworm: 2.36): manylinux wheels up to it install there.
GLIBC_MINOR = 36


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    image_id: str
    size_bytes: int
    archive: Path  # docker-archive tarball, what `ctr images import` reads


def build_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """What pip's isolated build of the package needs (``[build-system] requires``)."""
    return list(tomllib.loads(pyproject.read_text())["build-system"]["requires"])


def platform_tags(glibc_minor: int = GLIBC_MINOR) -> list[str]:
    legacy = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    return [*legacy, *(f"manylinux_2_{m}_x86_64" for m in range(5, glibc_minor + 1))]


def pip_download_argv(
    python_tag: str, dest: Path, requirements: list[str], *, deps: bool
) -> list[str]:
    """``pip download`` of binary wheels for CPython ``python_tag`` (e.g. ``311``) on Linux.
    The lock is complete (no deps); the build backend's own dependencies are not pinned."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", *([] if deps else ["--no-deps"])]
    argv += ["--only-binary=:all:", "--implementation", "cp", "--python-version", python_tag]
    argv += ["--abi", f"cp{python_tag}", "--abi", "abi3", "--abi", "none"]
    for tag in platform_tags():
        argv += ["--platform", tag]
    return [*argv, "--platform", "any", "--dest", str(dest), *requirements]


def _python_tag(engine: DockerEngine, base: str) -> str:
    code = "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"
    out = engine.docker("run", "--rm", "--network", "none", base, "python3", "-c", code).stdout
    return out.strip()


def lock_requirements(lock: Path = LOCK) -> list[str]:
    return [
        line.strip()
        for line in lock.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def wheels_key(requirements: list[str], build: list[str], python_tag: str) -> str:
    """The wheels cache's key: a tree with another lock (an earlier release's) gets its own."""
    inputs = [requirements, build, python_tag, "deps-of-build"]
    return hashlib.sha256(json.dumps(inputs).encode()).hexdigest()[:16]


def ensure_wheels(
    python_tag: str, log: Log, *, lock: Path = LOCK, pyproject: Path = PYPROJECT
) -> Path:
    requirements = lock_requirements(lock)
    build = build_requirements(pyproject)
    dest = cache_root() / "wheels" / wheels_key(requirements, build, python_tag)
    if (dest / ".complete").is_file():
        return dest
    log(f"[image] downloading {len(requirements) + len(build)} wheels for CPython {python_tag}")
    dest.mkdir(parents=True, exist_ok=True)
    for group, deps in ((requirements, False), (build, True)):
        proc = subprocess.run(
            pip_download_argv(python_tag, dest, group, deps=deps), capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pip download failed:\n{proc.stderr[-3000:]}")
    (dest / ".complete").touch()
    return dest


def ensure_build_base(engine: DockerEngine, base: str, wheels: Path) -> str:
    """``base`` plus the wheels and pip's offline settings: the build stage's base."""
    ref = f"{BUILD_REPOSITORY}:{wheels.name}-{base.rsplit(':', 1)[-1]}"
    if engine.image_id(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="dra-gpu-build-base-") as tmp:
        context = Path(tmp)
        (context / "wheels").mkdir()
        for wheel in wheels.glob("*.whl"):
            (context / "wheels" / wheel.name).hardlink_to(wheel)
        (context / "Dockerfile").write_text(
            f"FROM {base}\nCOPY wheels /wheels\nENV PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels\n"
        )
        engine.docker("build", "--network", "none", "--tag", ref, str(context))
    return ref


def build(
    engine: DockerEngine,
    ref: str,
    *,
    labels: dict[str, str],
    log: Log,
    context: Path = REPO_ROOT,
    archive_dir: Path | None = None,
) -> BuiltImage:
    """``docker build`` of ``context``'s Dockerfile (the repository's by default) as ``ref``;
    saved for ``ctr`` import into ``archive_dir`` (default: the cache). A caller that imports
    the archive later passes a directory of its own: another run on the machine building the
    same ref would otherwise replace the file in between."""
    base = ensure_base_image(engine, log, context / "Dockerfile")
    wheels = ensure_wheels(
        _python_tag(engine, base),
        log,
        lock=context / "requirements.lock",
        pyproject=context / "pyproject.toml",
    )
    build_base = ensure_build_base(engine, base, wheels)
    argv = ["build", "--network", "none", "--tag", ref]
    argv += ["--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"BUILD_IMAGE={build_base}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    log(f"[image] docker build -t {ref} (base {base})")
    engine.docker(*argv, str(context))
    image_id = engine.image_id(ref) or ""
    size = int(engine.docker("image", "inspect", "--format", "{{.Size}}", ref).stdout.strip())
    name = re.sub(r"[^A-Za-z0-9._-]", "_", ref)
    directory = archive_dir if archive_dir is not None else cache_root() / "driver-images"
    archive = engine.save([ref], directory / f"{name}.tar")
    return BuiltImage(ref=ref, image_id=image_id, size_bytes=size, archive=archive)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m e2e.images.driver [REF]``: build the image and print its size."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.images.driver",
        description="Build the driver's image with docker build from the Dockerfile (the "
        "project's own engine is started when there is none) and print its size.",
    )
    parser.add_argument("ref", nargs="?", default="dra-gpu:dev", help="the image reference")
    ref = parser.parse_args(argv).ref
    with DockerEngine() as engine:
        image = build(engine, ref, labels={}, log=lambda line: print(line, file=sys.stderr))
    print(f"{image.ref} {image.image_id} {image.size_bytes / 2**20:.1f} MiB {image.archive}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
