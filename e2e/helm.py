"""Helm, built from its Go module, and rendering the project's chart with it.

- ``ensure_helm()`` builds ``helm.sh/helm/v3/cmd/helm`` from the wrapper module ``e2e/gomod/helm``
  (its go.mod pins the version: the one place to change it) into the version-keyed cache
  ``<cache>/helm-<version>/helm`` (cache root ``~/.cache/dra-gpu``, or ``$DRA_GPU_CACHE``), only
  when it is missing. The build writes into ``.tmp/`` and is renamed into place, so an interrupted
  build never leaves a binary that a later run would trust; a file lock serializes builders.
- ``render()`` runs ``helm template`` with a pinned ``--kube-version``, so the output depends only
  on the chart and the values (the committed plain manifests are compared with it byte for byte).

- ``webhook_configuration()``: the chart's ValidatingWebhookConfiguration pointed at a webhook run
  as a local process (the demo, tests, benchmarks), so they exercise the chart's own rules and
  match conditions.

CLI: ``python -m e2e.helm`` prints the helm path (building it first when needed);
``python -m e2e.helm render`` rewrites ``manifests/rendered/`` from the chart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.binaries import build_lock, cache_root, go_build, module_version

GOMOD = Path(__file__).resolve().parent / "gomod" / "helm"
MODULE = "helm.sh/helm/v3"
PACKAGE = "helm.sh/helm/v3/cmd/helm"
CHART = Path(__file__).resolve().parent.parent / "manifests" / "helm" / "dra-gpu"
RENDERED_DIR = CHART.parent.parent / "rendered"
# The plain manifests committed for users without Helm: file name -> values. Each includes the
# Namespace object, so `kubectl apply -f <file>` is the whole install.
RENDERED: Mapping[str, Mapping[str, str | bool | int]] = {
    "dra-gpu.yaml": {"namespace.create": True},
    "dra-gpu-simulated.yaml": {"namespace.create": True, "simulate.enabled": True},
}
# The Kubernetes version the chart is rendered for: `.Capabilities` must not depend on which helm
# built the output, or the committed manifests would drift with the helm version.
KUBE_VERSION = "1.37.2"


def helm_version(gomod: Path = GOMOD / "go.mod") -> str:
    """The helm version the wrapper module requires."""
    return module_version(gomod, MODULE)


def helm_path() -> Path:
    return cache_root() / f"helm-{helm_version()}" / "helm"


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _go_build(version: str, out: Path) -> None:
    """``go build -v`` through the harness's runner: progress lines while the ~600 packages of a
    cold build compile, the output's tail on failure."""
    ldflags = (
        f"-s -w -X helm.sh/helm/v3/internal/version.version={version} "
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    )
    cmd = ["go", "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(out), PACKAGE]
    env = {**os.environ, "CGO_ENABLED": "0"}
    directory, label = helm_path().parent, f"helm {version}"
    go_build(
        cmd, directory=directory, components=["helm"], cwd=GOMOD, env=env, log=_log, label=label
    )


def ensure_helm() -> Path:
    """The helm binary; builds it into the cache when missing (minutes cold, once)."""
    target = helm_path()
    if target.is_file():
        return target
    version = helm_version()
    with build_lock(target.parent):
        if target.is_file():  # another process built it while we waited
            return target
        tmp = target.parent / ".tmp" / "helm"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        _go_build(version, tmp)
        os.replace(tmp, target)
    return target


def set_args(values: Mapping[str, str | bool | int]) -> list[str]:
    """``--set``/``--set-string`` arguments: strings stay strings, bools and ints are typed."""
    args: list[str] = []
    for key, value in values.items():
        if isinstance(value, str):
            args += ["--set-string", f"{key}={value}"]
        else:  # bool before int: True must become `true`, not `1`
            text = str(value).lower() if isinstance(value, bool) else str(value)
            args += ["--set", f"{key}={text}"]
    return args


def render(
    *,
    release: str = "dra-gpu",
    namespace: str = "dra-gpu",
    set_values: Mapping[str, str | bool | int] | None = None,
    values_files: Sequence[Path] = (),
    chart: Path = CHART,
    helm: Path | None = None,
    kube_version: str = KUBE_VERSION,
) -> str:
    """``helm template`` of ``chart`` for ``kube_version``: the multi-document YAML it prints."""
    cmd = [
        str(helm or ensure_helm()),
        "template",
        release,
        str(chart),
        "--namespace",
        namespace,
        "--kube-version",
        kube_version,
    ]
    for path in values_files:
        cmd += ["--values", str(path)]
    cmd += set_args(set_values or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm template failed: {proc.stderr.strip()}")
    return proc.stdout


def webhook_configuration(
    name: str,
    client_config: Mapping[str, Any],
    *,
    namespaces: Sequence[str] | None = None,
    class_selector: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The chart's ValidatingWebhookConfiguration (its webhooks and rules as rendered) sent to
    ``client_config`` instead of the chart's Service: a webhook run as a local process.
    ``namespaces`` and ``class_selector`` (DeviceClasses) limit it further, for a shared
    cluster; left out, it applies where the chart's does."""
    rendered = render(set_values={"webhook.enabled": True, "webhook.tls.caBundle": "Cg=="})
    (config,) = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "ValidatingWebhookConfiguration"
    ]
    config["metadata"] = {"name": name}
    for webhook in config["webhooks"]:
        webhook["clientConfig"] = dict(client_config)
        namespaced = all(rule.get("scope") == "Namespaced" for rule in webhook["rules"])
        if namespaced and namespaces is not None:
            only = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [*namespaces]}
            selector = webhook.setdefault("namespaceSelector", {})
            selector.setdefault("matchExpressions", []).append(only)
        elif not namespaced and class_selector is not None:
            webhook["objectSelector"] = dict(class_selector)
    result: dict[str, Any] = config
    return result


def render_committed() -> dict[Path, str]:
    """What each file of ``manifests/rendered/`` must contain (path -> text)."""
    header = "# Rendered from manifests/helm/dra-gpu by `python -m e2e.helm render`; do not edit.\n"
    return {
        RENDERED_DIR / name: header + render(set_values=values) for name, values in RENDERED.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.helm",
        description="Print the path of helm, building it into the cache first when missing.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        choices=["render"],
        help="render: rewrite manifests/rendered/ from the chart instead",
    )
    if parser.parse_args(argv).command == "render":
        for path, text in render_committed().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    print(ensure_helm())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
