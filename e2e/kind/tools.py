"""kind, crictl and the CNI plugins, built from the Go module proxy into version-keyed caches.

One wrapper module, ``e2e/gomod/kind`` (its go.mod pins every version, the single place to change
one), three cache directories, each filled by ``e2e.binaries.build_missing`` (atomic moves, a build
lock, build times recorded)::

    kind-v0.33.0/kind
    cri-tools-v1.37.0/crictl                                   # for the kind base image
    cni-plugins-v1.10.0/{bridge,host-local,loopback,portmap,ptp}   # for the kind base image

CLI: ``python -m e2e.kind.tools`` builds what is missing and prints the directories.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.binaries import build_missing, cache_root, module_version

GOMOD = Path(__file__).resolve().parent.parent / "gomod" / "kind"


@dataclass(frozen=True)
class ToolSet:
    """Binaries of one upstream module, built together into ``<cache>/<prefix>-<version>/``."""

    module: str
    prefix: str
    packages: tuple[tuple[str, str], ...]  # (binary, package)

    @property
    def version(self) -> str:
        return module_version(GOMOD / "go.mod", self.module)

    @property
    def directory(self) -> Path:
        return cache_root() / f"{self.prefix}-{self.version}"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.packages)


_CNI = "github.com/containernetworking/plugins/plugins"
KIND = ToolSet("sigs.k8s.io/kind", "kind", (("kind", "sigs.k8s.io/kind"),))
CRICTL = ToolSet(
    "sigs.k8s.io/cri-tools", "cri-tools", (("crictl", "sigs.k8s.io/cri-tools/cmd/crictl"),)
)
# What the kind base image ships (kindnetd's ptp network needs ptp, host-local, loopback and
# portmap); bridge for networks users write themselves.
CNI_PLUGINS = ToolSet(
    "github.com/containernetworking/plugins",
    "cni-plugins",
    (
        ("bridge", f"{_CNI}/main/bridge"),
        ("host-local", f"{_CNI}/ipam/host-local"),
        ("loopback", f"{_CNI}/main/loopback"),
        ("portmap", f"{_CNI}/meta/portmap"),
        ("ptp", f"{_CNI}/main/ptp"),
    ),
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure(tools: ToolSet) -> Path:
    """The cache directory of ``tools`` with every binary in it, building what is missing."""
    packages = dict(tools.packages)

    def argv(tmp: Path, todo: Sequence[str]) -> list[str]:
        wanted = [packages[name] for name in todo]
        return [
            "go",
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            "-s -w",
            "-o",
            f"{tmp}{os.sep}",
            *wanted,
        ]

    build_missing(
        tools.directory,
        tools.names,
        src=lambda: GOMOD,
        argv=argv,
        env={**os.environ, "CGO_ENABLED": "0"},
        label=tools.version,
        log=_log,
    )
    return tools.directory


def go_env(name: str) -> str:
    """``go env NAME`` (e.g. GOMODCACHE, where the kind module's files are)."""
    return subprocess.run(
        ["go", "env", name], check=True, capture_output=True, text=True
    ).stdout.strip()


def kind_binary() -> Path:
    return ensure(KIND) / "kind"


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m e2e.kind.tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    for tools in (KIND, CRICTL, CNI_PLUGINS):
        print(f"{tools.prefix}\t{ensure(tools)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
