"""kwok, built from its Go module into the version-keyed cache, and run against a Cluster.

kwok (``sigs.k8s.io/kwok``) keeps Node objects it manages Ready (status and leases) and plays the
kubelet for pods bound to them, without any container: the scale benchmark's thousand nodes.

- ``ensure_kwok()`` builds ``sigs.k8s.io/kwok/cmd/kwok`` from the wrapper module
  ``e2e/gomod/kwok`` (its go.mod pins the version: the one place to change it) into
  ``<cache>/kwok-<version>/kwok`` with ``e2e.binaries.build_missing`` (atomic move, build lock,
  build time recorded), only when it is missing.
- ``write_config()``: the stages kwok plays, as ``kwokctl`` configures them by default (node
  initialised Ready, heartbeat with a Lease, pod Running / completed / deleted), taken from the
  kwok module's own stage files in the Go module cache: the kwok binary alone has no default
  stages, and copying them here would fork them.
- ``kwok_argv()``: the command line that manages every node annotated ``kwok.x-k8s.io/node=fake``
  (``FAKE_NODE_ANNOTATION``) with that configuration.

CLI: ``python -m e2e.kwok`` prints the kwok path (building it first when needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from e2e.binaries import build_missing, cache_root, module_version

GOMOD = Path(__file__).resolve().parent / "gomod" / "kwok"
MODULE = "sigs.k8s.io/kwok"
PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
BINARY = "kwok"
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# What kwokctl's runtime (pkg/kwokctl/runtime/cluster.go) loads when it enables node leases.
DEFAULT_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_version() -> str:
    return module_version(GOMOD / "go.mod", MODULE)


def kwok_dir() -> Path:
    return cache_root() / f"kwok-{kwok_version()}"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_kwok() -> Path:
    """The kwok binary; builds it into the cache when missing (minutes cold, once)."""
    version = kwok_version()
    build_missing(
        kwok_dir(),
        [BINARY],
        src=lambda: GOMOD,
        argv=lambda tmp, _: [
            *("go", "build", "-v", "-trimpath", "-ldflags", "-s -w"),
            *("-o", str(tmp / BINARY), PACKAGE),
        ],
        env={**os.environ, "CGO_ENABLED": "0"},
        label=version,
        log=_log,
    )
    return kwok_dir() / BINARY


def module_source() -> Path:
    """The kwok module's files (the build downloaded them into the Go module cache)."""
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Path(cache) / f"{MODULE}@{kwok_version()}"


def write_config(path: Path) -> Path:
    """kwok's configuration: its default stages, one YAML document each."""
    source = module_source()
    docs = [(source / stage).read_text().strip() for stage in DEFAULT_STAGES]
    path.write_text("\n---\n".join(docs) + "\n")
    return path


def kwok_argv(
    binary: Path, kubeconfig: Path, config: Path, *, extra: Sequence[str] = ()
) -> list[str]:
    """kwok managing the annotated nodes of the cluster behind ``kubeconfig``.

    ``--manage-all-nodes=false`` with the annotation selector leaves any real node of the same
    cluster to its kubelet; ``config`` (``write_config``) holds the stages, and
    ``--node-lease-duration-seconds`` keeps one Lease per node renewed as a kubelet would.
    """
    key, value = FAKE_NODE_ANNOTATION
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        "--node-lease-duration-seconds=40",
        "--cidr=10.0.0.1/16",
        "--node-ip=10.0.0.1",
        *extra,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m e2e.kwok",
        description="Build kwok into the binaries cache when missing, and print its path.",
    )
    parser.parse_args(argv)
    print(ensure_kwok())
    return 0


if __name__ == "__main__":
    sys.exit(main())
