"""The plugin's gRPC side over real unix sockets, with an in-memory API behind the publisher.

Cases: GetInfo names the DRA socket and the versions, v1 first; the DRA endpoint it names
answers (both versions, zero claims); sockets are owner-only and no private directory is left;
the device health stream (both versions) lists every device HEALTHY; grpc.health.v1 answers;
a refused registration is logged as an error; DRA calls wait for the node-wide lock; stop
removes the sockets; two rolling-update instances serve side by side; grpc.health.v1 Watch
turns SERVING once published and NOT_SERVING when the plugin stops; /healthz makes a real call
on each socket and turns 503, naming the socket, when one stops answering; the DRA socket
refuses an oversized request with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import logging
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_slice_store import FakeSliceStore
from grpc_health.v1 import health_pb2, health_pb2_grpc
from plugin_start import start_serving

from dra_gpu.kube import credentials
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.transport import Transport
from dra_gpu.kubeletplugin import (
    call_lock,
    device_health,
    events,
    grpcio_server,
    healthz,
    kit,
    slice_plan,
    sockets,
)
from dra_gpu.pb import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_gpu.plugin import inventory, lifecycle, node_plugin, platforms
from dra_gpu.plugin import main as plugin_main
from dra_gpu.plugin import settings as plugin_settings
from dra_gpu.prepare.state import DeviceState

NODE = "node-a"
TIMEOUT_S = 10  # bounds a broken server only


def make_settings(root: Path, *extra: str) -> plugin_settings.Settings:
    parser = argparse.ArgumentParser()
    plugin_settings.add_arguments(parser)
    argv = [
        "--node-name",
        NODE,
        "--plugin-registry-dir",
        str(root / "registry"),
        "--plugin-data-dir",
        str(root / "data"),
        "--cdi-root",
        str(root / "cdi"),
        *extra,
    ]
    return plugin_settings.build_settings(vars(parser.parse_args(argv)), {})


@pytest.fixture
def short_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Unix socket paths are limited to 107 bytes; pytest's tmp paths can get long.
    return Path(tmp_path_factory.mktemp("kp", numbered=True))


@pytest.fixture
def start_plugin(short_root: Path) -> Iterator[Callable[..., node_plugin.NodePlugin]]:
    """Starts plugins (each stopped at the end)."""
    started: list[node_plugin.NodePlugin] = []
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate="h200x8", node_name=NODE))
    )

    def start(*extra: str, state: DeviceState | None = None) -> node_plugin.NodePlugin:
        settings = make_settings(short_root, *extra)
        plugin = node_plugin.NodePlugin(
            settings,
            store=FakeSliceStore(),
            devices=devices,
            instance=node_plugin.this_instance(settings),
        )
        started.append(plugin)
        start_serving(plugin, state)
        return plugin

    yield start
    for plugin in started:
        plugin.stop()


def channel(path: Path) -> grpc.Channel:
    return grpc.insecure_channel(f"unix:{path}")


def get_info(registration: Path) -> pluginregistration_v1_pb2.PluginInfo:
    with channel(registration) as ch:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(ch)
        return stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=TIMEOUT_S)


def paths(root: Path, *extra: str) -> sockets.SocketPaths:
    return plugin_settings.socket_paths(make_settings(root, *extra))


def test_get_info_names_the_dra_socket_and_versions(start_plugin: Any, short_root: Path) -> None:
    start_plugin()
    info = get_info(paths(short_root).registration)
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.nvidia.com"
    assert info.endpoint == str(short_root / "data" / "dra.sock")
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


@pytest.mark.parametrize(
    ("pb", "pb_grpc"),
    [(dra_v1_pb2, dra_v1_pb2_grpc), (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)],
    ids=["v1", "v1beta1"],
)
def test_dra_endpoint_from_get_info_answers(
    start_plugin: Any, short_root: Path, pb: Any, pb_grpc: Any
) -> None:
    start_plugin()
    endpoint = get_info(paths(short_root).registration).endpoint
    with channel(Path(endpoint)) as ch:
        stub = pb_grpc.DRAPluginStub(ch)
        prepared = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=TIMEOUT_S)
        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(), timeout=TIMEOUT_S
        )
    assert dict(prepared.claims) == {} and dict(unprepared.claims) == {}


def test_sockets_are_owner_only_and_no_private_dir_is_left(
    start_plugin: Any, short_root: Path
) -> None:
    start_plugin()
    p = paths(short_root)
    for sock in (p.registration, p.dra):
        mode = sock.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
    leftovers = [x.name for d in (p.registration.parent, p.dra.parent) for x in d.iterdir()]
    assert not [name for name in leftovers if name.startswith(".")]


def test_serves_when_the_socket_paths_are_at_the_length_limit(short_root: Path) -> None:
    # A registration socket path of exactly 107 bytes is valid; the plugin must serve on it
    # even though the private directory it binds in first has a longer path.
    base = paths(short_root).registration
    pad = sockets.MAX_PATH - len(str(base).encode()) - len("/")
    assert pad > 0, "pytest's tmp root is already too long for this test"
    root = short_root / ("d" * pad)
    assert len(str(paths(root).registration).encode()) == sockets.MAX_PATH
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate="h200x8", node_name=NODE))
    )
    settings = make_settings(root)
    plugin = node_plugin.NodePlugin(
        settings,
        store=FakeSliceStore(),
        devices=devices,
        instance=node_plugin.this_instance(settings),
    )
    start_serving(plugin)
    try:
        assert get_info(paths(root).registration).endpoint == str(root / "data" / "dra.sock")
    finally:
        plugin.stop()


def test_socket_path_over_the_limit_is_a_settings_error(short_root: Path) -> None:
    base = paths(short_root).registration
    root = short_root / ("d" * (sockets.MAX_PATH - len(str(base).encode())))
    with pytest.raises(plugin_settings.SettingsError, match="longer than 107 bytes"):
        make_settings(root)


@pytest.mark.parametrize(
    ("pb", "pb_grpc"),
    [(health_v1_pb2, health_v1_pb2_grpc), (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)],
    ids=["v1", "v1alpha1"],
)
def test_health_stream_lists_every_device_healthy(
    start_plugin: Any, short_root: Path, pb: Any, pb_grpc: Any
) -> None:
    start_plugin()
    with channel(paths(short_root).dra) as ch:
        stream = pb_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=TIMEOUT_S
        )
        first = next(stream)
        stream.cancel()
    assert sorted(d.device.device_name for d in first.devices) == [f"gpu-{i}" for i in range(8)]
    assert {d.device.pool_name for d in first.devices} == {NODE}
    assert {d.health for d in first.devices} == {pb.HealthStatus.Value("HEALTHY")}


def test_health_stream_reports_devices_discovery_lost_as_unhealthy(
    start_plugin: Any, short_root: Path
) -> None:
    plugin = start_plugin()
    devices = inventory.discover(
        inventory.backend_for(platforms.for_node(simulate="h100x8", node_name=NODE))
    )
    with channel(paths(short_root).dra) as ch:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest(), timeout=TIMEOUT_S
        )
        responses = iter(stream)
        next(responses)
        plugin.set_devices(devices[:3], in_use={"gpu-5", "gpu-6", "gpu-7"})
        second = next(responses)
        stream.cancel()
    health = {d.device.device_name: (d.health, d.message) for d in second.devices}
    healthy = (health_v1_pb2.HealthStatus.Value("HEALTHY"), "")
    assert {name: health[name] for name in ("gpu-0", "gpu-1", "gpu-2")} == dict.fromkeys(
        ("gpu-0", "gpu-1", "gpu-2"), healthy
    )
    # Lost devices still in use: the kubelet hears they are unhealthy; the others leave.
    lost = (health_v1_pb2.HealthStatus.Value("UNHEALTHY"), device_health.GONE)
    assert {n: h for n, h in health.items() if h != healthy} == {
        f"gpu-{i}": lost for i in range(5, 8)
    }


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize("socket_name", ["registration", "dra"])
def test_grpc_health_check_serves_once_published(
    start_plugin: Any, short_root: Path, socket_name: str
) -> None:
    plugin = start_plugin()
    assert plugin.publisher.wait_synced(TIMEOUT_S)
    with channel(getattr(paths(short_root), socket_name)) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        assert reply.status == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=TIMEOUT_S)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_health_watch_follows_the_plugin_until_it_stops(
    start_plugin: Any, short_root: Path
) -> None:
    plugin = start_plugin()
    with channel(paths(short_root).dra) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(
            health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S
        )
        statuses = iter(r.status for r in watch)
        # NOT_SERVING first when the slices were not published yet; SERVING once they are
        assert SERVING in statuses
        # stop waits for calls in flight (this watch too), so it runs beside the reading
        stopping = threading.Thread(target=plugin.stop)
        stopping.start()
        assert next(statuses) == NOT_SERVING
        watch.cancel()
        stopping.join()


def test_refused_registration_is_logged_as_error(
    start_plugin: Any, short_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    start_plugin()
    with channel(paths(short_root).registration) as ch:
        pluginregistration_v1_pb2_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(
                plugin_registered=False, error="version not supported"
            ),
            timeout=TIMEOUT_S,
        )
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("REFUSED" in m and "version not supported" in m for m in errors)


def _probe(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode().strip()
    finally:
        conn.close()


def test_ready_only_once_the_kubelet_confirmed_the_registration(
    start_plugin: Any, short_root: Path
) -> None:
    # A rolling update replaces the old pod when the new one is Ready: Ready before the kubelet
    # switched to it, the old instance stopped while the kubelet still called it.
    plugin = start_plugin()
    assert plugin.publisher.wait_synced(TIMEOUT_S)
    assert plugin.not_ready() == "not registered with the kubelet yet"
    with channel(paths(short_root).registration) as ch:
        pluginregistration_v1_pb2_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
            pluginregistration_v1_pb2.RegistrationStatus(plugin_registered=True),
            timeout=TIMEOUT_S,
        )
    assert plugin.not_ready() is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def streams_in_every_call_slot(path: Path, limits: grpcio_server.Limits) -> Iterator[int]:
    """Device health streams on the DRA socket, one for every call slot, over as many
    connections as the per-connection limit needs; yields how many were served (the others
    are refused); cancelled on exit."""
    per_connection = limits.streams_per_connection
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    channels = [
        grpc.insecure_channel(f"unix:{path}", options=own_connection)
        for _ in range(-(-limits.concurrent_rpcs // per_connection))
    ]
    streams: list[Any] = []  # a stream no one refers to any more is cancelled
    served = 0
    try:
        for i in range(limits.concurrent_rpcs):
            stub = health_v1_pb2_grpc.DRAResourceHealthStub(channels[i // per_connection])
            streams.append(stub.NodeWatchResources(health_v1_pb2.NodeWatchResourcesRequest()))
            try:
                next(streams[-1])  # the first message: the call is in its handler now
                served += 1
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        yield served
    finally:
        for stream in streams:
            stream.cancel()
        for ch in channels:
            ch.close()


def test_health_streams_cannot_take_the_dra_socket_from_its_calls(
    start_plugin: Any, short_root: Path
) -> None:
    port = free_port()
    plugin = start_plugin("--healthz-port", str(port))
    assert plugin.publisher.wait_synced(TIMEOUT_S)
    assert _probe(port, "/healthz") == (200, "ok")
    dra = paths(short_root).dra
    # A client opening a stream for every call slot gets the few the socket serves at once; the
    # others are refused, and the socket still answers calls (here /healthz's health check).
    with streams_in_every_call_slot(dra, kit.DRA_LIMITS) as served:
        assert served == kit.DRA_LIMITS.streams
        assert _probe(port, "/healthz") == (200, "ok")


def test_a_burst_of_pod_starts_on_a_new_connection_is_served(
    start_plugin: Any, short_root: Path
) -> None:
    # 64 prepares at once on a connection that has not read the server's stream limit yet, as
    # a node starting 64 pods does: a per-connection limit of 16 refused some (REFUSED_STREAM).
    start_plugin()
    with channel(paths(short_root).dra) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        calls = [
            stub.NodePrepareResources.future(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=TIMEOUT_S
            )
            for _ in range(64)
        ]
        answers = [call.result() for call in calls]
    assert len(answers) == 64


def test_dra_socket_refuses_an_oversized_request(start_plugin: Any, short_root: Path) -> None:
    start_plugin()
    claims = [
        dra_v1_pb2.Claim(uid=f"{i:036d}", namespace="n" * 63, name="c" * 253)
        for i in range(grpcio_server.MAX_RECEIVE_MESSAGE_BYTES // 300)
    ]
    request = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
    assert request.ByteSize() > grpcio_server.MAX_RECEIVE_MESSAGE_BYTES
    with channel(paths(short_root).dra) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        with pytest.raises(grpc.RpcError) as refused:
            stub.NodePrepareResources(request, timeout=TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a request well within the limit on the same channel still succeeds
        small = dra_v1_pb2.NodePrepareResourcesRequest(claims=claims[:1000])
        assert small.ByteSize() < grpcio_server.MAX_RECEIVE_MESSAGE_BYTES
        assert stub.NodePrepareResources(small, timeout=TIMEOUT_S) is not None


def test_readyz_waits_for_registration_and_healthz_does_not() -> None:
    registered = threading.Event()
    server = healthz.HealthzServer(
        address="127.0.0.1",
        port=0,
        live=lambda: None,
        ready=lambda: None if registered.is_set() else "not registered with the kubelet yet",
    )
    server.start()
    try:
        assert _probe(server.port, "/healthz") == (200, "ok")
        assert _probe(server.port, "/readyz") == (503, "not registered with the kubelet yet")
        registered.set()
        assert _probe(server.port, "/readyz") == (200, "ok")
    finally:
        server.stop()


def prepare_state(root: Path, *extra: str) -> DeviceState:
    """The plugin's own prepare state (no claims: the API is never asked)."""
    settings = make_settings(root, "--state-dir", str(root / "state"), *extra)
    unused = KubeClient(Transport("http://127.0.0.1:9"), auth=credentials.StaticToken())
    return lifecycle.device_state(
        settings,
        platform=lifecycle.platform_of(settings),
        client=unused,
        inventory=lambda: {},
        poster=events.EventPoster(unused),
    )


def test_rolling_update_calls_wait_for_the_node_wide_lock(
    start_plugin: Any, short_root: Path
) -> None:
    uid = "pod-a"  # short: unix socket paths are limited to 107 bytes
    start_plugin("--pod-uid", uid, state=prepare_state(short_root, "--pod-uid", uid))
    p = paths(short_root, "--pod-uid", uid)
    prepare = dra_v1_pb2.NodePrepareResourcesRequest()
    unprepare = dra_v1_pb2.NodeUnprepareResourcesRequest()
    with channel(p.dra) as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        with call_lock.held(p.lock):
            calls: list[Callable[[], object]] = [
                lambda: stub.NodePrepareResources(prepare, timeout=0.5),
                lambda: stub.NodeUnprepareResources(unprepare, timeout=0.5),
            ]
            for blocked_call in calls:
                with pytest.raises(grpc.RpcError) as blocked:
                    blocked_call()
                assert blocked.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert stub.NodePrepareResources(prepare, timeout=TIMEOUT_S) is not None
        assert stub.NodeUnprepareResources(unprepare, timeout=TIMEOUT_S) is not None


def test_single_instance_calls_do_not_wait_for_the_lock(
    start_plugin: Any, short_root: Path
) -> None:
    start_plugin(state=prepare_state(short_root))
    p = paths(short_root)
    with channel(p.dra) as ch, call_lock.held(p.lock):
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        reply = stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(), timeout=TIMEOUT_S
        )
        assert reply is not None


def test_checkpoint_of_a_newer_release_stops_the_start(
    short_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The prepare side is loaded only once the publisher runs; its refusal still ends the start.
    (short_root / "state").mkdir()
    checkpoint = short_root / "state" / "checkpoint.json"
    checkpoint.write_text('{"version": 99, "compatible_version": 99, "claims": {}}')
    kubeconfig = short_root / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    settings = make_settings(
        short_root,
        *("--state-dir", str(short_root / "state"), "--simulate", "h200x8"),
        *("--kubeconfig", str(kubeconfig)),
    )
    assert plugin_main.serve(settings, threading.Event()) == 1
    assert any("needs a plugin that reads schema 99" in r.getMessage() for r in caplog.records)
    assert checkpoint.read_text().startswith('{"version": 99'), "the file is left as it was"


def test_stop_removes_both_sockets(start_plugin: Any, short_root: Path) -> None:
    plugin = start_plugin()
    p = paths(short_root)
    assert p.registration.exists() and p.dra.exists()
    plugin.stop()
    assert not p.registration.exists() and not p.dra.exists()


def test_two_rolling_update_instances_serve_side_by_side(
    start_plugin: Any, short_root: Path
) -> None:
    start_plugin("--pod-uid", "uid-old")
    start_plugin("--pod-uid", "uid-new")
    for uid in ("uid-old", "uid-new"):
        p = paths(short_root, "--pod-uid", uid)
        assert p.registration.name == f"gpu.nvidia.com-{uid}-reg.sock"
        assert get_info(p.registration).endpoint == str(p.dra)
        with channel(p.dra) as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
            stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=TIMEOUT_S)


def test_older_rolling_update_instance_stands_by_until_the_newer_one_is_gone(
    short_root: Path,
) -> None:
    # Two versions publishing different devices for one pool: the newer one's slices stay; once
    # it has stopped (its registration socket gone), the older one publishes again.
    store = FakeSliceStore()

    def plugin(uid: str, profile: str, started_ns: int) -> node_plugin.NodePlugin:
        return node_plugin.NodePlugin(
            make_settings(short_root, "--pod-uid", uid),
            store=store,
            devices=inventory.discover(
                inventory.backend_for(platforms.for_node(simulate=profile, node_name=NODE))
            ),
            instance=slice_plan.Instance(started_ns, uid),
        )

    def products() -> set[object]:
        return {
            d["attributes"]["productName"]["string"]
            for s in store.slices.values()
            for d in s["spec"]["devices"]
        }

    # The old instance's publisher is driven by hand (its threads never run), so each pass is
    # one deterministic step; the new one runs for real, sockets and all.
    old = plugin("uid-old", "a100x4-mig", 1)
    new = plugin("uid-new", "h200x8", 2)
    old.publisher.reconcile_once()
    assert products() == {"NVIDIA A100-SXM4-40GB"}
    try:
        start_serving(new)
        assert new.publisher.wait_synced(TIMEOUT_S)
        assert old.publisher.reconcile_once().standby_for == slice_plan.Instance(2, "uid-new")
        assert products() == {"NVIDIA H200"}
    finally:
        new.stop()
    assert old.publisher.reconcile_once().standby_for is None
    assert products() == {"NVIDIA A100-SXM4-40GB"}


def test_a_socket_accepts_only_while_its_server_listens(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    assert sockets.accepts(path)
    server.close()  # the file stays behind, as after a crash
    assert path.is_socket() and not sockets.accepts(path)
    (tmp_path / "plain").write_text("")
    assert not sockets.accepts(tmp_path / "plain")


def test_a_drivers_liveness_check_fails_healthz_naming_its_reason(
    start_plugin: Any, short_root: Path
) -> None:
    """The kit's liveness carries the driver's own reason to be restarted (a driver upgraded
    under the plugin: driver_outage.restart_needed), so the kubelet restarts the pod."""
    plugin = start_plugin()
    reason: list[str] = []
    plugin.watch_liveness(lambda: reason[0] if reason else None)
    assert plugin.problem() is None
    reason.append("the NVML library this process loaded does not match the kernel driver")
    assert plugin.problem() == reason[0]
