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
import shutil
import subprocess
import tempfile
from pathlib import Path

from e2e import binaries

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "docs" / "upstream" / "dra-cel-lazy-attributes.patch"
MODULE = "k8s.io/dynamic-resource-allocation"


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
