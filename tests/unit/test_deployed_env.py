"""The pure pieces of the deployed-driver harness (``make e2e-deployed`` runs the whole of it).

Cases:
- the local base image is debootstrapped from the Debian release the Dockerfile's public base
  names, found in the host's apt sources in either format; a base that names no release, or a
  release no source lists, is refused with the name in the message;
- wheels are downloaded as binaries for the base's CPython on Linux; the lock without its
  dependencies (it is complete), the build backend with them;
- each release's values point the chart's host paths at its own node and its plugin at that node;
  only the release with the webhook carries the CA bundle;
- kube-proxy leaves the host's conntrack and localnet settings alone;
- the API server's address is host-local and apart from the nodes' addresses.
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from e2e.deployed.env import RELEASES, ROLLOUT_ORDER, api_address, release_values
from e2e.images import base as base_image
from e2e.images import driver as driver_image
from e2e.node import kube_proxy
from e2e.node.config import NodePaths, node_ip

ONE_LINE = """
deb http://mirror.example/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian bookworm main
"""
DEB822 = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_base_release_is_the_dockerfiles() -> None:
    base = base_image.dockerfile_base()
    assert base_image.debian_release(base) == "bookworm"


def test_a_base_without_release_is_refused() -> None:
    with pytest.raises(ValueError, match=r"python:3\.12-slim.*does not name its Debian release"):
        base_image.debian_release("python:3.12-slim")


@pytest.mark.parametrize("sources", [ONE_LINE, DEB822])
def test_mirror_is_the_main_archive_of_the_release(sources: str) -> None:
    assert base_image.apt_mirror("bookworm", sources) == "http://mirror.example/debian"


def test_a_release_no_source_lists_is_refused() -> None:
    with pytest.raises(ValueError, match="'trixie'"):
        base_image.apt_mirror("trixie", DEB822)


def test_base_cache_key_follows_its_inputs() -> None:
    key = base_image.cache_key("bookworm", "http://a/debian")
    assert key == base_image.cache_key("bookworm", "http://a/debian")
    assert key != base_image.cache_key("trixie", "http://a/debian")
    assert key != base_image.cache_key("bookworm", "http://a/debian", ("python3",))


def test_wheels_are_binaries_for_the_base_python(tmp_path: Path) -> None:
    argv = driver_image.pip_download_argv("311", tmp_path, ["grpcio==1.0"], deps=False)
    assert "--only-binary=:all:" in argv and "--no-deps" in argv
    assert argv[argv.index("--python-version") + 1] == "311"
    assert "cp311" in argv and "manylinux_2_36_x86_64" in argv
    assert "manylinux_2_37_x86_64" not in argv  # newer than bookworm's glibc
    with_deps = driver_image.pip_download_argv("311", tmp_path, ["setuptools"], deps=True)
    assert "--no-deps" not in with_deps


def test_build_requirements_come_from_pyproject() -> None:
    assert any(r.startswith("setuptools") for r in driver_image.build_requirements())


def _node(tmp_path: Path, name: str) -> object:
    class FakeNode:
        paths = NodePaths(tmp_path / name)
        cdi_root = tmp_path / name / "cdi"

    return FakeNode()


def test_each_release_points_at_its_own_node(tmp_path: Path) -> None:
    for release in RELEASES:
        node = _node(tmp_path, release.node)
        values = release_values(release, tag="t", node=node, ca_bundle="Q0E=")  # type: ignore[arg-type]
        assert values["kubeletPlugin.kubeletDir"] == str(tmp_path / release.node / "kubelet")
        assert values["kubeletPlugin.cdiRoot"] == str(tmp_path / release.node / "cdi")
        assert values["simulate.nodeSelector.dra-gpu\\.test/profile"] == release.profile
        assert values["image.pullPolicy"] == "Never" and values["image.tag"] == "t"
        assert ("webhook.tls.caBundle" in values) == release.webhook
    assert sum(r.webhook for r in RELEASES) == 1


def test_each_release_runs_its_plugin_as_a_pool_on_its_node(tmp_path: Path) -> None:
    release = ROLLOUT_ORDER[0]  # the canary
    node = _node(tmp_path, release.node)
    values = release_values(release, tag="t", node=node, ca_bundle="Q0E=", pool_tag="bad")  # type: ignore[arg-type]
    assert values["kubeletPlugin.pools[0].name"] == release.pool
    assert values["kubeletPlugin.pools[0].nodeSelector.dra-gpu\\.test/profile"] == release.profile
    assert (values["kubeletPlugin.pools[0].image.tag"], values["image.tag"]) == ("bad", "t")
    plain = release_values(release, tag="t", node=node, ca_bundle="Q0E=", pools=False)  # type: ignore[arg-type]
    assert not any(k.startswith("kubeletPlugin.pools") for k in plain)
    # Pool by pool: every release once, the canary first.
    assert sorted(r.name for r in ROLLOUT_ORDER) == sorted(r.name for r in RELEASES)
    assert len({r.pool for r in RELEASES}) == len(RELEASES)


def test_kube_proxy_leaves_host_settings_alone(tmp_path: Path) -> None:
    text = kube_proxy.proxy_config(
        kubeconfig=tmp_path / "k", hostname="n", healthz_port=1, metrics_port=2
    )
    config = json.loads(text)
    assert config["mode"] == "iptables"
    assert config["conntrack"] == {"maxPerCore": 0}
    assert config["iptables"]["localhostNodePorts"] is False


def test_api_address_is_host_local_and_apart_from_nodes(tmp_path: Path) -> None:
    address = ipaddress.ip_address(api_address(tmp_path))
    assert address in ipaddress.ip_network("198.19.0.0/16")
    assert ipaddress.ip_address(node_ip(NodePaths(tmp_path))) not in ipaddress.ip_network(
        "198.19.0.0/16"
    )
