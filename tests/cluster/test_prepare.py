"""Prepare and unprepare against the real API server and scheduler, the test acting as kubelet.

A simulated node (``a100x4-mig``: one full GPU, nine MIG devices) runs the real kubelet plugin
process, which publishes its ResourceSlices. Pods with ResourceClaimTemplates are scheduled onto
it by the real scheduler (the resourceclaim controller creates the claims, the scheduler
allocates them). The test then does what the kubelet would: NodePrepareResources with the pod's
claims on the plugin's DRA socket.

Cases:
- prepare returns per device the allocated request, pool, device and CDI IDs; the CDI spec files
  are valid for our validator and for the reference Go CDI library; the claim's opaque config
  reaches the container environment; v1beta1 repeats the same answer; unprepare removes the
  specs and the checkpoint entries, twice without error;
- a GpuConfig that names a MIG request fails prepare, naming the config and the device: the
  scheduler's copy of the claim's config in the allocation has no ``requests`` (1.37.2), and read
  from there the config looked claim-wide and was passed over for the default;
- crash safety: the plugin SIGKILLed (``crash_plugin.py``) at each step of prepare and unprepare,
  restarted, and the call repeated: it succeeds, exactly the expected spec files exist, no temp
  file is left, the checkpoint loads with the expected state.
"""

from __future__ import annotations

import functools
import json
import shutil
import signal
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from dra_gpu.prepare import cdi
from dra_gpu.prepare.cdi_validate import validate_spec
from dra_gpu.prepare.checkpoint import PREPARE_COMPLETED, CheckpointStore
from dra_gpu.prepare.state import FAULT_STEPS
from e2e import cdi_validator, procs, waiting
from e2e.cluster import SIMULATED_TOLERATION, Cluster
from e2e.cluster.device_classes import builtin_device_classes
from e2e.driver import PluginDirs, plugin_argv
from e2e.kube_json import as_body

DRIVER = "gpu.nvidia.com"
API = "resource.nvidia.com/v1beta1"
WAIT_S = 90.0  # bounds a broken test only
RPC_TIMEOUT_S = 30


wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S)


@dataclass
class Plugin:
    proc: Any
    port: int
    log: Path

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False


class Node:
    """The simulated node: its directories and its plugin process (restartable)."""

    def __init__(self, cluster: Cluster, name: str, root: Path) -> None:
        self.cluster, self.name, self.root = cluster, name, root
        self.plugin: Plugin | None = None

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def socket(self) -> Path:
        return self.root / "data" / "dra.sock"

    def start(self, *, fault: str | None = None) -> Plugin:
        (port,) = procs.free_ports(1)
        argv = plugin_argv(
            node_name=self.name,
            kubeconfig=self.cluster.kubeconfig,
            profile="a100x4-mig",
            dirs=PluginDirs.under(self.root),
            healthz_port=port,
        )
        env = {"PATH": "/usr/bin:/bin"}
        if fault:
            assert argv[1:3] == ["-m", "dra_gpu"]
            argv[1:3] = [str(Path(__file__).with_name("crash_plugin.py")), fault]
        log = self.root / "plugin.log"
        self.plugin = Plugin(procs.spawn(argv, log_path=log, env=env), port, log)
        plugin = self.plugin
        wait_for(
            "the plugin's /healthz", lambda: plugin.proc.poll() is not None or plugin.healthy()
        )
        assert plugin.proc.poll() is None, log.read_text()[-3000:]
        return plugin

    def stop(self) -> None:
        if self.plugin is not None:
            procs.stop(self.plugin.proc)
            self.plugin = None

    def specs(self) -> dict[str, Path]:
        return {str(uid): path for uid, path in cdi.list_specs(self.cdi_root).items()}


def pod_body(name: str, template: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [dict(SIMULATED_TOLERATION)],  # the node is simulated
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
        },
    }


def template_body(
    name: str, device_class: str, count: int, config: dict[str, Any], requests: tuple[str, ...] = ()
) -> Any:
    named = {"requests": list(requests)} if requests else {}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpus",
                            "exactly": {"deviceClassName": device_class, "count": count},
                        }
                    ],
                    "config": [{**named, "opaque": {"driver": DRIVER, "parameters": config}}],
                }
            }
        },
    }


@dataclass(frozen=True)
class Claim:
    uid: str
    namespace: str
    name: str
    results: tuple[tuple[str, str], ...]  # (request, device)

    def v1(self) -> Any:
        return dra_v1_pb2.Claim(uid=self.uid, namespace=self.namespace, name=self.name)

    def v1beta1(self) -> Any:
        return dra_v1beta1_pb2.Claim(uid=self.uid, namespace=self.namespace, name=self.name)


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[Node]:
    name = f"prep-{uuid.uuid4().hex[:6]}"
    cluster.register_node(name)
    root = Path(tempfile.mkdtemp(prefix="pp-"))  # short: unix socket paths <= 107 bytes
    n = Node(cluster, name, root)
    n.start()
    with builtin_device_classes(cluster):
        yield n
    n.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def claims(cluster: Cluster, node: Node) -> dict[str, Claim]:
    """Two pods scheduled by the real scheduler; their allocated claims by pod name."""
    from kubernetes import client

    api = cluster.api_client()
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    ns = node.name
    cluster.create_namespace(ns)
    gpu_config = {
        "apiVersion": API,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    mig_config = {
        "apiVersion": API,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    }
    for body in (
        template_body("one-gpu", "gpu.nvidia.com", 1, gpu_config),
        template_body("two-mig", "mig.nvidia.com", 2, mig_config),
    ):
        resource.create_namespaced_resource_claim_template(ns, body, _request_timeout=30)
    for pod, template in (("pod-gpu", "one-gpu"), ("pod-mig", "two-mig")):
        core.create_namespaced_pod(
            ns, as_body(pod_body(pod, template, node.name)), _request_timeout=30
        )
    out = {}
    for pod in ("pod-gpu", "pod-mig"):
        out[pod] = wait_for(
            f"{pod} scheduled with an allocated claim", functools.partial(_claim_of, api, ns, pod)
        )
    return out


def _claim_of(api: Any, ns: str, pod_name: str) -> Claim | None:
    from kubernetes import client

    pod = api.sanitize_for_serialization(
        client.CoreV1Api(api).read_namespaced_pod(pod_name, ns, _request_timeout=10)
    )
    statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
    if not pod["spec"].get("nodeName") or not statuses or not statuses[0].get("resourceClaimName"):
        return None
    name = statuses[0]["resourceClaimName"]
    claim = api.sanitize_for_serialization(
        client.ResourceV1Api(api).read_namespaced_resource_claim(name, ns, _request_timeout=10)
    )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    results = tuple((r["request"], r["device"]) for r in allocation["devices"]["results"])
    return Claim(claim["metadata"]["uid"], ns, name, results)


def prepare_v1(node: Node, *claims: Claim) -> Any:
    with grpc.insecure_channel(f"unix://{node.socket}") as channel:
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[c.v1() for c in claims])
        return dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            request, timeout=RPC_TIMEOUT_S
        )


def unprepare_v1(node: Node, *claims: Claim) -> dict[str, str]:
    with grpc.insecure_channel(f"unix://{node.socket}") as channel:
        request = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[c.v1() for c in claims])
        response = dra_v1_pb2_grpc.DRAPluginStub(channel).NodeUnprepareResources(
            request, timeout=RPC_TIMEOUT_S
        )
    return {uid: r.error for uid, r in response.claims.items()}


def answer(response: Any, claim: Claim) -> list[tuple[list[str], str, str, list[str]]]:
    entry = response.claims[claim.uid]
    assert entry.error == ""
    return [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in entry.devices
    ]


def expected(node: Node, claim: Claim) -> list[tuple[list[str], str, str, list[str]]]:
    return [
        ([request], node.name, device, [f"k8s.gpu.nvidia.com/claim={claim.uid}-{device}"])
        for request, device in claim.results
    ]


def test_prepare_and_unprepare_scheduled_claims(node: Node, claims: dict[str, Claim]) -> None:
    gpu, mig = claims["pod-gpu"], claims["pod-mig"]
    assert [d for _, d in gpu.results] == ["gpu-0"]
    assert len(mig.results) == 2 and all("-mig-" in d for _, d in mig.results)

    response = prepare_v1(node, gpu, mig)
    assert answer(response, gpu) == expected(node, gpu)
    assert answer(response, mig) == expected(node, mig)
    specs = node.specs()
    assert set(specs) == {gpu.uid, mig.uid}
    for path in specs.values():
        assert validate_spec(json.loads(path.read_text())) == []
    gpu_env = json.loads(specs[gpu.uid].read_text())["devices"][0]["containerEdits"]["env"]
    assert "GPU_DEVICE_0_TIMESLICE_INTERVAL=Long" in gpu_env
    mig_spec = json.loads(specs[mig.uid].read_text())
    second = mig_spec["devices"][1]
    prefix = cdi.env_prefix(second["name"].removeprefix(f"{mig.uid}-"))
    assert f"{prefix}_MPS_ACTIVE_THREAD_PERCENTAGE=50" in second["containerEdits"]["env"]

    with grpc.insecure_channel(f"unix://{node.socket}") as channel:
        again = dra_v1beta1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[gpu.v1beta1(), mig.v1beta1()]),
            timeout=RPC_TIMEOUT_S,
        )
    assert answer(again, gpu) == expected(node, gpu), "prepare twice gives the same answer"

    assert unprepare_v1(node, gpu, mig) == {gpu.uid: "", mig.uid: ""}
    assert node.specs() == {}
    assert CheckpointStore(node.state_dir).load().claims == {}
    assert unprepare_v1(node, gpu, mig) == {gpu.uid: "", mig.uid: ""}


def test_a_config_of_the_wrong_kind_naming_its_request_fails_prepare(
    cluster: Cluster, node: Node, claims: dict[str, Claim]
) -> None:
    from kubernetes import client

    api = cluster.api_client()
    ns = node.name
    wrong = {"apiVersion": API, "kind": "GpuConfig"}
    body = template_body("named-wrong-kind", "mig.nvidia.com", 1, wrong, requests=("gpus",))
    client.ResourceV1Api(api).create_namespaced_resource_claim_template(ns, body)
    pod = pod_body("pod-wrong-kind", "named-wrong-kind", node.name)
    client.CoreV1Api(api).create_namespaced_pod(ns, as_body(pod), _request_timeout=30)
    claim = wait_for(
        "pod-wrong-kind scheduled", functools.partial(_claim_of, api, ns, "pod-wrong-kind")
    )
    try:
        error = prepare_v1(node, claim).claims[claim.uid].error
        ((_, device),) = claim.results
        assert f"config[0] (FromClaim): a GpuConfig cannot configure {device}, which is a MIG" in (
            error
        ), error
        assert claim.uid not in node.specs()
    finally:
        client.CoreV1Api(api).delete_namespaced_pod("pod-wrong-kind", ns, grace_period_seconds=0)


def test_specs_are_valid_for_the_reference_cdi_library(
    node: Node, claims: dict[str, Claim]
) -> None:
    try:
        cdi_validator.ensure()
    except cdi_validator.ValidatorUnavailable as exc:  # runs or fails, never skips
        pytest.fail(f"reference CDI validator not available: {exc}")
    prepare_v1(node, *claims.values())
    try:
        specs = list(node.specs().values())
        assert len(specs) == 2
        assert cdi_validator.validate(specs) == []
    finally:
        unprepare_v1(node, *claims.values())


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_sigkill_at_each_step_then_restart(node: Node, claims: dict[str, Claim], step: str) -> None:
    claim = claims["pod-mig"]
    unprepare = step.startswith("unprepare")
    node.stop()
    plugin = node.start(fault=step)
    try:
        if unprepare:
            assert answer(prepare_v1(node, claim), claim) == expected(node, claim)
        with pytest.raises(grpc.RpcError):
            (unprepare_v1 if unprepare else prepare_v1)(node, claim)
        assert plugin.proc.wait(timeout=30) == -signal.SIGKILL
        assert f"SIGKILL at {step}" in plugin.log.read_text()
    finally:
        node.stop()
    node.start()
    if unprepare:
        assert unprepare_v1(node, claim) == {claim.uid: ""}
        assert node.specs() == {}
        assert CheckpointStore(node.state_dir).load().claims == {}
    else:
        assert answer(prepare_v1(node, claim), claim) == expected(node, claim)
        assert set(node.specs()) == {claim.uid}
        records = CheckpointStore(node.state_dir).load().claims
        assert {u: r.state for u, r in records.items()} == {claim.uid: PREPARE_COMPLETED}
        assert unprepare_v1(node, claim) == {claim.uid: ""}
    assert [p.name for p in node.cdi_root.iterdir() if p.name.startswith(".")] == []


def test_corrupt_checkpoint_is_an_event_on_the_node_and_serving_goes_on(
    cluster: Cluster, node: Node, claims: dict[str, Claim]
) -> None:
    from kubernetes import client

    claim = claims["pod-gpu"]
    node.stop()
    (node.state_dir / "checkpoint.json").write_text('{"version": 2, "claims": {"x": ')
    node.start()
    events = client.CoreV1Api(cluster.api_client())

    def corrupt_event() -> Any:
        listed = events.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node.name}", _request_timeout=10
        )
        return [e for e in listed.items if e.reason == "CheckpointCorrupt"]

    [event] = wait_for("a CheckpointCorrupt event on the node", corrupt_event)
    assert event.type == "Warning" and event.involved_object.kind == "Node"
    assert "moved aside to" in event.message
    assert len(list(node.state_dir.glob("checkpoint.json.corrupt-*"))) == 1
    assert answer(prepare_v1(node, claim), claim) == expected(node, claim)
    assert unprepare_v1(node, claim) == {claim.uid: ""}
