"""Dynamic MIG before the pod binds (KEP-5007 binding conditions, docs/concepts/dynamic-mig.md).

Cases:
- published: where binding conditions are served, every dynamic MIG device carries the
  ``mig-created`` binding condition and the ``mig-failed`` failure condition; the full GPUs and a
  static node's devices carry none; where not served, no device does;
- the binder: a claim allocated a dynamic MIG device here gets it created and
  ``mig-created`` True in its status.devices (an apply by its own field manager), before any
  prepare; prepare then finds it made (one instance, the same UUID); a prepared claim is left to
  prepare and unprepare;
- a creation the GPU refuses (another instance on the placement) leaves nothing behind (no
  instance, no ledger entry) and reports ``mig-failed`` True with the error, once;
- the refused device is tainted ``mig-failed`` (NoSchedule) so the scheduler allocates another
  placement, and the taint goes after ``REFUSED_TAINT_S``;
- deallocation without a pod (the allocation removed, or the claim deleted, or replaced by one
  of the same name) destroys what was made;
- the plugin killed between creating the MIG device and reporting: the next start keeps the
  device and reports it; killed before the device existed, it is created and reported; the
  claim deallocated meanwhile, it is destroyed; a plugin without binding conditions destroys
  such devices at start, as before;
- ``binding.step`` on its own: a claim allocated two devices here, one made, gets the other made;
  one that now has another device releases the first; a prepared claim is prepare's;
- the pods nominated to the node: their claims (named, or made from templates) are looked at
  until the pod is bound or gone;
- a claim reported (or prepared, or allocated without waiting for this node) is not read again
  while its pod stays nominated here and unchanged (the API server's cost per pod), one not
  allocated yet is read every pass; an event of its pod (nominated elsewhere after a
  deallocation, deleted) or ``SETTLED_S`` brings it back, and a deallocation then destroys the
  device;
- the pod watch's retries after failures are drawn at random below a doubling ceiling, so that
  the binders of a fleet failing together do not retry in step.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from fake_claims import claim, result
from test_dynamic_mig import Node, dynamic_devices, ref

from dra_gpu.devices import naming, simulated
from dra_gpu.kube import errors
from dra_gpu.kube.client import KubeClient
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin import slices
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.mig import binding
from dra_gpu.mig.dynamic import DynamicMig
from dra_gpu.plugin import mig_binding, published
from dra_gpu.prepare.state import DeviceState

DRIVER = "gpu.nvidia.com"
NODE = "node-a"


def _devices_of(objs: list[published.JSON]) -> list[published.JSON]:
    return [d for s in objs for d in s["spec"].get("devices", [])]


def test_dynamic_mig_devices_carry_binding_conditions_where_served() -> None:
    devices = dynamic_devices("a100x4-mig")
    conditions = published.mig_binding_conditions(DRIVER)
    objs = published.node_slices(
        devices, driver_name=DRIVER, node_name=NODE, node_uid=None, binding=conditions
    )
    listed = _devices_of(objs)
    partitions = [d for d in listed if "consumesCounters" in d]
    assert partitions and len(partitions) == sum(1 for d in devices if d.partition is not None)
    for d in partitions:
        assert d["bindingConditions"] == ["gpu.nvidia.com/mig-created"]
        assert d["bindingFailureConditions"] == ["gpu.nvidia.com/mig-failed"]
    others = [d for d in listed if "consumesCounters" not in d]
    assert all("bindingConditions" not in d for d in others)
    unserved = published.node_slices(devices, driver_name=DRIVER, node_name=NODE, node_uid=None)
    assert all("bindingConditions" not in d for d in _devices_of(unserved))


def test_a_static_node_carries_no_binding_conditions() -> None:
    backend = simulated.SimulatedBackend(
        profile=simulated.BUILTIN_PROFILES["a100x4-mig"], node_name=NODE
    )
    devices = naming.build_devices(backend.discover().gpus)
    objs = published.node_slices(
        devices,
        driver_name=DRIVER,
        node_name=NODE,
        node_uid=None,
        binding=published.mig_binding_conditions(DRIVER),
    )
    assert all("bindingConditions" not in d for d in _devices_of(objs))


def test_binding_conditions_within_the_api_limit() -> None:
    devices = dynamic_devices("a100x4-mig")
    name = next(d.name for d in devices if d.partition is not None)
    too_many = slices.BindingConditions(ready=tuple(f"c{i}" for i in range(5)), failed=("f",))
    with pytest.raises(ValueError, match="binding conditions"):
        slices.build_resource_slices(
            devices=devices,
            driver_name=DRIVER,
            node_name=NODE,
            pool_generation=1,
            node_owner=None,
            binding={name: too_many},
        )


# --- the binder ---------------------------------------------------------------------------------

READY = "gpu.nvidia.com/mig-created"
FAILED = "gpu.nvidia.com/mig-failed"
DEVICE = "gpu-0-mig-3g40gb-9-4"


def as_claim(body: dict[str, Any]) -> ResourceClaim:
    return cast(ResourceClaim, body)


def allocated(uid: str, device: str = DEVICE) -> dict[str, Any]:
    """A claim allocated ``device`` of this node, as the scheduler writes it (KEP-5007)."""
    body = claim(uid, [result(device, pool=NODE)])
    for r in body["status"]["allocation"]["devices"]["results"]:
        r["bindingConditions"] = [READY]
        r["bindingFailureConditions"] = [FAILED]
    return body


class FakeApi(KubeClient):
    """Claims by (namespace, name); a status apply merges the entries by key and their
    conditions by type, as the API server does. Not connected to anything."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.applies: list[tuple[Mapping[str, str], dict[str, Any]]] = []
        self.gets = 0
        self.fail_applies = 0

    def add(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = body

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "",
        timeout_s: float = 0.0,
    ) -> dict[str, Any]:
        parts = path.split("/")
        key = (parts[5], parts[7])
        if method == "GET":
            self.gets += 1
            if key not in self.claims:
                raise errors.NotFound("not found", status=404, request=path)
            return copy.deepcopy(self.claims[key])
        assert method == "PATCH" and path.endswith("/status") and body is not None
        if self.fail_applies:
            self.fail_applies -= 1
            raise errors.ApiUnavailable("connection refused", request=path)
        self.applies.append((dict(query or {}), copy.deepcopy(dict(body))))
        stored = self.claims[key]
        assert body["metadata"]["uid"] == stored["metadata"]["uid"]
        devices = stored["status"].setdefault("devices", [])
        for entry in body["status"]["devices"]:
            old = next((d for d in devices if d["device"] == entry["device"]), None)
            if old is None:
                devices.append(copy.deepcopy(entry))
                continue
            by_type = {c["type"]: c for c in old.get("conditions", [])}
            by_type.update({c["type"]: c for c in entry["conditions"]})
            old["conditions"] = list(by_type.values())
        return copy.deepcopy(stored)


def conditions(api: FakeApi, uid: str, device: str = DEVICE) -> dict[str, str]:
    body = api.claims[("default", f"claim-{uid}")]
    entries = [d for d in body["status"].get("devices", []) if d["device"] == device]
    return {c["type"]: c["status"] for e in entries for c in e["conditions"]}


class Binding:
    """A dynamic-MIG node with binding conditions: its state, ledger and binder."""

    def __init__(self, root: Path, api: FakeApi | None = None) -> None:
        self.node = Node(root)
        self.taints: list[Mapping[str, list[dict[str, str]]]] = []
        self.now = 1000.0
        self.api = api or FakeApi()
        self.mig = DynamicMig(state_dir=root / "state", instances=self.node.sim, keep_ahead=True)
        self.state: DeviceState = self.node.state(mig=self.mig)
        self.state.start()
        self.binder = mig_binding.MigBinder(
            self.api,
            driver="gpu.nvidia.com",
            node=NODE,
            mig=self.mig,
            inventory=lambda: self.node.devices,
            claims=self.state,
            clock=lambda: "2026-12-06T16:00:00Z",
            on_refused=self.taints.append,
            monotonic=lambda: self.now,
        )

    def nominate(self, *uids: str) -> None:
        self.binder.set_pods(
            [
                {
                    "metadata": {"uid": f"pod-{u}", "namespace": "default"},
                    "spec": {
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{u}"}]
                    },
                    "status": {"nominatedNodeName": NODE},
                }
                for u in uids
            ]
        )

    def allocate(self, uid: str, device: str = DEVICE) -> None:
        body = allocated(uid, device)
        self.api.add(body)
        self.node.fetcher.add(body)


def test_the_mig_device_is_made_and_reported_before_the_pod_binds(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.nominate("u1")
    assert node.binder.pass_once()
    (made,) = node.node.instances()
    assert (made.profile, made.start) == ("3g.40gb", 4)
    assert conditions(node.api, "u1") == {READY: "True"}
    query, body = node.api.applies[0]
    assert query == {"fieldManager": "gpu.nvidia.com/mig-binding", "force": "true"}
    assert body["metadata"]["uid"] == "u1"
    (entry,) = body["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == ("gpu.nvidia.com", NODE, DEVICE)
    assert made.uuid in entry["conditions"][0]["message"]

    node.binder.pass_once()  # reported already: nothing more is made or written
    assert len(node.api.applies) == 1 and node.node.instances() == [made]

    out = node.state.prepare([ref("u1")])[ClaimUID("u1")]  # the pod bound: the kubelet prepares
    assert out.error == "" and node.node.instances() == [made]
    spec = next((tmp_path / "cdi").glob("*.json")).read_text()
    assert made.uuid in spec
    step = node.binder.look("default", "claim-u1", [])
    assert isinstance(step, binding.Prepared)  # prepare and unprepare own it
    assert node.state.unprepare([ref("u1")]) == {"u1": ""}
    assert node.node.instances() == []


def test_a_refused_placement_leaves_nothing_and_reports_the_failure(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    other = node.node.devices["gpu-0-mig-1g10gb-19-5"]  # an instance on memory slice 5
    assert other.partition is not None
    theirs = node.node.sim.create(other.gpu, other.partition)
    node.allocate("u1")
    node.nominate("u1")
    node.binder.pass_once()
    assert node.node.instances() == [theirs]  # nothing of ours is left on the GPU
    assert node.mig.ledger.load() == []
    assert conditions(node.api, "u1") == {READY: "False", FAILED: "True"}
    (_, body) = node.api.applies[0]
    failed = next(c for c in body["status"]["devices"][0]["conditions"] if c["type"] == FAILED)
    assert failed["reason"] == "MigDeviceCreationFailed" and theirs.uuid in failed["message"]
    (taints,) = node.taints  # the scheduler is steered to another placement
    assert taints == {
        DEVICE: [
            {
                "key": "gpu.nvidia.com/mig-failed",
                "value": "placement-refused",
                "effect": "NoSchedule",
                "timeAdded": "2026-12-06T16:00:00Z",
            }
        ]
    }
    node.binder.pass_once()  # reported: the scheduler deallocates; not tried again
    assert len(node.api.applies) == 1 and node.mig.ledger.load() == []
    assert len(node.taints) == 1
    node.now += binding.REFUSED_TAINT_S + 1
    node.binder.pass_once()
    assert node.taints[-1] == {}  # the placement may be tried again


def test_a_failed_report_is_written_again(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.nominate("u1")
    node.api.fail_applies = 1
    node.binder.pass_once()
    assert len(node.node.instances()) == 1 and conditions(node.api, "u1") == {}
    node.binder.pass_once()
    assert len(node.node.instances()) == 1 and conditions(node.api, "u1") == {READY: "True"}


@pytest.mark.parametrize("how", ["deallocated", "deleted", "replaced"])
def test_deallocation_without_a_pod_destroys_the_device(tmp_path: Path, how: str) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.nominate("u1")
    node.binder.pass_once()
    assert len(node.node.instances()) == 1
    node.binder.set_pods([])  # the pod was deleted before it bound
    key = ("default", "claim-u1")
    if how == "deallocated":
        node.api.claims[key]["status"] = {}
    elif how == "deleted":
        del node.api.claims[key]
    else:
        replaced = allocated("u2")
        replaced["metadata"]["name"] = "claim-u1"
        node.api.claims[key] = replaced
    assert node.binder.pass_once()  # the ledger's entry keeps the claim looked at
    assert node.node.instances() == [] and node.mig.ledger.load() == []
    assert not node.binder.pass_once()  # nothing left to look at: no more requests
    gets = node.api.gets
    node.binder.pass_once()
    assert node.api.gets == gets


def test_a_restart_between_creating_and_reporting_reports(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    device = node.node.devices[DEVICE]
    made = node.mig.ensure("u1", device, ahead=("default", "claim-u1"))  # then killed
    restarted = Binding(tmp_path, node.api)  # start-up keeps it: the binder's to repair
    assert restarted.node.instances() == [made]
    restarted.binder.pass_once()  # no pod event needed: the ledger names the claim
    assert conditions(node.api, "u1") == {READY: "True"}
    assert restarted.node.instances() == [made]


def test_a_restart_before_the_device_existed_creates_and_reports(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    device = node.node.devices[DEVICE]
    assert device.partition is not None
    entry = node.mig.ahead([])  # nothing yet
    assert entry == []

    class Killed(Exception):
        pass

    class Dies:
        def list(self, gpu_uuid: str) -> list[Any]:
            return []

        def create(self, gpu: Any, partition: Any) -> Any:
            raise Killed  # the ledger entry is written, the device never made

        def destroy(self, gpu_uuid: str, instance: Any) -> bool:
            return False

    dying = DynamicMig(state_dir=tmp_path / "state", instances=Dies(), keep_ahead=True)
    with pytest.raises(Killed):
        dying.ensure("u1", device, ahead=("default", "claim-u1"))
    restarted = Binding(tmp_path, node.api)
    restarted.binder.pass_once()
    (made,) = restarted.node.instances()
    assert made.start == 4 and conditions(node.api, "u1") == {READY: "True"}


def test_a_restart_after_deallocation_destroys(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.mig.ensure("u1", node.node.devices[DEVICE], ahead=("default", "claim-u1"))
    node.api.claims[("default", "claim-u1")]["status"] = {}  # deallocated while it was down
    restarted = Binding(tmp_path, node.api)
    restarted.binder.pass_once()
    assert restarted.node.instances() == [] and restarted.mig.ledger.load() == []
    assert node.api.applies == []


def test_without_binding_conditions_start_destroys_devices_made_ahead(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.mig.ensure("u1", node.node.devices[DEVICE], ahead=("default", "claim-u1"))
    plain = Node(tmp_path)  # a plugin whose API server no longer serves them: as before
    report = plain.state().start()
    assert len(report.mig_destroyed) == 1 and plain.instances() == []


def test_the_claims_of_pods_nominated_here_until_they_bind(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    templated: dict[str, Any] = {
        "metadata": {"uid": "p1", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {
            "nominatedNodeName": NODE,
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "claim-u1"}],
        },
    }
    node.allocate("u1")
    node.binder.pod_event("ADDED", templated)
    assert node.binder.pass_once() and conditions(node.api, "u1") == {READY: "True"}
    bound = copy.deepcopy(templated)
    bound["spec"]["nodeName"] = NODE
    node.state.prepare([ref("u1")])
    node.binder.pod_event("MODIFIED", bound)
    assert not node.binder.pass_once()  # bound and prepared: nothing to look at
    node.binder.pod_event("ADDED", {**templated, "metadata": {"uid": "p2", "namespace": "x"}})
    node.binder.pod_event("DELETED", {"metadata": {"uid": "p2"}})
    assert not node.binder.pass_once()


def test_claims_not_waiting_for_this_node_are_left_alone(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    elsewhere = claim("u1", [result(DEVICE, pool="node-b")])
    no_condition = claim("u2", [result(DEVICE, pool=NODE)])  # allocated at prepare, as before
    node.api.add(elsewhere)
    node.api.add(no_condition)
    node.nominate("u1", "u2", "u3")  # u3: not allocated yet
    assert node.binder.pass_once()
    assert node.node.instances() == [] and node.api.applies == []
    assert node.api.gets == 3
    node.binder.pass_once()  # only u3 is read again: its allocation does not show on the pod
    assert node.api.gets == 4
    node.allocate("u3")
    node.binder.pass_once()
    assert len(node.node.instances()) == 1 and conditions(node.api, "u3") == {READY: "True"}


def test_step_decides_from_the_claim_the_ledger_and_the_checkpoint() -> None:
    other = "gpu-0-mig-1g10gb-19-0"
    two = allocated("u1")
    two["status"]["allocation"]["devices"]["results"].append(
        {**allocated("u1", other)["status"]["allocation"]["devices"]["results"][0], "request": "b"}
    )
    args: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "pool": NODE,
        "ready": READY,
        "failed": FAILED,
    }
    half = binding.step(as_claim(two), uid="u1", held=[DEVICE], prepared=False, **args)
    assert isinstance(half, binding.Make) and half.wanted.devices == tuple(sorted([DEVICE, other]))
    moved = binding.step(
        as_claim(allocated("u1", other)), uid="u1", held=[DEVICE], prepared=False, **args
    )
    assert isinstance(moved, binding.Release) and moved.uid == "u1"
    owned = binding.step(as_claim(two), uid="u1", held=[DEVICE], prepared=True, **args)
    assert isinstance(owned, binding.Prepared)
    fresh = binding.step(as_claim(allocated("u1")), uid=None, held=[], prepared=False, **args)
    assert isinstance(fresh, binding.Make)


def pod(uid: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"uid": f"pod-{uid}", "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": f"claim-{uid}"}]},
        "status": {"nominatedNodeName": NODE, **status},
    }


def test_a_reported_claim_is_not_read_while_its_pod_waits(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.binder.pod_event("ADDED", pod("u1"))
    node.binder.pass_once()
    assert conditions(node.api, "u1") == {READY: "True"} and node.api.gets == 1
    for _ in range(5):  # the scheduler reads the condition every 5 s; the pod is unchanged
        node.binder.pass_once()
    assert node.api.gets == 1
    node.now += mig_binding.SETTLED_S + 1  # in case an event was missed: read again
    node.binder.pass_once()
    assert node.api.gets == 2
    node.binder.pass_once()
    assert node.api.gets == 2


@pytest.mark.parametrize("event", ["DELETED", "MODIFIED"])
def test_a_deallocation_shown_by_the_pod_destroys_the_device(tmp_path: Path, event: str) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.binder.pod_event("ADDED", pod("u1"))
    node.binder.pass_once()
    assert len(node.node.instances()) == 1
    # The scheduler gave up (its binding timeout, another claim's failure): it deallocated the
    # claim and cleared the pod's nomination (the watch sends DELETED: the pod left the
    # selector), or wrote the pod's status (MODIFIED, nominated here again).
    node.api.claims[("default", "claim-u1")]["status"] = {}
    failed = {"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}
    node.binder.pod_event(event, pod("u1", conditions=[failed]))
    node.binder.pass_once()
    assert node.node.instances() == [] and node.mig.ledger.load() == []


def test_a_list_reads_every_claim_again(tmp_path: Path) -> None:
    node = Binding(tmp_path)
    node.allocate("u1")
    node.nominate("u1")
    node.binder.pass_once()
    node.binder.pass_once()
    assert node.api.gets == 1
    node.nominate("u1")  # the watch expired and the pods were listed again
    node.binder.pass_once()
    assert node.api.gets == 2


class Unreachable(KubeClient):
    """An API server that answers nothing (overloaded): every request fails."""

    def __init__(self) -> None:  # not connected to anything
        self.lists = 0

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        raise errors.ApiUnavailable("read timed out", request=path)


class Pauses(threading.Event):
    """A stop event that records each pause asked of it, and is set after ``count``."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self._count = count

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(float(timeout or 0.0))
        if len(self.pauses) >= self._count:
            self.set()
        return self.is_set()


def test_binders_failing_together_spread_their_retries(tmp_path: Path) -> None:
    def pauses(draw: float) -> list[float]:
        node = Binding(tmp_path / str(draw))
        binder = mig_binding.MigBinder(
            Unreachable(),
            driver=DRIVER,
            node=NODE,
            mig=node.mig,
            inventory=lambda: node.node.devices,
            claims=node.state,
            draw=lambda: draw,
        )
        stop = Pauses(5)
        binder._watch_pods(stop)  # the watch thread's loop, run here until stopped
        return stop.pauses

    low, high = pauses(0.0), pauses(1.0)
    assert len(low) == len(high) == 5
    # After the first (0.2 s for all), the pauses spread below a doubling ceiling.
    assert all(a < b for a, b in zip(low[1:], high[1:], strict=True))
    assert high == sorted(high) and high[-1] <= mig_binding.MAX_WATCH_BACKOFF_S


class PodsApi(KubeClient):
    """The pods' list and watch as the API server answers them, in order: each list returns
    the pods at resourceVersion ``"7"``; each watch ends with the next of ``watch_errors`` (an
    expired resourceVersion, an overloaded server). Records what was asked, when."""

    def __init__(self, log: list[str], watch_errors: list[errors.ApiError]) -> None:
        self.log = log  # not connected to anything
        self.lists: list[dict[str, str]] = []
        self._watch_errors = watch_errors

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", mig_binding.PODS_PATH)
        self.log.append("list")
        self.lists.append(dict(kwargs["query"]))
        return {"metadata": {"resourceVersion": "7"}, "items": []}

    def watch(self, path: str, **kwargs: Any) -> Any:
        self.log.append("watch")
        raise self._watch_errors.pop(0)


def binder_over(node: Binding, api: KubeClient, published: Any = None) -> mig_binding.MigBinder:
    return mig_binding.MigBinder(
        api,
        driver=DRIVER,
        node=NODE,
        mig=node.mig,
        inventory=lambda: node.node.devices,
        claims=node.state,
        draw=lambda: 0.0,
        **({} if published is None else {"slices_published": published}),
    )


def test_the_pods_are_listed_once_the_nodes_slices_are_published(tmp_path: Path) -> None:
    log: list[str] = []

    def published(timeout: float) -> bool:  # the publisher's wait_synced
        log.append("published?")
        return log.count("published?") == 3

    api = PodsApi(log, [errors.ApiUnavailable("read timed out", request="watch")])
    binder_over(Binding(tmp_path), api, published)._watch_pods(Pauses(1))
    # Nothing is asked of the API server until the slices are published; then one list.
    assert log == ["published?", "published?", "published?", "list", "watch"]


def test_the_pods_are_listed_from_the_cache_and_from_etcd_after_an_expired_watch(
    tmp_path: Path,
) -> None:
    selector = f"status.nominatedNodeName={NODE}"
    expired = errors.Gone("too old resource version", status=410, request="watch")
    overloaded = errors.ApiUnavailable("read timed out", request="watch")
    api = PodsApi([], [expired, overloaded, overloaded])
    binder_over(Binding(tmp_path), api)._watch_pods(Pauses(2))
    # Start: from the watch cache. After the 410: as etcd has them. After a failure: the
    # cache again.
    assert api.lists == [
        {"fieldSelector": selector, "resourceVersion": "0"},
        {"fieldSelector": selector},
        {"fieldSelector": selector, "resourceVersion": "0"},
    ]
