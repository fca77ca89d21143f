"""Kubernetes and etcd binaries, built from the Go module proxy into a version-keyed cache.

Layout of the cache (root ``~/.cache/dra-gpu``, or ``$DRA_GPU_CACHE``)::

    k8s-v1.37.2/{kube-apiserver,kube-controller-manager,kube-scheduler,kubectl,kubelet}
    k8s-v1.37.2/build-times.json      # how long each build took (read by bench/cluster_up.py)
    etcd-v3.6.16/etcd
    gomod/k8s-v1.36.3/go.mod           # generated wrapper modules for non-default versions

Invariants:
- A binary at its final path is always complete: ``go build`` writes into a fresh hidden directory
  beside it and each file is moved in with ``os.replace`` (atomic on one filesystem), so an
  interrupted build leaves at most a stray hidden directory, never a half-written binary.
- One build per output directory at a time: an exclusive ``flock`` on ``.build.lock``; whoever
  waited re-checks what is still missing before building, so concurrent callers build once.
- Only what is missing is built, and only what the caller asked for: the control plane never waits
  for the (cgo) kubelet unless it asked for it.

The default versions use the committed wrapper modules under ``e2e/gomod/``; any other version gets
a generated module (same replace directives with the matching ``v0.<minor>.<patch>``) tidied once.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_K8S_VERSION = "v1.37.2"
DEFAULT_ETCD_VERSION = "v3.6.16"

CONTROL_PLANE_K8S = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# kube-proxy only for the deployed-driver test (pods reach the API server through the
# `kubernetes` Service), kubeadm only for the kind node image: nothing else waits for them.
K8S_PURE_GO = (*CONTROL_PLANE_K8S, "kube-proxy", "kubeadm")
K8S_CGO = ("kubelet",)
ETCD = "etcd"
CONTROL_PLANE: tuple[str, ...] = (ETCD, *CONTROL_PLANE_K8S)
ALL_COMPONENTS: tuple[str, ...] = (*CONTROL_PLANE, *K8S_CGO)

# Staging modules of 1.34-1.37. Replacing one that a version does not use is harmless: Go only
# consults replace directives for modules that are in the build graph.
STAGING_MODULES = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
    "streaming",
)

GOMOD_DIR = Path(__file__).resolve().parent / "gomod"
PROGRESS_EVERY_S = 30.0

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Versions:
    k8s: str = DEFAULT_K8S_VERSION
    etcd: str = DEFAULT_ETCD_VERSION

    @classmethod
    def from_env(cls) -> Versions:
        return cls(
            k8s=_vprefix(os.environ.get("DRA_GPU_K8S_VERSION", DEFAULT_K8S_VERSION)),
            etcd=_vprefix(os.environ.get("DRA_GPU_ETCD_VERSION", DEFAULT_ETCD_VERSION)),
        )


def _vprefix(version: str) -> str:
    version = version.strip()
    if not re.fullmatch(r"v?\d+\.\d+\.\d+", version):
        raise ValueError(f"version {version!r} is not of the form v<major>.<minor>.<patch>")
    return version if version.startswith("v") else f"v{version}"


def cache_root() -> Path:
    override = os.environ.get("DRA_GPU_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "dra-gpu"


def component_dir(name: str, versions: Versions) -> Path:
    if name == ETCD:
        return cache_root() / f"etcd-{versions.etcd}"
    if name in K8S_PURE_GO or name in K8S_CGO:
        return cache_root() / f"k8s-{versions.k8s}"
    raise ValueError(f"unknown component {name!r}; known: {', '.join(ALL_COMPONENTS)}")


def binary_path(name: str, versions: Versions | None = None) -> Path:
    return component_dir(name, versions or Versions.from_env()) / name


def missing(components: Sequence[str], versions: Versions) -> list[str]:
    return [c for c in components if not os.access(binary_path(c, versions), os.X_OK)]


@dataclass(frozen=True)
class BuildStep:
    """One ``go build`` invocation: a set of binaries sharing a module and cgo setting."""

    components: tuple[str, ...]
    module: str  # "k8s" or "etcd"
    cgo: bool


def plan(components: Sequence[str]) -> list[BuildStep]:
    """Group the requested components into as few ``go build`` runs as their settings allow."""
    wanted = set(components)
    steps = [
        BuildStep(tuple(c for c in K8S_PURE_GO if c in wanted), "k8s", cgo=False),
        BuildStep((ETCD,) if ETCD in wanted else (), "etcd", cgo=False),
        BuildStep(tuple(c for c in K8S_CGO if c in wanted), "k8s", cgo=True),
    ]
    return [s for s in steps if s.components]


def k8s_ldflags(version: str) -> str:
    major, minor, _ = version.lstrip("v").split(".")
    pkg = "k8s.io/component-base/version"
    return (
        f"-s -w -X {pkg}.gitVersion={version} -X {pkg}.gitMajor={major} "
        f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean"
    )


def go_build_argv(step: BuildStep, out_dir: Path, versions: Versions) -> list[str]:
    if step.module == "etcd":
        # The main package is the module root, whose default binary name would be "v3".
        return [
            *("go", "build", "-v", "-trimpath", "-ldflags", "-s -w"),
            *("-o", str(out_dir / ETCD), "go.etcd.io/etcd/server/v3"),
        ]
    pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in step.components]
    return [
        *("go", "build", "-v", "-trimpath", "-ldflags", k8s_ldflags(versions.k8s)),
        *("-o", f"{out_dir}{os.sep}", *pkgs),
    ]


def k8s_gomod_text(version: str) -> str:
    staging = "v0." + version.split(".", 1)[1]
    replaces = "\n".join(f"\tk8s.io/{m} => k8s.io/{m} {staging}" for m in STAGING_MODULES)
    tools = "\n".join(f"\tk8s.io/kubernetes/cmd/{c}" for c in (*K8S_PURE_GO, *K8S_CGO))
    return (
        f"module dra-gpu/e2e/gomod/k8s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes {version}\n\n"
        f"replace (\n{replaces}\n)\n\ntool (\n{tools}\n)\n"
    )


def etcd_gomod_text(version: str) -> str:
    return (
        "module dra-gpu/e2e/gomod/etcd\n\ngo 1.26.0\n\n"
        f"require go.etcd.io/etcd/server/v3 {version}\n\ntool go.etcd.io/etcd/server/v3\n"
    )


_PINNED = {"k8s": "k8s.io/kubernetes", "etcd": "go.etcd.io/etcd/server/v3"}


def module_version(gomod: Path, module: str) -> str:
    """The version ``gomod`` requires of ``module`` (tool modules are listed as requirements)."""
    pattern = re.compile(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", re.MULTILINE)
    match = pattern.search(gomod.read_text())
    if match is None:
        raise ValueError(f"{gomod} does not require {module}")
    return match.group(1)


def pinned_version(module: str) -> str | None:
    """The version the committed wrapper module requires, or None when it is absent."""
    gomod = GOMOD_DIR / module / "go.mod"
    if not gomod.is_file():
        return None
    try:
        return module_version(gomod, _PINNED[module])
    except ValueError:
        return None


def module_dir(module: str, version: str, *, log: Log) -> Path:
    """The wrapper module to build ``module`` at ``version`` from, generating it if needed."""
    if pinned_version(module) == version:
        return GOMOD_DIR / module
    target = cache_root() / "gomod" / f"{module}-{version}"
    if (target / "go.sum").is_file():
        return target
    text = k8s_gomod_text(version) if module == "k8s" else etcd_gomod_text(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{module}-{version}-", dir=target.parent))
    try:
        (tmp / "go.mod").write_text(text)
        log(f"[build] resolving the {module} {version} module graph (go mod tidy)")
        run_go(["go", "mod", "tidy"], cwd=tmp, env=os.environ.copy(), log=log, label="tidy")
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_go(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: Log,
    label: str,
    estimate: float | None = None,
) -> None:
    """Run a go command, printing a progress line every PROGRESS_EVERY_S; raise on failure."""
    start = time.monotonic()
    tail: list[str] = []
    count = 0
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            log(progress_line(label, time.monotonic() - start, estimate, count))

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            count += 1
            tail = [*tail[-39:], line.rstrip()]
        rc = proc.wait()
    finally:
        done.set()
    if rc != 0:
        joined = "\n".join(tail)
        raise RuntimeError(f"{label} failed (exit {rc}) in {cwd}: {' '.join(argv)}\n{joined}")


def progress_line(label: str, elapsed: float, estimate: float | None, packages: int) -> str:
    """``[build] kubelet v1.37.2: 2m30.0s elapsed of about 4m10.0s (last build), 412 packages``;
    without a recorded build there is no estimate to give."""
    of = f" of about {_fmt(estimate)} (last build)" if estimate else ""
    return f"[build] {label}: {_fmt(elapsed)} elapsed{of}, {packages} packages"


def go_build(
    argv: list[str],
    *,
    directory: Path,
    components: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    log: Log,
    label: str,
) -> None:
    """One ``go build`` of ``components`` (cache ``directory``) with progress lines that give the
    last recorded build's duration as the estimate; its own duration is recorded for the next."""
    estimate = recorded_seconds(directory, components)
    last = f"; the last build took {_fmt(estimate)}" if estimate else ""
    log(f"[build] building {label}{last}")
    start = time.monotonic()
    run_go(argv, cwd=cwd, env=env, log=log, label=label, estimate=estimate)
    elapsed = time.monotonic() - start
    record_build(directory, components, elapsed)
    log(f"[build] built {label} in {_fmt(elapsed)} -> {directory}")


def _fmt(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the exclusive build lock of a cache directory (``.build.lock``; created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".build.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def record_build(directory: Path, components: Sequence[str], seconds: float) -> None:
    """Append a build's duration to ``build-times.json`` beside the binaries."""
    path = directory / "build-times.json"
    builds: list[dict[str, object]] = []
    if path.is_file():
        with contextlib.suppress(ValueError):
            builds = list(json.loads(path.read_text()).get("builds", []))
    go = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    builds.append(
        {
            "components": list(components),
            "seconds": round(seconds, 1),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "go": go,
            "cpus": os.cpu_count(),
        }
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"builds": builds}, indent=2) + "\n")
    os.replace(tmp, path)


def recorded_seconds(directory: Path, components: Sequence[str]) -> float | None:
    """Duration of the most recent build recorded in ``directory`` that produced all of
    ``components`` (None when there is none)."""
    path = directory / "build-times.json"
    if not path.is_file():
        return None
    try:
        builds = json.loads(path.read_text()).get("builds", [])
    except ValueError:
        return None
    for build in reversed(builds):
        if set(components) <= set(build.get("components", [])):
            return float(build["seconds"])
    return None


def recorded_build_seconds(component: str, versions: Versions) -> float | None:
    """Duration of the most recent recorded build that produced ``component``."""
    return recorded_seconds(component_dir(component, versions), [component])


def build_missing(
    out: Path,
    names: Sequence[str],
    *,
    src: Callable[[], Path],
    argv: Callable[[Path, Sequence[str]], list[str]],
    env: Mapping[str, str],
    label: str,
    log: Log,
) -> None:
    """Build those of ``names`` not yet executable in ``out``, under its build lock.

    ``src()`` gives the module directory (resolved only once a build is needed);
    ``argv(tmp, todo)`` the ``go build`` command writing ``todo`` into ``tmp``, whose files are
    then moved into ``out`` one by one (see the module docstring). ``label`` (the version) follows
    the names in the progress lines.
    """
    with build_lock(out):
        todo = [n for n in names if not os.access(out / n, os.X_OK)]
        if not todo:
            return
        for stale in out.glob(".build-*"):  # left by a build that was killed; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        module = src()
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
        label = f"{', '.join(todo)} {label}"
        try:
            go_build(
                argv(tmp, todo),
                directory=out,
                components=todo,
                cwd=module,
                env=dict(env),
                log=log,
                label=label,
            )
            for name in todo:
                os.replace(tmp / name, out / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _build_step(step: BuildStep, versions: Versions, *, log: Log) -> None:
    version = versions.etcd if step.module == "etcd" else versions.k8s
    build_missing(
        component_dir(step.components[0], versions),
        step.components,
        src=lambda: module_dir(step.module, version, log=log),
        argv=lambda tmp, todo: go_build_argv(
            BuildStep(tuple(todo), step.module, step.cgo), tmp, versions
        ),
        env={**os.environ, "CGO_ENABLED": "1" if step.cgo else "0"},
        label=version,
        log=log,
    )


def ensure(
    components: Sequence[str] = CONTROL_PLANE,
    *,
    versions: Versions | None = None,
    log: Log = _stderr,
) -> dict[str, Path]:
    """Return ``{component: path}``, building whatever of ``components`` is not cached yet."""
    versions = versions or Versions.from_env()
    for name in components:
        component_dir(name, versions)  # validates the name before any build starts
    todo = missing(components, versions)
    if todo:
        if shutil.which("go") is None:
            raise RuntimeError(f"{', '.join(todo)} not in {cache_root()} and no `go` to build it")
        for step in plan(todo):
            _build_step(step, versions, log=log)
    return {c: binary_path(c, versions) for c in components}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m e2e.binaries [component ...]``: build what is missing, print the paths."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.binaries",
        description="Build the Kubernetes and etcd binaries that are missing from the cache "
        f"({cache_root()}) and print their paths.",
    )
    parser.add_argument(
        "components",
        nargs="*",
        metavar="COMPONENT",
        choices=[*ALL_COMPONENTS, "all"],
        help=f"what to build: {', '.join(ALL_COMPONENTS)}, or all "
        f"(default: the control plane, {', '.join(CONTROL_PLANE)})",
    )
    names = parser.parse_args(argv).components or list(CONTROL_PLANE)
    if names == ["all"]:
        names = list(ALL_COMPONENTS)
    for name, path in ensure(names).items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
