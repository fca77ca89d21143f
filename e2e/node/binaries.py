"""Everything a real node needs besides the kubelet: containerd, its runc shim, ctr, runc, CNI
plugins and the busybox used for the test image.

- containerd (+ ctr, shim) and runc are built from the Go modules in ``e2e/gomod/node`` and
  ``e2e/gomod/runc`` (their go.mod pins the version, the single place to change it) into the
  version-keyed cache ``<cache>/containerd-<v>/`` and ``<cache>/runc-<v>/``, only when missing.
  Builds go to ``.tmp/`` and are renamed into place, so an interrupted build never leaves a
  half-written binary that a later run would trust; a file lock serializes concurrent builders.
- CNI plugins, busybox-static and libseccomp (runc's cgo dependency) come from Debian packages,
  installed with apt-get when missing (CI's fresh machine has only Python, Go and gcc).

CLI: ``python -m e2e.node.binaries`` ensures everything and prints where it is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.binaries import build_lock, cache_root, go_build, module_version

GOMOD = Path(__file__).resolve().parents[1] / "gomod"
CNI_BIN_DIR = Path("/usr/lib/cni")
DEBIAN_PACKAGES = (
    "busybox-static",
    "containernetworking-plugins",
    "libseccomp-dev",
    "pkg-config",
    "iptables",
    "iproute2",
)


@dataclass(frozen=True)
class GoBuild:
    """Binaries built together from one wrapper module into one cache directory."""

    module_dir: Path
    module: str  # the upstream module whose version keys the cache
    cache_name: str  # cache sub-directory prefix, "<prefix>-<version>"
    packages: tuple[tuple[str, str, bool, str], ...]  # (binary, package, cgo, tags)
    version_var: str  # -X variable stamped with the version

    @property
    def version(self) -> str:
        return module_version(self.module_dir / "go.mod", self.module)

    @property
    def directory(self) -> Path:
        return cache_root() / f"{self.cache_name}-{self.version}"

    def missing(self) -> list[str]:
        return [b for b, *_ in self.packages if not (self.directory / b).is_file()]


CONTAINERD = GoBuild(
    module_dir=GOMOD / "node",
    module="github.com/containerd/containerd/v2",
    cache_name="containerd",
    packages=(
        ("containerd", "github.com/containerd/containerd/v2/cmd/containerd", False, "no_btrfs"),
        ("ctr", "github.com/containerd/containerd/v2/cmd/ctr", False, "no_btrfs"),
        (
            "containerd-shim-runc-v2",
            "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            False,
            "no_btrfs,no_grpc",
        ),
    ),
    version_var="github.com/containerd/containerd/v2/version.Version",
)
RUNC = GoBuild(
    module_dir=GOMOD / "runc",
    module="github.com/opencontainers/runc",
    cache_name="runc",
    packages=(("runc", "github.com/opencontainers/runc", True, "seccomp urfave_cli_no_docs"),),
    version_var="main.version",
)


def _log(line: str) -> None:
    print(line, flush=True)


def ensure_built(build: GoBuild) -> Path:
    """Build the missing binaries of ``build``; returns the cache directory holding all of them."""
    directory = build.directory
    if not build.missing():
        return directory
    with build_lock(directory):
        tmp = directory / ".tmp"
        tmp.mkdir(exist_ok=True)
        for binary, package, cgo, tags in build.packages:
            if (directory / binary).is_file():
                continue
            ldflags = f"-s -w -X {build.version_var}={build.version}"
            cmd = ["go", "build", "-v", "-trimpath", "-tags", tags, "-ldflags", ldflags]
            cmd += ["-o", str(tmp / binary), package]
            env = {**os.environ, "CGO_ENABLED": "1" if cgo else "0"}
            # The harness's runner: progress lines with the last build's time, the output's
            # tail on failure.
            go_build(
                cmd,
                directory=directory,
                components=[binary],
                cwd=build.module_dir,
                env=env,
                log=_log,
                label=f"{binary} {build.version}",
            )
            (tmp / binary).replace(directory / binary)
    return directory


def _dpkg_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True
    )
    return result.returncode == 0 and result.stdout.strip().endswith(" installed")


def ensure_debian_packages(packages: tuple[str, ...] = DEBIAN_PACKAGES) -> None:
    missing = [p for p in packages if not _dpkg_installed(p)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"missing packages {missing} and no apt-get to install them")
    names = " ".join(missing)
    print(f"[build] apt-get install {names}", flush=True)
    started = time.monotonic()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # One line for the progress; apt's own output (pages of it) only when it fails.
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise RuntimeError(f"{' '.join(argv)} failed (exit {proc.returncode}):\n{tail}")
    print(f"[build] installed {names} in {time.monotonic() - started:.0f} s", flush=True)


@dataclass(frozen=True)
class NodeBinaries:
    containerd_dir: Path  # containerd, ctr, containerd-shim-runc-v2
    runc: Path
    cni_bin_dir: Path

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"


def ensure_node_binaries() -> NodeBinaries:
    # A machine prepared without apt or Go (the GPU machines: e2e.gpu.stage) names its own CNI
    # plugin directory and brings everything else in the cache.
    staged_cni = os.environ.get("DRA_GPU_CNI_BIN_DIR")
    if not staged_cni:
        ensure_debian_packages()
    return NodeBinaries(
        containerd_dir=ensure_built(CONTAINERD),
        runc=ensure_built(RUNC) / "runc",
        cni_bin_dir=Path(staged_cni) if staged_cni else CNI_BIN_DIR,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m e2e.node.binaries",
        description="Build containerd and runc into the cache when missing, install the Debian "
        "packages a real node needs when missing, and print where everything is.",
    ).parse_args(argv)
    binaries = ensure_node_binaries()
    print(f"containerd {binaries.containerd_dir}\nrunc {binaries.runc}\ncni {binaries.cni_bin_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
