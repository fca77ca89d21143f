"""Consumable shares against the real API server and the real scheduler, the test acting as
kubelet.

A simulated node with one H200 (143,771 MiB published) runs the real kubelet plugin with
``--consumable-shares memory --mps-support true``; the test prepares the allocated claims on the
plugin's DRA socket as the kubelet would.

Cases:
- the slices of every share mode (memory, unlimited, an integer; full GPUs, static MIG devices,
  dynamic-MIG partitions with counters) pass the API server's validation unchanged;
- three claims of 40Gi are all placed on the one GPU with distinct shareIDs, each consuming
  40Gi; a fourth stays Pending with the scheduler's reason (20Gi are left), and is allocated
  once one of the three is gone;
- each prepared share gets an MPS daemon of its own whose pinned-memory limit is its consumed
  memory (recorded commands on the simulated node); unprepare stops exactly that one;
- ``dra-gpu explain`` of the pending claim agrees with the scheduler and names what is left;
- on a node in NVIDIA's integer mode (``--consumable-shares 2``) claims that ask for nothing,
  as written for NVIDIA's driver, take one share each: two on the GPU, the third Pending.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

import dra_gpu
from dra_gpu.controller import classes as device_classes
from dra_gpu.devices import naming, partitions, shares, simulated
from dra_gpu.explain import analysis
from dra_gpu.kube.objects import DeviceClassSpec, ResourceClaim
from dra_gpu.kubeletplugin import slices
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from dra_gpu.prepare.sharing import mps
from dra_gpu.prepare.sharing.applied import recording_path
from e2e import procs, waiting
from e2e.cluster import SIMULATED_TOLERATION, Cluster
from e2e.cluster.device_classes import builtin_device_classes
from e2e.driver import PluginDirs, plugin_argv
from e2e.images.node_images import TEST_IMAGE

WAIT_S = 90.0  # bounds a broken test only
wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S)
PROFILE = {"gpus": [{"product": "H200-141GB"}]}
GI = 1024**3


def json_documents(text: str) -> list[dict[str, Any]]:
    decoder, docs, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        docs.append(obj)
    return docs


def dry_run(cluster: Cluster, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    doc = {"apiVersion": "v1", "kind": "List", "items": objs}
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(doc)
    )
    return [item for obj in json_documents(out) for item in obj.get("items", [obj])]


@pytest.mark.parametrize("mode", ["memory", "unlimited", "1", "4"])
@pytest.mark.parametrize("profile", ["h200x8", "a100x4-mig", "h100x8-mig-dynamic", "many"])
def test_shared_slices_pass_validation(cluster: Cluster, mode: str, profile: str) -> None:
    name = f"shares-{profile}"
    share_mode = shares.parse_mode(mode, compute=True)
    assert share_mode is not None
    if profile == "h100x8-mig-dynamic":
        backend = simulated.SimulatedBackend(
            profile=simulated.BUILTIN_PROFILES["h100x8-mig"], node_name=name
        )
        gpus = partitions.DynamicMigBackend(backend).discover().gpus
    elif profile == "many":  # 16 GPUs: 128 devices fit one slice only without the 64 rule
        backend = simulated.SimulatedBackend(
            profile=simulated.BUILTIN_PROFILES["h200x8"], node_name=name
        )
        one = backend.discover().gpus
        gpus = tuple(replace(g, minor=g.minor + 8 * k) for k in range(16) for g in one)
    else:
        backend = simulated.SimulatedBackend(
            profile=simulated.BUILTIN_PROFILES[profile], node_name=name
        )
        gpus = backend.discover().gpus
    devices = shares.shared(naming.build_devices(gpus), share_mode)
    ours = slices.build_resource_slices(
        devices=devices,
        driver_name=dra_gpu.DRIVER_NAME,
        node_name=name,
        pool_generation=1,
        node_owner=None,
    )
    stored = dry_run(cluster, ours)
    assert [s["spec"].get("devices") for s in stored] == [s["spec"].get("devices") for s in ours]
    assert all(d["allowMultipleAllocations"] for s in stored for d in s["spec"].get("devices", []))


class Node:
    """A registered Node with a plugin in share mode and no kubelet."""

    def __init__(self, cluster: Cluster, name: str, root: Path, flags: tuple[str, ...]) -> None:
        self.cluster, self.name, self.root, self.flags = cluster, name, root, flags
        self.dirs = PluginDirs.under(root)
        self.profile = root / "h200.json"
        self.profile.write_text(json.dumps(PROFILE))
        self.proc: Any = None

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"

    @property
    def socket(self) -> Path:
        return self.dirs.data / "dra.sock"

    def start(self) -> None:
        argv = plugin_argv(
            node_name=self.name,
            kubeconfig=self.cluster.kubeconfig,
            profile=str(self.profile),
            dirs=self.dirs,
            extra=self.flags,
        )
        self.proc = procs.spawn(argv, log_path=self.log, env={"PATH": "/usr/bin:/bin"})
        wait_for(
            "the plugin's DRA socket", lambda: self.proc.poll() is not None or self.socket.exists()
        )
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None

    def call(self, method: str, claim: dict[str, Any]) -> str:
        ref = dra_v1_pb2.Claim(
            uid=claim["metadata"]["uid"],
            namespace=claim["metadata"]["namespace"],
            name=claim["metadata"]["name"],
        )
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            if method == "prepare":
                request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref])
                return str(stub.NodePrepareResources(request, timeout=30).claims[ref.uid].error)
            unprepare = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref])
            return str(stub.NodeUnprepareResources(unprepare, timeout=30).claims[ref.uid].error)

    def commands(self) -> list[dict[str, Any]]:
        path = recording_path(self.dirs.state)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def template(memory: str | None) -> dict[str, Any]:
    """A claim for one GPU, asking ``memory`` of it (None: nothing, as NVIDIA's examples)."""
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"share-{(memory or 'any').lower()}"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod(name: str, node: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            # The harness taints nodes without a kubelet; these pods are placed, never run.
            "tolerations": [dict(SIMULATED_TOLERATION)],
            "containers": [
                {
                    "name": "ctr",
                    "image": TEST_IMAGE,
                    "command": ["true"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
        },
    }


def started(cluster: Cluster, flags: tuple[str, ...], memory: str | None) -> Node:
    name = f"shares-{uuid.uuid4().hex[:6]}"
    cluster.register_node(name)
    cluster.create_namespace(name)
    root = Path(tempfile.mkdtemp(prefix="sh-"))  # short: unix socket paths <= 107 bytes
    n = Node(cluster, name, root, flags)
    n.start()
    cluster.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(template(memory)))
    return n


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[Node]:
    n = started(cluster, ("--consumable-shares", "memory", "--mps-support", "true"), "40Gi")
    yield from _serving(n)


@pytest.fixture(scope="module")
def two_shares_node(cluster: Cluster) -> Iterator[Node]:
    n = started(cluster, ("--consumable-shares", "2"), None)
    yield from _serving(n)


def _serving(n: Node) -> Iterator[Node]:
    cluster, name, root = n.cluster, n.name, n.root
    try:
        with builtin_device_classes(cluster):
            yield n
    finally:
        n.stop()
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        cluster.unregister_node(name)
        shutil.rmtree(root, ignore_errors=True)


def get(node: Node, kind: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        node.cluster.kubectl("get", "-n", node.name, kind, name, "-o", "json")
    )
    return out


def allocated_claim(node: Node, pod_name: str) -> dict[str, Any] | None:
    body = get(node, "pod", pod_name)
    statuses = body.get("status", {}).get("resourceClaimStatuses") or []
    if not body["spec"].get("nodeName") or not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = get(node, "resourceclaim", statuses[0]["resourceClaimName"])
    return claim if claim.get("status", {}).get("allocation") else None


def create_pod(node: Node, name: str, template_name: str = "share-40gi") -> None:
    body = pod(name, node.name, template_name)
    node.cluster.kubectl("create", "-n", node.name, "-f", "-", input=json.dumps(body))


def unschedulable(node: Node, pod_name: str) -> str | None:
    for c in get(node, "pod", pod_name).get("status", {}).get("conditions") or []:
        if (c["type"], c["status"], c.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return str(c.get("message", ""))
    return None


def result_of(claim: dict[str, Any]) -> dict[str, Any]:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def daemon_limits(node: Node) -> dict[str, list[str]]:
    """MPS daemon directory (the claim's key) -> the limits sent to it, as recorded."""
    out: dict[str, list[str]] = {}
    for command in node.commands():
        pipe = (command.get("env") or {}).get("CUDA_MPS_PIPE_DIRECTORY", "")
        stdin = command.get("stdin") or ""
        if pipe and "set_default" in stdin:
            out.setdefault(Path(pipe).parent.name, []).extend(
                line for line in stdin.splitlines() if line.startswith("set_default")
            )
    return out


def test_three_40gi_shares_on_one_h200_and_a_fourth_pending(node: Node) -> None:
    names = ["a", "b", "c"]
    for name in names:
        create_pod(node, name)
    claims = {
        n: wait_for(f"{n} allocated", functools.partial(allocated_claim, node, n)) for n in names
    }
    results = {n: result_of(c) for n, c in claims.items()}
    assert {r["device"] for r in results.values()} == {"gpu-0"}
    assert len({r["shareID"] for r in results.values()}) == 3
    assert all(r["consumedCapacity"]["memory"] == "40Gi" for r in results.values())

    create_pod(node, "d")
    reason = wait_for(
        "the fourth 40Gi pod unschedulable", functools.partial(unschedulable, node, "d")
    )
    print(f"scheduler's reason for the fourth 40Gi claim: {reason}")
    assert "cannot allocate all claims" in reason, reason
    # explain agrees with the scheduler, and says what is left: 143771Mi - 3 x 40Gi.
    report = explain_pending(node, "d")
    assert report.fits == [], report
    assert any("the most any matching device has left is 20891Mi" in s for s in report.suggestions)

    for name, claim in claims.items():
        assert node.call("prepare", claim) == "", (name, node.log.read_text()[-3000:])
    limits = daemon_limits(node)
    # The daemon directory is named by the claim's key, not its UID (socket path length).
    keys = {n: mps.claim_key(c["metadata"]["uid"]) for n, c in claims.items()}
    for name in names:
        assert limits[keys[name]] == ["set_default_device_pinned_mem_limit 0 40960M"], limits
    specs = sorted(p.name for p in node.dirs.cdi_root.glob("*.json"))
    assert len(specs) == 3, specs

    # One share goes: exactly its daemon stops, and the fourth claim gets its 40Gi.
    assert node.call("unprepare", claims["a"]) == ""
    quits = [
        Path(c["env"]["CUDA_MPS_PIPE_DIRECTORY"]).parent.name
        for c in node.commands()
        if (c.get("stdin") or "").strip() == "quit"
    ]
    assert quits == [keys["a"]]
    node.cluster.kubectl("delete", "-n", node.name, "pod", "a", "--grace-period=0", "--force")
    fourth = wait_for(
        "the fourth allocated once a share is free",
        functools.partial(allocated_claim, node, "d"),
    )
    assert result_of(fourth)["device"] == "gpu-0"
    assert node.call("prepare", fourth) == ""
    for claim in (claims["b"], claims["c"], fourth):
        assert node.call("unprepare", claim) == ""


def explain_pending(node: Node, pod_name: str) -> analysis.Report:
    """``dra-gpu explain`` of the pod's claim, over what the API server holds now."""
    body = get(node, "pod", pod_name)
    claim_name = body["status"]["resourceClaimStatuses"][0]["resourceClaimName"]

    def listed(kind: str, *namespaced: str) -> list[Any]:
        out = json.loads(node.cluster.kubectl("get", kind, *namespaced, "-o", "json"))
        return list(out["items"])

    classes = {
        c.name: cast(DeviceClassSpec, c.spec)
        for c in device_classes.builtin_classes(extended_resource_name=None)
    }
    return analysis.explain_claim(
        cast(ResourceClaim, get(node, "resourceclaim", claim_name)),
        classes=classes,
        # This node's slices only: the session's cluster also holds other tests' nodes, whose
        # GPUs would fit the claim (explain is asked about this node's shares).
        slices=[s for s in listed("resourceslices") if s["spec"].get("nodeName") == node.name],
        claims=listed("resourceclaims", "-A"),
    )


def test_claims_written_for_nvidias_integer_mode_take_one_share_each(
    two_shares_node: Node,
) -> None:
    node = two_shares_node
    for name in ("x", "y", "z"):
        create_pod(node, name, "share-any")
    claims = {
        n: wait_for(f"{n} allocated", functools.partial(allocated_claim, node, n))
        for n in ("x", "y")
    }
    results = [result_of(c) for c in claims.values()]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-0"]
    assert [r["consumedCapacity"] for r in results] == [{"memory": "0", "shares": "1"}] * 2
    reason = wait_for("the third unschedulable", functools.partial(unschedulable, node, "z"))
    assert "cannot allocate all claims" in reason, reason
    for claim in claims.values():
        assert node.call("prepare", claim) == ""
        assert node.call("unprepare", claim) == ""
