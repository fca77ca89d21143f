"""Dynamic MIG against the real API server and the real scheduler, the test acting as kubelet.

A simulated node with one H100 in MIG mode runs the real kubelet plugin with
``--mig-mode=dynamic``: it publishes a counter slice and 25 partitions. Pods with
ResourceClaimTemplates are allocated by the real scheduler (the API server's validation judges
the slices, the scheduler's counter accounting decides what fits); the test then prepares the
claims on the plugin's DRA socket as the kubelet would, and checks the MIG devices the plugin
created on the simulated GPU.

Cases (one scenario, in order, on one GPU):
- the slices of 8 partitionable H100s (200 devices, counters in a slice of their own) pass the
  API server's validation unchanged (server-side dry run);
- seven ``1g`` claims fill the GPU, each prepared as its own MIG device, no two overlapping;
  the eighth stays Pending with the scheduler's reason;
- deleting the seven pods frees the placements: the eighth is then allocated; after it is gone,
  a ``3g`` + ``2g`` + ``1g`` + ``1g`` mix is allocated and prepared without overlap;
- a plugin SIGKILLed between creating the MIG device and completing the checkpoint leaves no
  orphan: the restarted plugin destroys it, and the kubelet's retry creates it again.

Binding conditions (KEP-5007; the harness's 1.37 serves them, so every pod above already went
through them):
- the plugin publishes its partitions with ``gpu.nvidia.com/mig-created`` /
  ``gpu.nvidia.com/mig-failed``; a ``1g`` pod waits in PreBind (its ``BindingConditionsPending``
  event), the plugin creates the MIG device before any prepare and reports ``mig-created`` True
  in the claim's ``status.devices``, no later than the pod is bound; the prepare that follows
  finds the device made (one instance);
- the simulated GPU refuses the first placement the scheduler picks (an instance the driver did
  not make sits on it): the plugin reports ``mig-failed`` True and taints that device, the
  scheduler allocates the claim again, to the other ``3g`` placement, the pod binds and is
  prepared; nothing of the failed attempt is left on the GPU.
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
from pathlib import Path
from typing import Any

import grpc
import pytest

import dra_gpu
from dra_gpu.devices import migprofiles, naming, partitions, profiles, simulated
from dra_gpu.kubeletplugin import slices
from dra_gpu.mig.dynamic import SIMULATED_STATE_NAME
from dra_gpu.mig.instances import MigInstance, SimulatedInstances
from dra_gpu.pb import dra_v1_pb2, dra_v1_pb2_grpc
from e2e import mig_manifests, procs, waiting
from e2e.cluster import Cluster
from e2e.cluster.device_classes import builtin_device_classes
from e2e.driver import PluginDirs, plugin_argv

WAIT_S = 90.0  # bounds a broken test only
wait_for = functools.partial(waiting.wait_for, timeout=WAIT_S)
PROFILE = {"gpus": [{"product": "H100-80GB", "mig": {"enabled": True}}]}
READY = "gpu.nvidia.com/mig-created"
FAILED = "gpu.nvidia.com/mig-failed"


class Node:
    """A registered Node with a dynamic-MIG plugin (restartable) and no kubelet."""

    def __init__(self, cluster: Cluster, name: str, root: Path) -> None:
        self.cluster, self.name, self.root = cluster, name, root
        self.dirs = PluginDirs.under(root)
        self.profile = root / "h100-mig.json"
        self.profile.write_text(json.dumps(PROFILE))
        self.proc: Any = None

    @property
    def log(self) -> Path:
        return self.root / "plugin.log"

    def start(self, *, fault: str | None = None) -> None:
        argv = plugin_argv(
            node_name=self.name,
            kubeconfig=self.cluster.kubeconfig,
            profile=str(self.profile),
            dirs=self.dirs,
            extra=("--mig-mode", "dynamic"),
        )
        env = {"PATH": "/usr/bin:/bin"}
        if fault:  # through the crash tests' launcher: the shipped program has no failpoints
            assert argv[1:3] == ["-m", "dra_gpu"], argv
            argv[1:3] = [str(Path(__file__).with_name("crash_plugin.py")), fault]
        self.proc = procs.spawn(argv, log_path=self.log, env=env)
        wait_for(
            "the plugin's DRA socket", lambda: self.proc.poll() is not None or self.socket.exists()
        )
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None

    @property
    def socket(self) -> Path:
        return self.dirs.data / "dra.sock"

    def instances(self) -> list[MigInstance]:
        path = self.dirs.state / SIMULATED_STATE_NAME
        if not path.exists():
            return []
        data: dict[str, list[dict[str, Any]]] = json.loads(path.read_text())
        return [MigInstance(**i) for items in data.values() for i in items]

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


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[Node]:
    name = f"dmig-{uuid.uuid4().hex[:6]}"
    cluster.register_node(name)
    cluster.create_namespace(name)
    root = Path(tempfile.mkdtemp(prefix="dm-"))  # short: unix socket paths <= 107 bytes
    n = Node(cluster, name, root)
    n.start()
    for profile in ("1g.10gb", "2g.20gb", "3g.40gb"):
        cluster.kubectl("apply", "-n", name, "-f", "-", input=json.dumps(template(profile)))
    try:
        with builtin_device_classes(cluster):
            yield n
    finally:
        n.stop()
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
        cluster.unregister_node(name)
        shutil.rmtree(root, ignore_errors=True)


def template(profile: str) -> dict[str, Any]:
    return mig_manifests.claim_template(profile.replace(".", "-"), profile)


def create_pod(node: Node, name: str, profile: str) -> None:
    pod = mig_manifests.pod(name, node.name, template=profile.replace(".", "-"))
    node.cluster.kubectl("create", "-n", node.name, "-f", "-", input=json.dumps(pod))


def get(node: Node, kind: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        node.cluster.kubectl("get", "-n", node.name, kind, name, "-o", "json")
    )
    return out


def allocated_claim(node: Node, pod: str) -> dict[str, Any] | None:
    body = get(node, "pod", pod)
    statuses = body.get("status", {}).get("resourceClaimStatuses") or []
    if not body["spec"].get("nodeName") or not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = get(node, "resourceclaim", statuses[0]["resourceClaimName"])
    return claim if claim.get("status", {}).get("allocation") else None


def device_of(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def schedule_and_prepare(node: Node, pods: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Pod name -> its allocated claim, prepared on the node."""
    for pod, profile in pods.items():
        create_pod(node, pod, profile)
    claims = {
        pod: wait_for(f"{pod} allocated", functools.partial(allocated_claim, node, pod))
        for pod in pods
    }
    for pod, claim in claims.items():
        assert node.call("prepare", claim) == "", pod
    return claims


def delete_pods(node: Node, claims: dict[str, dict[str, Any]]) -> None:
    for claim in claims.values():
        assert node.call("unprepare", claim) == ""
    node.cluster.kubectl("delete", "-n", node.name, "pod", *claims, "--grace-period=0", "--force")

    def gone() -> bool:
        names = {c["metadata"]["name"] for c in claims.values()}
        listed = json.loads(
            node.cluster.kubectl("get", "-n", node.name, "resourceclaims", "-o", "json")
        )
        return not names & {c["metadata"]["name"] for c in listed["items"]}

    wait_for("the pods' claims deleted", gone)


def no_overlap(instances: list[MigInstance]) -> bool:
    layout = [(i.profile, i.start) for i in instances]
    return not migprofiles.layout_errors(migprofiles.H100_80GB, layout)


def json_documents(text: str) -> list[dict[str, Any]]:
    """kubectl prints one JSON document per object it created."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        obj, at = decoder.raw_decode(text, at)
        docs.append(obj)
    return docs


def test_slices_of_eight_partitionable_gpus_pass_validation(cluster: Cluster) -> None:
    name = "dmig-dry-run"
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["h100x8-mig"], node_name=name
    )
    devices = naming.build_devices(partitions.DynamicMigBackend(backend).discover().gpus)
    ours = slices.build_resource_slices(
        devices=devices,
        driver_name=dra_gpu.DRIVER_NAME,
        node_name=name,
        pool_generation=1,
        node_owner=None,
    )
    doc = {"apiVersion": "v1", "kind": "List", "items": ours}
    out = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(doc)
    )
    stored = [item for obj in json_documents(out) for item in obj.get("items", [obj])]
    assert [s["spec"].get("sharedCounters") for s in stored] == [
        s["spec"].get("sharedCounters") for s in ours
    ]
    assert [s["spec"].get("devices") for s in stored] == [s["spec"].get("devices") for s in ours]


def test_the_scheduler_fills_frees_and_mixes_partitions(node: Node) -> None:
    ones = schedule_and_prepare(node, {f"one-{i}": "1g.10gb" for i in range(7)})
    assert sorted(device_of(c) for c in ones.values()) == [
        f"gpu-0-mig-1g10gb-19-{s}" for s in range(7)
    ]
    made = node.instances()
    assert len(made) == 7 and no_overlap(made)

    create_pod(node, "eighth", "1g.10gb")

    def unschedulable() -> str | None:
        conditions = get(node, "pod", "eighth").get("status", {}).get("conditions") or []
        for c in conditions:
            if (
                c["type"] == "PodScheduled"
                and c["status"] == "False"
                and c.get("reason") == "Unschedulable"
            ):
                return str(c.get("message", ""))
        return None

    reason = wait_for("the eighth 1g pod unschedulable", unschedulable)
    print(f"scheduler's reason for the eighth 1g claim: {reason}")
    assert "cannot allocate all claims" in reason, reason

    delete_pods(node, ones)
    assert node.instances() == []
    eighth = wait_for(
        "the eighth allocated once the others are gone",
        functools.partial(allocated_claim, node, "eighth"),
    )
    assert node.call("prepare", eighth) == ""
    delete_pods(node, {"eighth": eighth})

    mix = schedule_and_prepare(
        node, {"three": "3g.40gb", "two": "2g.20gb", "one-a": "1g.10gb", "one-b": "1g.10gb"}
    )
    made = node.instances()
    assert sorted(i.profile for i in made) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    assert no_overlap(made)
    assert {device_of(c) for c in mix.values()} == {
        f"gpu-0-mig-{i.profile.replace('.', '')}-{i.gi_profile_id}-{i.start}" for i in made
    }

    # SIGKILL between creating the MIG device and completing the checkpoint, then restart.
    victim = mix["one-a"]
    assert node.call("unprepare", victim) == ""
    node.stop()
    node.start(fault="after-mig-created")
    with pytest.raises(grpc.RpcError):
        node.call("prepare", victim)
    assert node.proc.wait(timeout=30) == -signal.SIGKILL
    assert len(node.instances()) == 4  # the orphan the kill left behind
    node.proc = None
    node.start()
    wait_for("the orphan destroyed at start", lambda: len(node.instances()) == 3)
    assert "MIG device" in node.log.read_text() and "destroyed" in node.log.read_text()
    # The kubelet's retry, once the restarted plugin serves (its DRA socket comes up after
    # /healthz and the start-up recovery).
    wait_for(
        "the repeated prepare answered",
        lambda: node.call("prepare", victim) == "",
        retry_on=(grpc.RpcError,),
    )
    assert len(node.instances()) == 4 and no_overlap(node.instances())
    delete_pods(node, mix)
    assert node.instances() == []


# --- binding conditions ------------------------------------------------------------------


def bound_claim(node: Node, pod: str) -> dict[str, Any] | None:
    """The pod's claim once the pod is bound to the node."""
    body = get(node, "pod", pod)
    statuses = body.get("status", {}).get("resourceClaimStatuses") or []
    if not body["spec"].get("nodeName") or not statuses:
        return None
    return get(node, "resourceclaim", statuses[0]["resourceClaimName"])


def conditions(claim: dict[str, Any], device: str) -> dict[str, dict[str, Any]]:
    entries = [
        e
        for e in claim.get("status", {}).get("devices") or []
        if e["driver"] == "gpu.nvidia.com" and e["device"] == device
    ]
    return {c["type"]: c for e in entries for c in e.get("conditions") or []}


def scheduled_at(pod: dict[str, Any]) -> str:
    (scheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["status"] == "True"
    return str(scheduled["lastTransitionTime"])


def event_reasons(node: Node, pod: str) -> list[str]:
    listed = json.loads(
        node.cluster.kubectl(
            "get",
            "events",
            "-n",
            node.name,
            "--field-selector",
            f"involvedObject.name={pod}",
            "-o",
            "json",
        )
    )
    return [str(e.get("reason")) for e in listed["items"]]


def test_the_mig_device_is_made_before_the_pod_binds(node: Node) -> None:
    slices = json.loads(
        node.cluster.kubectl(
            "get", "resourceslices", "--field-selector", f"spec.nodeName={node.name}", "-o", "json"
        )
    )
    published = [d for s in slices["items"] for d in s["spec"].get("devices") or []]
    assert published and all(d.get("bindingConditions") == [READY] for d in published)
    assert all(d.get("bindingFailureConditions") == [FAILED] for d in published)

    create_pod(node, "early", "1g.10gb")
    claim = wait_for("the pod bound", functools.partial(bound_claim, node, "early"))
    device = device_of(claim)
    ready = conditions(claim, device)[READY]
    print(f"claim {claim['metadata']['name']} device {device}: {json.dumps(ready)}")
    assert ready["status"] == "True" and ready["reason"] == "MigDeviceCreated"
    pod = get(node, "pod", "early")
    assert ready["lastTransitionTime"] <= scheduled_at(pod)
    reasons = wait_for(
        "the scheduler's event",
        lambda: (r := event_reasons(node, "early")) and "BindingConditionsPending" in r and r,
    )
    print(f"pod events: {reasons}")
    (made,) = node.instances()  # made before any prepare (the test is the kubelet)
    assert made.uuid in ready["message"]
    assert node.call("prepare", claim) == ""
    assert node.instances() == [made]
    delete_pods(node, {"early": claim})
    assert node.instances() == []


def test_a_refused_placement_is_allocated_again_elsewhere(node: Node) -> None:
    backend = simulated.SimulatedBackend(
        profile=profiles.resolve_profile(str(node.profile)), node_name=node.name
    )
    found = partitions.DynamicMigBackend(backend).discover().gpus
    devices = {d.name: d for d in naming.build_devices(found)}
    # An instance the driver did not make, on memory slice 5: the GPU refuses the 3g at 4, the
    # first 3g placement the scheduler picks on an empty GPU.
    blocker = devices["gpu-0-mig-1g10gb-19-5"]
    assert blocker.partition is not None
    sim = SimulatedInstances(node.dirs.state / SIMULATED_STATE_NAME, node_name=node.name)
    theirs = sim.create(blocker.gpu, blocker.partition)

    create_pod(node, "refused", "3g.40gb")
    claim = wait_for("the pod bound", functools.partial(bound_claim, node, "refused"))
    assert device_of(claim) == "gpu-0-mig-3g40gb-9-0"
    assert conditions(claim, "gpu-0-mig-3g40gb-9-0")[READY]["status"] == "True"
    log = node.log.read_text()
    assert "gpu-0-mig-3g40gb-9-4 could not be created before binding" in log
    slices = json.loads(
        node.cluster.kubectl(
            "get", "resourceslices", "--field-selector", f"spec.nodeName={node.name}", "-o", "json"
        )
    )
    (refused,) = [
        d
        for s in slices["items"]
        for d in s["spec"].get("devices") or []
        if d["name"] == "gpu-0-mig-3g40gb-9-4"
    ]
    print(f"taint on the refused placement: {refused.get('taints')}")
    assert [t["key"] for t in refused.get("taints") or []] == [FAILED]
    made = [i for i in node.instances() if i != theirs]
    assert [(i.profile, i.start) for i in made] == [("3g.40gb", 0)]  # nothing of the 3g at 4
    assert node.call("prepare", claim) == ""
    assert sorted(node.instances(), key=_start) == sorted([theirs, *made], key=_start)
    delete_pods(node, {"refused": claim})
    assert node.instances() == [theirs]
    assert sim.destroy(theirs.gpu_uuid, theirs)


def _start(instance: MigInstance) -> int:
    return instance.start
