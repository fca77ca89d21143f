"""The reference CDI library's own validation, as a command for tests.

The CDI project publishes no validate command as a module of its own, so ``e2e/gomod/cdi`` holds
a ten-line Go program that loads each spec file with ``tags.cncf.io/container-device-interface``
(``cdi.ReadSpec``: strict decoding, version, kind, names, edits). :func:`ensure` builds it once
into the cache (``<cache>/cdi-validate-<version>/cdi-validate``, moved in atomically) and
:func:`validate` runs it: a list of problems, empty when every file is valid.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from e2e import binaries

MODULE_DIR = Path(__file__).resolve().parent / "gomod" / "cdi"
CDI_MODULE = "tags.cncf.io/container-device-interface"
BUILD_TIMEOUT_S = 600


class ValidatorUnavailable(RuntimeError):
    """Go or the module proxy is missing; the message says which."""


def binary_path() -> Path:
    version = binaries.module_version(MODULE_DIR / "go.mod", CDI_MODULE)
    return binaries.cache_root() / f"cdi-validate-{version}" / "cdi-validate"


def ensure() -> Path:
    """The validator binary, built on first use; raises ValidatorUnavailable."""
    target = binary_path()
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise ValidatorUnavailable("no go command on PATH")
    with binaries.build_lock(target.parent):
        if target.exists():
            return target
        out = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
        try:
            proc = subprocess.run(
                [go, "build", "-o", str(out / target.name), "."],
                cwd=MODULE_DIR,
                env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"},
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
            if proc.returncode != 0:
                raise ValidatorUnavailable(f"go build failed: {proc.stderr.strip()[-2000:]}")
            os.replace(out / target.name, target)
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return target


def validate(paths: Sequence[Path]) -> list[str]:
    """Problems the reference library finds in the spec files (empty: all valid)."""
    if not paths:
        return []
    proc = subprocess.run(
        [str(ensure()), *map(str, paths)], capture_output=True, text=True, timeout=60
    )
    return [line for line in proc.stderr.splitlines() if line.strip()] if proc.returncode else []
