"""The real node's generated configuration: what containerd, CNI and the kubelet will read."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from e2e.binaries import module_version
from e2e.node.binaries import CONTAINERD, RUNC
from e2e.node.config import (
    KubeletPorts,
    NodePaths,
    bridge_name,
    cni_config,
    containerd_config,
    kubelet_config,
    pod_subnet,
)

PATHS = NodePaths(Path("/tmp/dra-gpu-node-x"))


def _containerd() -> dict[str, object]:
    text = containerd_config(
        PATHS,
        runc=Path("/cache/runc"),
        cni_bin_dir=Path("/usr/lib/cni"),
        cdi_dirs=(Path("/tmp/cdi dir"),),
        sandbox="localhost/dra-gpu/pause:1",
    )
    return tomllib.loads(text)


def test_containerd_config_is_v3_with_cdi_dir_pinned_sandbox_and_own_paths() -> None:
    conf = _containerd()
    plugins = conf["plugins"]
    assert isinstance(plugins, dict)
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert conf["version"] == 3
    assert runtime["cdi_spec_dirs"] == ["/tmp/cdi dir"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == (
        "localhost/dra-gpu/pause:1"
    )
    runc = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert runc["BinaryName"] == "/cache/runc"
    assert runc["SystemdCgroup"] is False
    assert runtime["cni"]["conf_dir"] == str(PATHS.cni_conf_dir)
    # Nothing of this node outside its own directory: a second node never collides.
    for key in ("root", "state"):
        assert str(conf[key]).startswith(str(PATHS.root))
    assert conf["grpc"]["address"] == str(PATHS.containerd_socket)  # type: ignore[index]


def test_cni_config_is_a_bridge_with_host_local_ipam_in_the_node_dir() -> None:
    conf = json.loads(cni_config(PATHS, network="net", subnet="10.244.7.0/24"))
    bridge = conf["plugins"][0]
    assert bridge["type"] == "bridge"
    assert len(bridge["bridge"]) <= 15  # Linux interface-name limit
    assert bridge["ipam"]["dataDir"] == str(PATHS.cni_ipam_dir)
    assert bridge["ipam"]["ranges"][0][0]["subnet"] == "10.244.7.0/24"


def test_pod_subnet_skips_subnets_in_use_on_the_host() -> None:
    mine = pod_subnet(PATHS)
    gateway = mine.replace(".0/24", ".1")
    other = pod_subnet(PATHS, taken=[gateway])
    assert other != mine and other.startswith("10.244.") and other.endswith(".0/24")


def test_kubelet_config_suits_cgroup_v1_machines_and_stays_on_loopback() -> None:
    conf = json.loads(
        kubelet_config(
            PATHS, ports=KubeletPorts(server=1234, healthz=1235), client_ca=Path("/ca.crt"),
            cgroup_root="/dra-gpu-n", address="198.18.0.1",
        )
    )  # fmt: skip
    assert conf["kind"] == "KubeletConfiguration"
    assert conf["failCgroupV1"] is False
    assert conf["failSwapOn"] is False
    assert conf["cgroupDriver"] == "cgroupfs"
    assert conf["address"] == "198.18.0.1"
    assert conf["healthzBindAddress"] == "127.0.0.1"
    assert (conf["port"], conf["healthzPort"], conf["readOnlyPort"]) == (1234, 1235, 0)
    assert conf["containerRuntimeEndpoint"] == f"unix://{PATHS.containerd_socket}"
    assert conf["authentication"]["anonymous"]["enabled"] is False


def test_plugin_registry_is_the_kubelet_roots_registry_dir() -> None:
    assert PATHS.plugin_registry_dir == PATHS.kubelet_root / "plugins_registry"


@pytest.mark.parametrize("build", [CONTAINERD, RUNC], ids=["containerd", "runc"])
def test_node_binary_versions_come_from_the_committed_go_modules(build: object) -> None:
    from e2e.node.binaries import GoBuild

    assert isinstance(build, GoBuild)
    assert build.version.startswith("v")
    assert build.directory.name == f"{build.cache_name}-{build.version}"


def test_module_version_reads_tool_requirements(tmp_path: Path) -> None:
    gomod = tmp_path / "go.mod"
    gomod.write_text("module x\n\nrequire (\n\texample.com/a v1.2.3 // indirect\n)\n")
    assert module_version(gomod, "example.com/a") == "v1.2.3"
    with pytest.raises(ValueError, match=r"example\.com/b"):
        module_version(gomod, "example.com/b")


def test_host_wide_names_differ_between_two_nodes_of_the_same_name() -> None:
    # Two sessions may run a node called "gpu-0" at once: nothing host-wide may collide.
    from e2e.node.config import cgroup_root, node_ip, node_link

    other = NodePaths(Path("/tmp/dra-gpu-node-y"))
    for name_of in (lambda p: cgroup_root(p, "gpu-0"), node_link, bridge_name, node_ip):
        assert name_of(PATHS) != name_of(other)
