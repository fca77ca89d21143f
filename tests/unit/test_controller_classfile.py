"""The administrators' classes file.

Cases: shorthands become CEL after the driver/type selector; config entries are wrapped as this
driver's opaque configs; one bad class is skipped with a message naming it and the field while
the rest are kept; a file that is not a mapping is an error as a whole; the file's
extendedResourceName overrides the flag; unpublished names in selectors produce warnings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gpu.controller import classes, classfile, reconciling

GOOD = """
classes:
  - name: h200.nvidia.com
    productName: NVIDIA H200
  - name: big.nvidia.com
    minMemory: 80Gi
    config:
      - {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,
         sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}}
  - name: small-mig.nvidia.com
    deviceType: mig
    selectors: ["device.attributes['gpu.nvidia.com'].profile == '1g.18gb'"]
"""


def expressions(d: classes.DesiredClass) -> list[str]:
    return [s["cel"]["expression"] for s in d.spec["selectors"]]


def test_good_file() -> None:
    parsed = classfile.parse_classes_file(GOOD)
    assert parsed.problems == () and parsed.warnings == ()
    h200, big, mig = parsed.classes
    assert expressions(h200) == [
        classes.type_selector("gpu"),
        "device.attributes['gpu.nvidia.com'].productName == \"NVIDIA H200\"",
    ]
    assert expressions(big)[1] == (
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity(\"80Gi\")) >= 0"
    )
    assert big.spec["config"][0]["opaque"]["driver"] == "gpu.nvidia.com"
    assert big.spec["config"][0]["opaque"]["parameters"]["kind"] == "GpuConfig"
    assert expressions(mig)[0] == classes.type_selector("mig")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        pytest.param("{name: x.example.com, colour: red}", "colour: unknown field", id="unknown"),
        pytest.param("{name: Bad_Name}", "name: must be a lowercase DNS subdomain", id="dns"),
        pytest.param("{name: gpu.nvidia.com}", "built-in class", id="builtin"),
        pytest.param("{name: a.b, minMemory: lots}", "minMemory: 'lots' is not a valid", id="qty"),
        pytest.param("{name: a.b, deviceType: tpu}", "deviceType:", id="type"),
        pytest.param(
            "{name: a.b, config: [{apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig,"
            " sharing: {strategy: Sometimes}}]}",
            "config[0].sharing.strategy:",
            id="bad-config",
        ),
        pytest.param(
            "{name: a.b, config: [{apiVersion: resource.nvidia.com/v1beta1,"
            " kind: MigDeviceConfig}]}",
            "config[0].kind: a gpu class takes GpuConfig",
            id="kind-mismatch",
        ),
    ],
)
def test_bad_class_is_skipped_others_kept(entry: str, expected: str) -> None:
    text = f"classes:\n  - {entry}\n  - {{name: fine.example.com}}\n"
    parsed = classfile.parse_classes_file(text)
    assert [d.name for d in parsed.classes] == ["fine.example.com"]
    (problem,) = parsed.problems
    assert problem.startswith("classes[0]")
    assert expected in problem


def test_duplicate_name_keeps_first() -> None:
    parsed = classfile.parse_classes_file(
        "classes: [{name: a.b, productName: X}, {name: a.b, productName: Y}]"
    )
    assert len(parsed.classes) == 1 and "X" in expressions(parsed.classes[0])[1]
    assert "defined twice" in parsed.problems[0]


@pytest.mark.parametrize(
    "text", ["[1, 2]", "classes: [", "clases: []"], ids=["list", "yaml", "typo"]
)
def test_unusable_file_is_an_error(text: str) -> None:
    with pytest.raises(classfile.ClassesFileError):
        classfile.parse_classes_file(text)


def test_empty_file_means_builtins_only() -> None:
    parsed = classfile.parse_classes_file("")
    names = [
        d.name for d in classfile.desired_classes(flag_extended_resource_name=None, file=parsed)
    ]
    assert names == ["gpu.nvidia.com", "mig.nvidia.com"]


@pytest.mark.parametrize(
    ("flag", "file_text", "expected"),
    [
        pytest.param("nvidia.com/gpu", "", "nvidia.com/gpu", id="flag"),
        pytest.param(None, "extendedResourceName: example.com/gpu", "example.com/gpu", id="file"),
        pytest.param("nvidia.com/gpu", "extendedResourceName: ''", None, id="file-turns-off"),
    ],
)
def test_extended_resource_name(flag: str | None, file_text: str, expected: str | None) -> None:
    parsed = classfile.parse_classes_file(file_text)
    gpu = classfile.desired_classes(flag_extended_resource_name=flag, file=parsed)[0]
    assert gpu.spec.get("extendedResourceName") == expected


def test_selector_warnings_name_the_entry() -> None:
    parsed = classfile.parse_classes_file(
        "classes: [{name: a.b, selectors: [\"device.attributes['gpu.nvidia.com'].brnd == 'x'\"]}]"
    )
    assert len(parsed.classes) == 1
    (warning,) = parsed.warnings
    assert warning.startswith("classes[0] (a.b).selectors[0]:") and "'brand'" in warning


def test_source_rereads_changed_file_and_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "classes.yaml"
    path.write_text("classes: [{name: a.example.com}]")
    source = reconciling.ClassSource(path=path, extended_resource_name=None)
    assert source.poll() is True
    assert [d.name for d in source.desired()][2:] == ["a.example.com"]
    assert source.poll() is False  # unchanged
    path.write_text("classes: [{name: b.example.com}, {name: c.example.com}]")
    assert source.poll() is True
    assert [d.name for d in source.desired()][2:] == ["b.example.com", "c.example.com"]
    path.write_text("classes: [")  # broken: the last good state stays
    assert source.poll() is False
    assert [d.name for d in source.desired()][2:] == ["b.example.com", "c.example.com"]
    path.unlink()
    assert source.poll() is False
    assert len(source.desired()) == 4
