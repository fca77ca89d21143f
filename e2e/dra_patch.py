"""The harness's patch to Kubernetes' DRA CEL evaluator (``docs/upstream/``), applied and cached.

The patch (``docs/upstream/dra-cel-lazy-attributes.patch``, paths relative to the module's root)
is applied onto a copy of the pristine ``k8s.io/dynamic-resource-allocation`` module from Go's
module cache. The copy lives in ``<cache>/patched/dynamic-resource-allocation-<version>-<key>``,
``key`` being the first 12 hex digits of the patch file's SHA-256, so that an edited patch gets
a new copy, and wrapper modules built against it (``replace``) carry the same key in their names.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from e2e import binaries

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "docs" / "upstream" / "dra-cel-lazy-attributes.patch"
MODULE = "k8s.io/dynamic-resource-allocation"
SCHEDULER = "kube-scheduler"


def patch_key(patch: bytes) -> str:
    """The cache key of a patch: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(patch).hexdigest()[:12]


def replace_directive(module_dir: Path) -> str:
    """The go.mod line that builds a wrapper module against the patched copy."""
    return f"replace {MODULE} => {module_dir}\n"


def with_replace(gomod_text: str, module_dir: Path) -> str:
    """``gomod_text`` with the patched module replacing the pristine one."""
    return gomod_text.rstrip("\n") + "\n\n" + replace_directive(module_dir)


def pristine_dir(version: str) -> Path:
    """The module at ``version`` in Go's module cache (read-only there)."""
    gomodcache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(gomodcache) / f"{MODULE}@{version}"


def apply(patch: Path, pristine: Path, target: Path) -> None:
    """Copy ``pristine`` to ``target`` and apply ``patch`` there; a patch that does not apply
    cleanly (``patch`` needing fuzz or rejecting a hunk) raises ``CalledProcessError``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        work = tmp / "module"
        shutil.copytree(pristine, work)
        for path in work.rglob("*"):  # Go's module cache is read-only
            path.chmod(path.stat().st_mode | 0o200)
        work.chmod(work.stat().st_mode | 0o200)
        subprocess.run(
            ["patch", "-p1", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(patch)],
            cwd=work,
            check=True,
            capture_output=True,
            text=True,
        )
        shutil.rmtree(target, ignore_errors=True)
        os.replace(work, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def patched_module(version: str, patch: Path = PATCH) -> tuple[Path, str]:
    """The patched copy of the module at ``version`` (made if missing) and the patch's key."""
    key = patch_key(patch.read_bytes())
    target = binaries.cache_root() / "patched" / f"dynamic-resource-allocation-{version}-{key}"
    if not (target / "go.mod").is_file():
        apply(patch, pristine_dir(version), target)
    return target, key


def substitute_replace(gomod_text: str, module_dir: Path) -> str:
    """``gomod_text`` (a wrapper module replacing every staging module with its release) with
    the evaluator's module replaced by the patched copy instead."""
    pattern = re.compile(rf"^(\s*(?:replace\s+)?{re.escape(MODULE)}\s+=>\s+).*$", re.MULTILINE)
    text, count = pattern.subn(lambda m: f"{m.group(1)}{module_dir}", gomod_text)
    if count != 1:
        raise ValueError(f"expected one replace of {MODULE}, found {count}")
    return text


def patched_scheduler(versions: binaries.Versions, *, log: binaries.Log) -> Path:
    """kube-scheduler at ``versions.k8s`` built against the patched module, cached per patch
    key in ``<cache>/k8s-<version>-patched-<key>/`` (the wrapper module in
    ``<cache>/gomod/k8s-<version>-patched-<key>/``)."""
    staging = "v0." + versions.k8s.split(".", 1)[1]
    module, key = patched_module(staging)
    gomod = binaries.cache_root() / "gomod" / f"k8s-{versions.k8s}-patched-{key}"

    def source() -> Path:
        if not (gomod / "go.sum").is_file():
            stock = binaries.module_dir("k8s", versions.k8s, log=log)
            gomod.mkdir(parents=True, exist_ok=True)
            (gomod / "go.mod").write_text(
                substitute_replace((stock / "go.mod").read_text(), module)
            )
            shutil.copyfile(stock / "go.sum", gomod / "go.sum")
        return gomod

    out = binaries.cache_root() / f"k8s-{versions.k8s}-patched-{key}"
    binaries.build_missing(
        out,
        [SCHEDULER],
        src=source,
        argv=lambda tmp, todo: binaries.go_build_argv(
            binaries.BuildStep(tuple(todo), "k8s", cgo=False), tmp, versions
        ),
        env={**os.environ, "CGO_ENABLED": "0"},
        label=f"{versions.k8s} patched {key}",
        log=log,
    )
    return out / SCHEDULER
