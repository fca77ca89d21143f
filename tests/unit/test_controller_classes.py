"""DeviceClass desired state and plan.

Cases: built-in classes carry NVIDIA's selectors (and extendedResourceName only when asked);
an empty cluster gets both created with our label; matching classes need no call; a deleted,
edited or unlabelled-by-us class is recreated/updated; classes we do not own are never touched
(conflict reported instead); owned classes no longer desired are deleted; server defaulting
of empty fields and an accepted server form are not drift.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_gpu.controller import classes

LABELS = {classes.MANAGED_BY_LABEL: classes.MANAGED_BY_VALUE}


def stored(
    d: classes.DesiredClass,
    *,
    rv: str = "7",
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = d.body()
    body["metadata"].update(resourceVersion=rv, uid="u-" + d.name, managedFields=[{"x": 1}])
    body["metadata"]["labels"] = LABELS if labels is None else labels
    if spec is not None:
        body["spec"] = spec
    return body


BUILTIN = classes.builtin_classes(extended_resource_name=None)
GPU, MIG = BUILTIN


def test_builtin_selectors_match_nvidia_driver() -> None:
    exprs = {d.name: [s["cel"]["expression"] for s in d.spec["selectors"]] for d in BUILTIN}
    assert exprs == {
        "gpu.nvidia.com": [
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
        ],
        "mig.nvidia.com": [
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
        ],
    }
    assert "extendedResourceName" not in GPU.spec


def test_extended_resource_name_only_on_gpu_class() -> None:
    gpu, mig = classes.builtin_classes(extended_resource_name="nvidia.com/gpu")
    assert gpu.spec["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in mig.spec


def test_empty_cluster_creates_both_with_label() -> None:
    p = classes.plan(BUILTIN, [])
    assert [(s.action, s.name) for s in p.steps] == [
        (classes.Action.CREATE, "gpu.nvidia.com"),
        (classes.Action.CREATE, "mig.nvidia.com"),
    ]
    body = p.steps[0].body
    assert body is not None
    assert body["metadata"]["labels"] == LABELS
    assert body["apiVersion"] == "resource.k8s.io/v1"


def test_in_sync_needs_nothing() -> None:
    assert classes.plan(BUILTIN, [stored(GPU), stored(MIG)]) == classes.Plan()


def test_deleted_class_is_recreated() -> None:
    p = classes.plan(BUILTIN, [stored(GPU)])
    assert [(s.action, s.name) for s in p.steps] == [(classes.Action.CREATE, "mig.nvidia.com")]


def test_edited_class_is_replaced_keeping_metadata() -> None:
    edited = stored(GPU, rv="42", spec={"selectors": [{"cel": {"expression": "true"}}]})
    edited["metadata"]["labels"] = {**LABELS, "team": "ml"}
    (step,) = classes.plan(BUILTIN, [edited, stored(MIG)]).steps
    assert (step.action, step.name, step.resource_version) == (
        classes.Action.UPDATE,
        "gpu.nvidia.com",
        "42",
    )
    assert step.body is not None
    assert step.body["spec"] == GPU.spec
    assert step.body["metadata"]["labels"] == {**LABELS, "team": "ml"}
    assert step.body["metadata"]["resourceVersion"] == "42"
    assert "managedFields" not in step.body["metadata"]


def test_unowned_class_is_left_alone_and_reported() -> None:
    foreign = stored(GPU, labels={}, spec={"selectors": [{"cel": {"expression": "true"}}]})
    p = classes.plan(BUILTIN, [foreign, stored(MIG)])
    assert p.steps == ()
    assert p.conflicts == ("gpu.nvidia.com",)


def test_owned_but_undesired_class_is_deleted_others_kept() -> None:
    old = classes.DesiredClass("old.example.com", {"selectors": []}, "file")
    someone_elses = stored(classes.DesiredClass("theirs.example.com", {}, "x"), labels={})
    p = classes.plan(BUILTIN, [stored(GPU), stored(MIG), stored(old, rv="9"), someone_elses])
    assert [(s.action, s.name, s.resource_version) for s in p.steps] == [
        (classes.Action.DELETE, "old.example.com", "9")
    ]


@pytest.mark.parametrize(
    "server_spec",
    [
        pytest.param({**GPU.spec, "config": []}, id="empty-list"),
        pytest.param({**GPU.spec, "extendedResourceName": None}, id="null-field"),
    ],
)
def test_empty_defaults_are_not_drift(server_spec: dict[str, Any]) -> None:
    assert classes.plan(BUILTIN, [stored(GPU, spec=server_spec), stored(MIG)]).steps == ()


def test_accepted_server_form_is_not_fought_over() -> None:
    gpu, mig = classes.builtin_classes(extended_resource_name="nvidia.com/gpu")
    dropped = {k: v for k, v in gpu.spec.items() if k != "extendedResourceName"}
    existing = [stored(gpu, spec=dropped), stored(mig)]
    assert classes.plan([gpu, mig], existing).steps != ()
    accepted = {classes.spec_key(gpu.spec): classes.spec_key(dropped)}
    assert classes.plan([gpu, mig], existing, accepted=accepted).steps == ()


@pytest.mark.parametrize(
    "module", ["admission", "classes", "classfile", "leases", "registration", "selectors"]
)
def test_pure_modules_do_not_import_the_api_client(module: str) -> None:
    import ast
    from pathlib import Path

    import dra_gpu.controller

    source = Path(dra_gpu.controller.__file__).with_name(f"{module}.py").read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    assert not {m for m in imported if m.split(".")[0] in ("kubernetes", "grpc", "urllib3")}
    assert not {m for m in imported if m.startswith("dra_gpu.kube.client")}
