"""The kind kit's local pieces: node image contents, the cluster config for it, its pod network."""

from __future__ import annotations

import io
import json
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.images import node_images as images
from e2e.kind.__main__ import KIT, local_config
from e2e.kind.bounded_runc import bounded, bounding_set, spec_of
from e2e.kind.network import NodeNet, conflist, node_nets, node_script
from e2e.kind.node_image import component_image, sandbox_image, static_image

KUBEADM_LIST = [
    "registry.k8s.io/kube-apiserver:v1.37.2",
    "registry.k8s.io/kube-controller-manager:v1.37.2",
    "registry.k8s.io/kube-scheduler:v1.37.2",
    "registry.k8s.io/kube-proxy:v1.37.2",
    "registry.k8s.io/coredns/coredns:v1.14.6",
    "registry.k8s.io/pause:3.10.2",
    "registry.k8s.io/etcd:3.7.0-0",
]


def _kit_config() -> dict[str, Any]:
    data = yaml.safe_load((KIT / "cluster.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_images_are_named_as_kubeadm_lists_them() -> None:
    assert component_image(KUBEADM_LIST, "etcd") == "registry.k8s.io/etcd:3.7.0-0"
    assert component_image(KUBEADM_LIST, "kube-proxy") == "registry.k8s.io/kube-proxy:v1.37.2"
    with pytest.raises(ValueError, match="no kube-dns"):
        component_image(KUBEADM_LIST, "kube-dns")


def test_sandbox_image_is_read_from_containerds_config() -> None:
    config = (
        '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.10"\n'
    )
    assert sandbox_image(config) == "registry.k8s.io/pause:3.10"
    with pytest.raises(ValueError, match="sandbox_image"):
        sandbox_image("version = 2\n")


def test_static_image_runs_its_binary_by_name(tmp_path: Path) -> None:
    binary = tmp_path / "kube-apiserver"
    binary.write_bytes(b"\x7fELF fake")
    archive = images.docker_archive(static_image("registry.k8s.io/kube-apiserver:v1", binary))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        with tarfile.open(fileobj=tar.extractfile(manifest[0]["Layers"][0])) as layer:
            member = layer.getmember("usr/local/bin/kube-apiserver")
    assert manifest[0]["RepoTags"] == ["registry.k8s.io/kube-apiserver:v1"]
    # kubeadm's static pods run `kube-apiserver ...` by name: PATH must hold it.
    assert "/usr/local/bin" in config["config"]["Env"][0]
    assert member.mode & 0o111


def test_local_config_replaces_what_the_local_node_image_lacks() -> None:
    kit = _kit_config()
    local = local_config(kit, cgroup_v1=True, sys_resource=False)
    assert local["networking"]["disableDefaultCNI"] is True
    patches = [yaml.safe_load(p) for p in local["kubeadmConfigPatches"]]
    init = next(p for p in patches if p["kind"] == "InitConfiguration")
    # The patch replaces kind's list: its own preflight skip must stay.
    assert set(init["skipPhases"]) == {"preflight", "addon/coredns"}
    assert {"kind": "KubeletConfiguration", "failCgroupV1": False} in patches
    # Everything of the kit's config is kept (CDI on, the labelled workers), the original intact.
    assert local["nodes"] == kit["nodes"]
    # Without CAP_SYS_RESOURCE, containerd clamps OOM scores; CDI stays on.
    assert (
        local["containerdConfigPatches"][: len(kit["containerdConfigPatches"])]
        == kit["containerdConfigPatches"]
    )
    cri = [
        tomllib.loads(p)["plugins"]["io.containerd.grpc.v1.cri"]
        for p in local["containerdConfigPatches"]
    ]
    assert {"restrict_oom_score_adj": True} in cri
    assert "networking" not in _kit_config() and kit == _kit_config()


def test_local_config_on_a_full_machine_leaves_kubelet_and_containerd_defaults() -> None:
    patches = [
        yaml.safe_load(p)
        for p in local_config(_kit_config(), cgroup_v1=False, sys_resource=True)[
            "kubeadmConfigPatches"
        ]
    ]
    assert all(p["kind"] != "KubeletConfiguration" for p in patches)
    config = local_config(_kit_config(), cgroup_v1=False, sys_resource=True)
    assert config["containerdConfigPatches"] == _kit_config()["containerdConfigPatches"]


def _node(name: str, cidr: str | None, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr} if cidr else {},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": ip},
            ]
        },
    }


def test_node_nets_take_each_nodes_cidr_and_internal_address() -> None:
    nodes = {"items": [_node("cp", "10.244.0.0/24", "172.18.0.2"), _node("w1", None, "172.18.0.3")]}
    assert node_nets(nodes) == [NodeNet("cp", "10.244.0.0/24", "172.18.0.2")]


def test_each_node_gets_its_own_subnet_and_routes_to_the_others() -> None:
    nets = [
        NodeNet("cp", "10.244.0.0/24", "172.18.0.2"),
        NodeNet("w1", "10.244.1.0/24", "172.18.0.3"),
        NodeNet("w2", "10.244.2.0/24", "172.18.0.4"),
    ]
    script = node_script(nets[1], nets)
    assert "ip route replace 10.244.0.0/24 via 172.18.0.2" in script
    assert "ip route replace 10.244.2.0/24 via 172.18.0.4" in script
    assert "10.244.1.0/24 via" not in script
    ranges = json.loads(conflist("10.244.1.0/24"))["plugins"][0]["ipam"]["ranges"]
    assert ranges == [[{"subnet": "10.244.1.0/24"}]]


def test_privileged_containers_get_only_the_capabilities_the_machine_holds() -> None:
    # This machine's bounding set: every capability up to 40 except CAP_SYS_RESOURCE (24).
    allowed = bounding_set("Name:\tx\nCapBnd:\t000001fffeffffff\n")
    assert "CAP_SYS_RESOURCE" not in allowed and {"CAP_SYS_ADMIN", "CAP_BPF"} <= allowed
    process: dict[str, object] = {
        "args": ["/sbin/init"],
        "capabilities": {
            "bounding": ["CAP_SYS_ADMIN", "CAP_SYS_RESOURCE"],
            "effective": ["CAP_SYS_RESOURCE", "CAP_NET_ADMIN"],
        },
    }
    assert bounded(process, allowed) == {
        "args": ["/sbin/init"],
        "capabilities": {"bounding": ["CAP_SYS_ADMIN"], "effective": ["CAP_NET_ADMIN"]},
    }
    assert bounded({"args": []}, allowed) == {"args": []}


def test_create_run_and_exec_have_their_process_rewritten_and_nothing_else() -> None:
    create = ["--root", "/r", "create", "--bundle", "/b/1", "--pid-file", "p", "id"]
    assert spec_of(create) == (Path("/b/1/config.json"), True)
    assert spec_of(["run", "--bundle=/b/2", "id"]) == (Path("/b/2/config.json"), True)
    execute = ["--root", "/r", "exec", "--process", "/tmp/p.json", "--detach", "id"]
    assert spec_of(execute) == (Path("/tmp/p.json"), False)
    assert spec_of(["--root", "/r", "start", "id"]) is None
