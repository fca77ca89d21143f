"""The kubelet plugin as a real process against the real API server.

Each test registers its own Node and runs ``python -m dra_gpu kubelet-plugin`` with temporary
registry, data, CDI and state directories, so tests never see each other's slices or sockets.

Cases:
- ``--simulate h200x8``: one slice with 8 devices, pool = node, owned by the Node.
- A slice deleted by someone comes back (higher generation).
- A changed simulated profile file publishes a new generation and removes the old slices.
- A client acting as the kubelet: GetInfo on the registration socket, then both DRAPlugin
  versions on the endpoint it names (zero claims), then NotifyRegistrationStatus.
- API server stopped for 20 s: the plugin stays up (and /healthz stays 200), and afterwards the
  slices show the inventory as changed during the outage.
- SIGTERM: exit code 0, no socket left.
- Rolling update: a second instance with another pod UID serves beside the first; the pool is
  not duplicated; when the first stops, the second keeps serving.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import pytest

from dra_gpu.pb import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from e2e import procs, waiting
from e2e.cluster import Cluster
from e2e.driver import PluginDirs, plugin_argv

DRIVER = "gpu.nvidia.com"
WAIT_S = 60.0  # bounds a broken test only
RPC_TIMEOUT_S = 10
SliceList = list[dict[str, Any]]  # spelled out here: inside Slices, `list` is its method


wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S)


def profile_json(count: int) -> str:
    return json.dumps({"gpus": [{"product": "H200-141GB", "count": count}]})


@dataclass
class Plugin:
    node: str
    root: Path
    proc: subprocess.Popen[bytes]
    healthz_port: int
    pod_uid: str | None

    @property
    def log(self) -> str:
        return (self.root / f"plugin-{self.pod_uid or 'default'}.log").read_text(errors="replace")

    @property
    def registration(self) -> Path:
        name = f"{DRIVER}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{DRIVER}-reg.sock"
        return self.root / "registry" / name

    @property
    def dra(self) -> Path:
        return self.root / "data" / (f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock")

    def healthz(self) -> int | None:
        url = f"http://127.0.0.1:{self.healthz_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            return None


class StartPlugin(Protocol):
    """The ``start_plugin`` fixture: starts one plugin process (stopped at the test's end)."""

    def __call__(self, *, simulate: str = "h200x8", pod_uid: str | None = None) -> Plugin: ...


class Slices:
    """Read and delete one node's slices with the official client (independent of the plugin)."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        from kubernetes import client

        self._api = cluster.api_client()
        self._resource = client.ResourceV1Api(self._api)
        self._selector = f"spec.nodeName={node},spec.driver={DRIVER}"

    def list(self) -> SliceList:
        listed = self._resource.list_resource_slice(
            field_selector=self._selector, _request_timeout=10
        )
        items: list[dict[str, Any]] = self._api.sanitize_for_serialization(listed)["items"]
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def when(self, condition: Callable[[SliceList], bool]) -> Callable[[], SliceList | None]:
        """A probe for ``wait_for``: the slices once ``condition`` holds for them."""

        def probe() -> SliceList | None:
            try:
                items = self.list()
            except Exception:  # the API server may still be coming back
                return None
            return items if condition(items) else None

        return probe

    def delete(self, name: str) -> None:
        self._resource.delete_resource_slice(name, _request_timeout=10)

    def close(self) -> None:
        self._api.close()


def devices_of(items: list[dict[str, Any]]) -> list[str]:
    return sorted(d["name"] for s in items for d in s["spec"].get("devices") or [])


def generations(items: list[dict[str, Any]]) -> set[int]:
    return {int(s["spec"]["pool"]["generation"]) for s in items}


@pytest.fixture
def node(cluster: Cluster) -> str:
    name = f"kp-{uuid.uuid4().hex[:8]}"
    cluster.register_node(name)
    return name


@pytest.fixture
def slices(cluster: Cluster, node: str) -> Iterator[Slices]:
    reader = Slices(cluster, node)
    yield reader
    reader.close()


@pytest.fixture
def root() -> Iterator[Path]:
    # Short: unix socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="kp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_plugin(cluster: Cluster, node: str, root: Path) -> Iterator[StartPlugin]:
    started: list[Plugin] = []

    def start(*, simulate: str = "h200x8", pod_uid: str | None = None) -> Plugin:
        (port,) = procs.free_ports(1)
        argv = plugin_argv(
            node_name=node,
            kubeconfig=cluster.kubeconfig,
            profile=simulate,
            dirs=PluginDirs.under(root),
            healthz_port=port,
            extra=("--pod-uid", pod_uid) if pod_uid else (),
        )
        env = {"PATH": "/usr/bin:/bin"}
        log = root / f"plugin-{pod_uid or 'default'}.log"
        plugin = Plugin(node, root, procs.spawn(argv, log_path=log, env=env), port, pod_uid)
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        procs.stop(plugin.proc)


def ready(plugin: Plugin) -> Plugin:
    wait_for(
        "the plugin's /healthz", lambda: plugin.proc.poll() is not None or plugin.healthz() == 200
    )
    assert plugin.proc.poll() is None, plugin.log
    return plugin


def test_publishes_one_slice_with_eight_devices(
    start_plugin: StartPlugin, slices: Slices, node: str, cluster: Cluster
) -> None:
    ready(start_plugin())
    (only,) = wait_for("the node's slice", slices.list)
    assert devices_of([only]) == [f"gpu-{i}" for i in range(8)]
    assert only["spec"]["pool"]["name"] == node
    assert only["spec"]["pool"]["resourceSliceCount"] == 1
    (owner,) = only["metadata"]["ownerReferences"]
    node_uid = cluster.kubectl("get", "node", node, "-o", "jsonpath={.metadata.uid}")
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)


def test_deleted_slice_comes_back(start_plugin: StartPlugin, slices: Slices) -> None:
    ready(start_plugin())
    (first,) = wait_for("the node's slice", slices.list)
    slices.delete(first["metadata"]["name"])
    (again,) = wait_for(
        "the slice to come back",
        lambda: [s for s in slices.list() if s["metadata"]["uid"] != first["metadata"]["uid"]],
    )
    assert devices_of([again]) == devices_of([first])
    assert min(generations([again])) > max(generations([first]))


def test_changed_inventory_publishes_new_generation_and_removes_old(
    start_plugin: StartPlugin, slices: Slices, root: Path
) -> None:
    profile = root / "profile.json"
    profile.write_text(profile_json(130))  # 130 devices: two slices
    ready(start_plugin(simulate=str(profile)))
    before: SliceList = wait_for("two slices", slices.when(lambda s: len(s) == 2))
    assert len(devices_of(before)) == 130
    profile.write_text(profile_json(4))
    four = [f"gpu-{i}" for i in range(4)]
    after: SliceList = wait_for("the new inventory", slices.when(lambda s: devices_of(s) == four))
    assert len(after) == 1
    assert min(generations(after)) > max(generations(before))
    assert after[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_kubelet_client_registers_and_calls_the_dra_endpoint(start_plugin: StartPlugin) -> None:
    plugin = ready(start_plugin())
    with grpc.insecure_channel(f"unix:{plugin.registration}") as ch:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(plugin.dra)
        assert list(info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        with grpc.insecure_channel(f"unix:{info.endpoint}") as dra:
            v1 = dra_v1_pb2_grpc.DRAPluginStub(dra).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=RPC_TIMEOUT_S
            )
            v1beta1 = dra_v1beta1_pb2_grpc.DRAPluginStub(dra).NodePrepareResources(
                dra_v1beta1_pb2.NodePrepareResourcesRequest(), timeout=RPC_TIMEOUT_S
            )
        assert len(v1.claims) == 0 and len(v1beta1.claims) == 0
        stub.NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True),
            timeout=RPC_TIMEOUT_S,
        )
    wait_for("the registration log line", lambda: "registered with the kubelet" in plugin.log)


def test_survives_api_server_outage(
    start_plugin: StartPlugin, slices: Slices, root: Path, cluster: Cluster
) -> None:
    profile = root / "profile.json"
    profile.write_text(profile_json(8))
    plugin = ready(start_plugin(simulate=str(profile)))
    wait_for("the node's slice", slices.list)
    cluster.stop_apiserver()
    try:
        profile.write_text(profile_json(2))  # the inventory changes while the API is away
        time.sleep(20)
        assert plugin.proc.poll() is None, plugin.log
        assert plugin.healthz() == 200  # liveness must not fail during an outage
    finally:
        cluster.start_apiserver()
    wait_for(
        "the slices to match the inventory again",
        slices.when(lambda s: devices_of(s) == ["gpu-0", "gpu-1"]),
    )
    assert plugin.proc.poll() is None
    assert "API server reachable again" in plugin.log


def test_sigterm_exits_cleanly_and_leaves_no_socket(start_plugin: StartPlugin, root: Path) -> None:
    plugin = ready(start_plugin())
    assert plugin.registration.is_socket() and plugin.dra.is_socket()
    plugin.proc.send_signal(signal.SIGTERM)
    assert plugin.proc.wait(timeout=WAIT_S) == 0
    left = [p for p in root.rglob("*") if p.is_socket()]
    assert left == []


def test_rolling_update_instances_run_side_by_side(
    start_plugin: StartPlugin, slices: Slices
) -> None:
    old = ready(start_plugin(pod_uid="0000-old"))
    (first,) = wait_for("the node's slice", slices.list)
    new = ready(start_plugin(pod_uid="1111-new"))
    for plugin in (old, new):
        with grpc.insecure_channel(f"unix:{plugin.registration}") as ch:
            info = pluginregistration_v1_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_v1_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S
            )
        assert info.endpoint == str(plugin.dra)
    (shared,) = slices.list()  # one pool, not one per instance
    assert shared["metadata"]["uid"] == first["metadata"]["uid"]
    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(timeout=WAIT_S) == 0
    assert not old.registration.exists() and not old.dra.exists()
    assert new.registration.is_socket() and new.dra.is_socket()
    assert new.healthz() == 200
