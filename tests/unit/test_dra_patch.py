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
    assert "c.deviceVariables(input)" not in (pristine / "cel" / "compile.go").read_text()
    assert "c.deviceVariables(input)" in (target / "cel" / "compile.go").read_text()


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


def test_the_patched_scheduler_module_swaps_only_the_evaluator() -> None:
    stock = (binaries.GOMOD_DIR / "k8s" / "go.mod").read_text()
    out = dra_patch.substitute_replace(stock, Path("/c/patched/dra"))
    changed = [(a, b) for a, b in zip(stock.splitlines(), out.splitlines(), strict=True) if a != b]
    assert changed == [
        (
            f"\tk8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation {VERSION}",
            "\tk8s.io/dynamic-resource-allocation => /c/patched/dra",
        )
    ]


def test_a_wrapper_module_without_the_evaluators_replace_is_refused() -> None:
    with pytest.raises(ValueError, match="expected one replace"):
        dra_patch.substitute_replace("module x\n\nrequire k8s.io/api v0.37.2\n", Path("/c"))


def test_cel_match_patched_builds_against_the_patched_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import cel_match as cm

    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path))
    gomod, key = cm.patched_gomod(VERSION)
    assert key == dra_patch.patch_key(dra_patch.PATCH.read_bytes())
    assert gomod.name == f"celmatch-{VERSION}-{cm.source_key()}-patched-{key}"
    module = tmp_path / "patched" / f"dynamic-resource-allocation-{VERSION}-{key}"
    assert (
        (gomod / "go.mod")
        .read_text()
        .endswith(f"replace k8s.io/dynamic-resource-allocation => {module}\n")
    )
    assert "c.deviceVariables(input)" in (module / "cel" / "compile.go").read_text()


def test_scale_refuses_a_scheduler_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import scale

    with pytest.raises(SystemExit):
        scale.main(["--scheduler", "upstream"])
    assert "invalid choice: 'upstream'" in capsys.readouterr().err
