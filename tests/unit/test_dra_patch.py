"""e2e/dra_patch.py: the patch to Kubernetes' DRA CEL evaluator, as the harness applies it.

Cases:
- the recovered patch applies to the pristine module at the harness's release with no fuzz and
  no rejected hunk, and touches only the ``cel`` package (a drift of the release would build
  the benchmarks against a half-patched evaluator, or fail mid-build);
- an edited patch gets another cache key, so no cache built from the old one is reused;
- a wrapper module built against the copy replaces the evaluator's module with it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e import binaries, dra_patch

VERSION = "v0." + binaries.DEFAULT_K8S_VERSION.removeprefix("v1.")


def test_the_patch_applies_cleanly_to_the_pristine_module(tmp_path: Path) -> None:
    pristine = dra_patch.pristine_dir(VERSION)
    assert (pristine / "go.mod").is_file(), f"{pristine}: run `go mod download` of the module"
    target = tmp_path / "patched"
    dra_patch.apply(dra_patch.PATCH, pristine, target)
    assert (target / "cel" / "device_values.go").is_file()
    changed = subprocess.run(
        ["diff", "-rq", str(pristine), str(target)], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    # "Files A and B differ" or "Only in DIR: NAME"
    paths = [
        Path(line.split()[1])
        if line.startswith("Files")
        else Path(line.split(": ")[0][8:]) / line.split(": ")[1]
        for line in changed
    ]
    assert sorted(
        str(p.relative_to(pristine if p.is_relative_to(pristine) else target)) for p in paths
    ) == [
        "cel/compile.go",
        "cel/device_values.go",
        "cel/device_values_test.go",
    ]
    assert "func deviceVariables" not in (pristine / "cel" / "compile.go").read_text()


def test_a_patch_that_does_not_apply_fails(tmp_path: Path) -> None:
    pristine = dra_patch.pristine_dir(VERSION)
    text = dra_patch.PATCH.read_text()
    broken = tmp_path / "broken.patch"
    broken.write_text(text.replace(" func (c CompilationResult) DeviceMatches", " func Other", 1))
    with pytest.raises(subprocess.CalledProcessError):
        dra_patch.apply(broken, pristine, tmp_path / "patched")
    assert not (tmp_path / "patched").exists()


def test_an_edited_patch_gets_another_cache_key() -> None:
    text = dra_patch.PATCH.read_bytes()
    key = dra_patch.patch_key(text)
    assert len(key) == 12
    assert dra_patch.patch_key(text) == key
    assert dra_patch.patch_key(text + b"\n") != key


def test_the_wrapper_module_replaces_the_evaluator_with_the_copy() -> None:
    gomod = "module celmatch\n\ngo 1.25\n\nrequire k8s.io/dynamic-resource-allocation v0.37.2\n"
    out = dra_patch.with_replace(gomod, Path("/c/patched/dra"))
    assert out.startswith(gomod)
    assert out.endswith("\nreplace k8s.io/dynamic-resource-allocation => /c/patched/dra\n")
