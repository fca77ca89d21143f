"""Pure parts of the harness: build plans, go commands, generated modules, component flags.

Cases: requested components are grouped into the fewest go builds (kubelet only when asked);
the version is stamped; etcd gets an explicit output name; a non-default Kubernetes version gets
every staging module replaced by its v0.<minor>.<patch>; bad versions and names are refused; the
cache honours its overrides; component flags carry the settings tests rely on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e import binaries
from e2e.binaries import BuildStep, Versions
from e2e.cluster import components


@pytest.mark.parametrize(
    ("wanted", "steps"),
    [
        (
            binaries.CONTROL_PLANE,
            [
                BuildStep(binaries.CONTROL_PLANE_K8S, "k8s", cgo=False),
                BuildStep(("etcd",), "etcd", cgo=False),
            ],
        ),
        (["kubelet"], [BuildStep(("kubelet",), "k8s", cgo=True)]),
        (
            ["kubectl", "etcd"],
            [BuildStep(("kubectl",), "k8s", cgo=False), BuildStep(("etcd",), "etcd", cgo=False)],
        ),
        ([], []),
    ],
    ids=["control-plane-without-kubelet", "kubelet-alone", "subset", "nothing"],
)
def test_plan_groups_builds(wanted: list[str], steps: list[BuildStep]) -> None:
    assert binaries.plan(wanted) == steps


def test_k8s_build_stamps_version_and_writes_into_dir(tmp_path: Path) -> None:
    step = BuildStep(("kube-apiserver", "kubectl"), "k8s", cgo=False)
    argv = binaries.go_build_argv(step, tmp_path, Versions(k8s="v1.36.3"))
    ldflags = argv[argv.index("-ldflags") + 1]
    assert "k8s.io/component-base/version.gitVersion=v1.36.3" in ldflags
    assert "k8s.io/component-base/version.gitMinor=36" in ldflags
    assert "-trimpath" in argv
    assert argv[argv.index("-o") + 1] == f"{tmp_path}/"
    assert argv[-2:] == ["k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl"]


def test_etcd_build_names_its_binary(tmp_path: Path) -> None:
    argv = binaries.go_build_argv(BuildStep(("etcd",), "etcd", cgo=False), tmp_path, Versions())
    assert argv[argv.index("-o") + 1] == str(tmp_path / "etcd")
    assert argv[-1] == "go.etcd.io/etcd/server/v3"


def test_generated_module_replaces_every_staging_module() -> None:
    text = binaries.k8s_gomod_text("v1.35.4")
    assert "require k8s.io/kubernetes v1.35.4" in text
    for module in binaries.STAGING_MODULES:
        assert f"\tk8s.io/{module} => k8s.io/{module} v0.35.4\n" in text
    assert "\tk8s.io/kubernetes/cmd/kubelet\n" in text


def test_committed_modules_pin_the_default_versions() -> None:
    assert binaries.pinned_version("k8s") == binaries.DEFAULT_K8S_VERSION
    assert binaries.pinned_version("etcd") == binaries.DEFAULT_ETCD_VERSION


def test_versions_and_cache_from_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DRA_GPU_K8S_VERSION", "1.34.4")
    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path))
    versions = Versions.from_env()
    assert versions.k8s == "v1.34.4"
    assert binaries.binary_path("kubectl", versions) == tmp_path / "k8s-v1.34.4" / "kubectl"
    assert binaries.binary_path("etcd", versions) == tmp_path / "etcd-v3.6.16" / "etcd"
    assert binaries.missing(["kubectl"], versions) == ["kubectl"]


@pytest.mark.parametrize("bad", ["latest", "v1.37", "1.37.2-rc.0"])
def test_malformed_version_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("DRA_GPU_K8S_VERSION", bad)
    with pytest.raises(ValueError, match="not of the form"):
        Versions.from_env()


def test_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown component 'kube-router'"):
        binaries.ensure(["kube-router"])


def test_build_times_are_recorded_per_component(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DRA_GPU_CACHE", str(tmp_path))
    versions = Versions()
    directory = binaries.component_dir("kubectl", versions)
    directory.mkdir(parents=True)
    binaries.record_build(directory, ["kubectl", "kube-scheduler"], 61.04)
    binaries.record_build(directory, ["kubectl"], 12.0)
    assert binaries.recorded_build_seconds("kubectl", versions) == 12.0
    assert binaries.recorded_build_seconds("kube-scheduler", versions) == 61.0
    assert binaries.recorded_build_seconds("kubelet", versions) is None


def test_build_progress_estimates_from_the_last_recorded_build(tmp_path: Path) -> None:
    together = ["kube-apiserver", "kubectl"]
    assert binaries.recorded_seconds(tmp_path, together) is None
    assert binaries.progress_line("kubectl v1.37.2", 90.0, None, 412) == (
        "[build] kubectl v1.37.2: 1m30.0s elapsed, 412 packages"
    )
    binaries.record_build(tmp_path, together, 372.0)
    binaries.record_build(tmp_path, ["kubectl"], 12.0)
    estimate = binaries.recorded_seconds(tmp_path, together)  # not the later kubectl-only build
    assert estimate == 372.0
    assert binaries.progress_line("kube-apiserver, kubectl", 90.0, estimate, 412) == (
        "[build] kube-apiserver, kubectl: 1m30.0s elapsed of about 6m12.0s (last build), "
        "412 packages"
    )


@pytest.fixture
def layout(tmp_path: Path) -> components.Layout:
    return components.Layout(
        workdir=tmp_path,
        ports=components.Ports(2379, 2380, 6443, 10257, 10259),
        feature_gates={"DRAListTypeAttributes": True, "DRAConsumableCapacity": False},
        extra_args={components.SCHEDULER: ("--v=4",)},
    )


def test_apiserver_flags(layout: components.Layout) -> None:
    argv = components.apiserver_argv(Path("/bin/kube-apiserver"), layout)
    assert "--secure-port=6443" in argv
    assert "--etcd-servers=http://127.0.0.1:2379" in argv
    assert "--authorization-mode=Node,RBAC" in argv
    assert "--enable-admission-plugins=NodeRestriction" in argv
    assert "--feature-gates=DRAConsumableCapacity=false,DRAListTypeAttributes=true" in argv
    assert f"--service-account-key-file={layout.workdir / 'pki' / 'sa.pub'}" in argv


def test_feature_gates_from_the_environment_variable() -> None:
    assert components.gates_from(
        "DRADeviceBindingConditions=false, DRAPartitionableDevices=True"
    ) == {
        "DRADeviceBindingConditions": False,
        "DRAPartitionableDevices": True,
    }
    assert components.gates_from(None) == {} and components.gates_from("") == {}
    with pytest.raises(ValueError, match="DRADeviceBindingConditions"):
        components.gates_from("DRADeviceBindingConditions")


def test_extra_args_reach_only_their_component(layout: components.Layout) -> None:
    assert components.scheduler_argv(Path("s"), layout)[-1] == "--v=4"
    assert "--v=4" not in components.controller_manager_argv(Path("c"), layout)


def test_controller_manager_runs_all_controllers_with_signing(layout: components.Layout) -> None:
    argv = components.controller_manager_argv(Path("c"), layout)
    assert "--controllers=*" in argv
    assert "--leader-elect=false" in argv
    assert f"--cert-dir={layout.workdir / 'kube-controller-manager'}" in argv
    assert f"--cluster-signing-key-file={layout.workdir / 'pki' / 'ca.key'}" in argv
