"""Dynamic MIG devices created before the pod binds (KEP-5007): the binder's two threads.

What to do for a claim is decided by ``mig.binding.step`` (pure); this module finds the claims,
reads them, creates and destroys through ``DynamicMig`` and writes the conditions.

**Finding the node's claims without watching every claim.** A ResourceClaim has no field a
selector can match on its allocation (only ``metadata.name`` and ``metadata.namespace`` are
selectable), so watching claims means watching all of the cluster's. The pod is the handle: the
scheduler sets ``status.nominatedNodeName`` to the node before its PreBind writes the allocation
and waits for the binding conditions (``NominatedNodeNameForExpectation``, beta and on from
1.35), and ``status.nominatedNodeName`` is a field selector the API server serves for pods.
So the ``mig-binding-watch`` thread lists and watches the pods with
``fieldSelector=status.nominatedNodeName=<node>`` (only those come over the wire), keeping each
one not yet bound with the claims it uses; the ``mig-binding`` thread GETs those claims once a
second until each is allocated here (the scheduler writes the allocation just after it
nominates the pod, and the pod does not change then), plus the claims the ledger holds MIG
devices for that are not prepared yet (until prepared or deallocated). A node with no pod
nominated to it and nothing made ahead sends nothing but its one watch.

**Starting with a fleet.** A DaemonSet's plugins start together (a rollout, an API server
back after an outage). The watch thread lists only once the node's slices are published
(``slices_published``, the publisher's ``wait_synced``): on a first start no pod can be
nominated here before, and on a restart the publisher's first pass is one list away; so a
starting plugin's requests come one after another, and the binder's list goes over the
connection the publisher opened instead of one of its own. The list asks for
``resourceVersion=0``, as informers list: the API server answers from its watch cache, without
asking etcd for its current revision and waiting for the cache to reach it (under load up to
3 s, then a list from etcd); the watch goes on from the version the list returned. After an
expired watch (410 Gone) the list is a consistent one.

**Settled claims are not read again.** Once a claim's condition is reported (or it is
prepared, or allocated without waiting for this node), nothing is left to do until the
scheduler acts: it binds the pod (up to 5 s later: it reads the conditions every 5 s), or it
deallocates the claim and clears the pod's nomination (a failure, its binding timeout). Both
change the pod, and the watch sees it; so a settled claim of a pod still nominated here and
unchanged is not read (``_settled``, the binder thread's), except once every ``SETTLED_S`` in
case an event was missed. Any event of its pod (or a new list) brings it back to a GET a
second. Reading it until the pod bound cost about 17 GETs per pod at 100 nodes, where the
scheduler nominated many pods to one node and each woke a pass (docs/development/scale.md).

**Writing the conditions.** A server-side apply of the claim's ``status`` with the field manager
``<driver>/mig-binding``, carrying only this node's entries of the claim's dynamic MIG devices
and, in them, only the binding conditions: the device-status writer after prepare
(``kubeletplugin.claim_status``, manager ``<driver>/kubelet-plugin``) owns the other fields of
the same entries, so neither removes the other's. The apply names the claim's UID.

**Serialised with prepare.** Each claim is handled under its per-claim lock of ``DeviceState``
(``DeviceState.holding``), the lock its prepare and unprepare take, and whether it is prepared
is read under it: the pod may bind and be prepared the moment the condition is True.

**Steering away from a refused placement.** The KEP asks a driver that reports a failure to
keep the device from being picked again: the refused device is tainted ``<driver>/mig-failed``
(NoSchedule, ``binding.REFUSED_TAINT_S``) through ``on_refused`` (the health monitor publishes
it with the health taints), set after the pass, outside every claim lock.

**Crash safety.** The ledger entry is written durably before the MIG device is created
(``DynamicMig.ensure``, marked ``ahead`` with the claim's name); a plugin killed before it
reported finds, at its next start, the entry of a claim not prepared: ``reconcile`` leaves it
(``keep_ahead``) and the first pass GETs the claim: still allocated those devices, the device
is made if missing and the condition reported; deallocated or gone, the device is destroyed.
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol, cast

from dra_gpu.devices.model import Device
from dra_gpu.kube import errors
from dra_gpu.kube.client import APPLY_PATCH, KubeClient, list_query
from dra_gpu.kube.objects import ResourceClaim, claim_path
from dra_gpu.kubeletplugin.claim_status import apply_body
from dra_gpu.kubeletplugin.driver import ClaimRef
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.kubeletplugin.publisher import backoff_delay
from dra_gpu.mig import binding
from dra_gpu.mig.dynamic import DynamicMig, Owned
from dra_gpu.mig.instances import InstanceError
from dra_gpu.plugin import published
from dra_gpu.prepare.checkpoint import CheckpointError

log = logging.getLogger(__name__)

PODS_PATH: Final = "/api/v1/pods"
POLL_S: Final = 1.0  # while claims are pending; the scheduler looks every 5 s
# A settled claim (reported, or prepared) of a pod still nominated here is read again after
# this long even without an event of its pod: a missed event costs this much at most.
SETTLED_S: Final = 30.0
# With nothing pending (no pod nominated here, nothing made ahead) only a pod event, which wakes
# the thread, brings work; the look at the ledger between (no API request) is a safety net and
# lets a refused placement's taint expire. A fleet's 1,000 binders in the benchmark's two
# processes woke a thousand times a second for nothing at 1 s (docs/development/scale.md).
IDLE_S: Final = 10.0
MAX_WATCH_BACKOFF_S: Final = 30.0
PUBLISHED_WAIT_S: Final = 5.0  # each wait for the slices to be published, between looks at stop


class ClaimLocks(Protocol):
    """What the binder needs of ``DeviceState``."""

    def holding(self, uid: str) -> AbstractContextManager[None]: ...

    def completed(self) -> set[str]: ...


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MigBinder:
    """Creates the dynamic MIG devices of claims allocated on this node before their pods bind,
    and reports the binding condition (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        driver: str,
        node: str,
        mig: DynamicMig,
        inventory: Callable[[], Mapping[str, Device]],
        claims: ClaimLocks,
        clock: Callable[[], str] = now_rfc3339,
        poll_s: float = POLL_S,
        on_refused: Callable[[Mapping[str, list[dict[str, str]]]], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
        slices_published: Callable[[float], bool] = lambda _timeout: True,
    ) -> None:
        """``draw``: the random source of the watch's retry pauses (uniform in 0..1).
        ``slices_published``: waits up to that many seconds for the node's slices to be published,
        True once they were (the publisher's ``wait_synced``); the pods are listed after."""
        self._client, self._driver, self._node = client, driver, node
        self._mig, self._inventory, self._claims = mig, inventory, claims
        self._clock, self._poll_s = clock, poll_s
        self._ready = f"{driver}/{published.MIG_CREATED}"
        self._failed = f"{driver}/{published.MIG_FAILED}"
        self._field_manager = f"{driver}/mig-binding"
        # Guarded by _lock: pod UID -> (namespace, claim names) of the pods nominated to this
        # node and not bound yet (the watch thread writes, the binder thread copies); and the
        # claims whose pod came, changed or went since the last pass (the binder takes them).
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._changed: set[tuple[str, str]] = set()
        self._wake = threading.Event()  # a pod came or changed: look now
        self._threads: list[threading.Thread] = []
        # The binder thread's only: refused device -> (until, when first refused, RFC 3339).
        self._refused: dict[str, tuple[float, str]] = {}
        # The binder thread's only: settled claim (namespace, name) -> when to read it anyway.
        self._settled: dict[tuple[str, str], float] = {}
        self._dirty = False
        self._on_refused, self._monotonic, self._draw = on_refused, monotonic, draw
        self._slices_published = slices_published

    # --- threads ---------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        self._threads = [
            threading.Thread(target=self._run, args=(stop,), name="mig-binding", daemon=True),
            threading.Thread(
                target=self._watch_pods, args=(stop,), name="mig-binding-watch", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                pending = self.pass_once()
            except Exception:  # a bug: one line with the traceback, the thread keeps serving
                log.exception("dynamic MIG binding pass failed")
                pending = True
            self._wake.wait(self._poll_s if pending else IDLE_S)
            self._wake.clear()

    def _watch_pods(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self._slices_published(PUBLISHED_WAIT_S):
            pass  # the node's slices first (the module docstring says why)
        query = {"fieldSelector": f"status.nominatedNodeName={self._node}"}
        version: str | None = None
        consistent = False  # after an expired watch: not from the cache (it may be behind)
        failures = 0
        while not stop.is_set():
            try:
                if version is None:
                    listed = self._client.request(
                        "GET", PODS_PATH, query=list_query(query, consistent=consistent)
                    )
                    self.set_pods(listed.get("items") or [])
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                    consistent = False
                watch = {**query, "resourceVersion": version, "allowWatchBookmarks": "true"}
                for event in self._client.watch(PODS_PATH, query=watch, stop=stop):
                    pod = event.get("object") or {}
                    version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self.pod_event(str(event.get("type")), pod)
                failures = 0
            except errors.Gone:
                version, consistent = None, True  # expired: list again, consistently
            except errors.ApiError as err:
                failures += 1
                # At random below a doubling ceiling: the binders of a fleet fail together when
                # the API server is overloaded, and retrying in step kept it so (1,000 nodes,
                # docs/development/scale.md).
                delay = backoff_delay(failures, self._draw(), max_s=MAX_WATCH_BACKOFF_S)
                log.warning(
                    "watching the pods nominated to %s: %s; again in %.1f s", self._node, err, delay
                )
                version = None
                stop.wait(delay)

    # --- the pods nominated to this node -----------------------------------------------------

    def set_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The pods listed: they replace what was known (and every claim is read again: events
        may have been missed before the list)."""
        known = dict(p for p in map(_pending, pods) if p is not None)
        with self._lock:
            self._pods = known
            self._changed.add(_EVERY)
        self._wake.set()

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        entry = _pending(pod) if kind != "DELETED" else None
        namespace = str(meta.get("namespace") or "")
        with self._lock:
            if entry is None:
                self._pods.pop(uid, None)
            else:
                self._pods[entry[0]] = entry[1]
            # Whatever changed (bound, nominated elsewhere, deleted, its status): its claims
            # are read at the next pass, settled or not.
            self._changed.update((namespace, n) for n in binding.claim_names(pod))
        if entry is not None:
            self._wake.set()

    # --- one pass ------------------------------------------------------------------------------

    def pass_once(self) -> bool:
        """Look at every pending claim once; True while any is pending (look again soon)."""
        with self._lock:
            pods = list(self._pods.values())
            changed, self._changed = self._changed, set()
        if _EVERY in changed:
            self._settled.clear()
        for key in changed:
            self._settled.pop(key, None)
        try:
            return self._pass(pods)
        finally:
            self._taint_refused()

    def _taint_refused(self) -> None:
        now = self._monotonic()
        before = dict(self._refused)
        self._refused = {d: v for d, v in self._refused.items() if v[0] > now}
        if self._on_refused is not None and (self._refused != before or self._dirty):
            taints = {
                d: [binding.refused_taint(self._driver, since=since)]
                for d, (_, since) in self._refused.items()
            }
            self._on_refused(taints)
        self._dirty = False

    def _pass(self, pods: list[tuple[str, tuple[str, ...]]]) -> bool:
        try:
            completed = self._claims.completed()
        except (CheckpointError, OSError) as err:  # OSError: its lock not taken in time, too
            log.warning("dynamic MIG binding: cannot read the checkpoint (%s); again soon", err)
            return True
        ahead = self._mig.ahead(completed)
        nominated = {(namespace, name) for namespace, names in pods for name in names}
        # Settled claims stay so only while their pod is nominated here: a claim the ledger
        # alone names (its pod bound, deleted or nominated elsewhere) is read every pass until
        # prepared or deallocated, so that a deallocation frees its MIG device at once.
        now = self._monotonic()
        self._settled = {
            k: until for k, until in self._settled.items() if k in nominated and until > now
        }
        targets: dict[tuple[str, str], None] = dict.fromkeys(sorted(nominated))
        for entry in ahead:
            targets[(entry.namespace, entry.name)] = None
        for namespace, name in targets:
            if (namespace, name) in self._settled:
                continue
            held = [e for e in ahead if (e.namespace, e.name) == (namespace, name)]
            try:
                todo = self.look(namespace, name, held)
                if isinstance(todo, binding.Make | binding.Wait | binding.Prepared) or (
                    isinstance(todo, binding.Forget) and todo.allocated
                ):
                    # Reported (the write above did not fail), prepare's, or allocated without
                    # waiting for this node: the scheduler acts next, and the pod shows it. A
                    # claim not allocated yet is read again: its allocation does not show on
                    # the pod.
                    self._settled[(namespace, name)] = now + SETTLED_S
            except errors.ApiError as err:
                log.info("dynamic MIG binding of claim %s/%s: %s; again soon", namespace, name, err)
            except InstanceError as err:  # a MIG device that could not be destroyed
                log.warning(
                    "dynamic MIG binding of claim %s/%s: %s; again soon", namespace, name, err
                )
        return bool(targets)

    def look(self, namespace: str, name: str, held: list[Owned]) -> binding.Step:
        """Read one claim and do what ``binding.step`` says; returns the step taken."""
        claim = self._get(namespace, name)
        uid = held[0].claim if held else None
        lock_uid = uid or (str(claim["metadata"].get("uid", "")) if claim is not None else "")
        with self._claims.holding(lock_uid):
            prepared = bool(lock_uid) and lock_uid in self._claims.completed()
            todo = binding.step(
                claim,
                uid=uid,
                held=[e.device for e in held],
                prepared=prepared,
                driver=self._driver,
                pool=self._node,
                ready=self._ready,
                failed=self._failed,
            )
            if isinstance(todo, binding.Release):
                for instance in self._mig.release(todo.uid):
                    log.info(
                        "destroyed MIG device %s made before binding for claim %s/%s (%s): %s",
                        instance.uuid,
                        namespace,
                        name,
                        todo.uid,
                        todo.why,
                    )
            elif isinstance(todo, binding.Make):
                self._make(todo.wanted)
        return todo

    def _make(self, want: binding.Wanted) -> None:
        devices = self._inventory()
        made: dict[str, str] = {}
        failure: tuple[str, str] | None = None
        for name in want.devices:
            device = devices.get(name)
            try:
                if device is None or device.partition is None:
                    raise InstanceError(f"{name} is not a dynamic MIG device of this node")
                made[name] = self._mig.ensure(
                    want.uid, device, ahead=(want.namespace, want.name)
                ).uuid
            except InstanceError as exc:
                failure = (name, str(exc))
                break
        if failure is not None:
            # Nothing of the failed attempt stays on the GPU: a partial GPU instance, and the
            # claim's other devices, are destroyed before the failure is reported.
            self._mig.release(want.uid)
            self._refused[failure[0]] = (
                self._monotonic() + binding.REFUSED_TAINT_S,
                self._clock(),
            )
            self._dirty = True
            log.warning(
                "claim %s/%s: MIG device %s could not be created before binding: %s",
                want.namespace,
                want.name,
                failure[0],
                failure[1],
            )
        self._write(want, made, failure)

    # --- API -------------------------------------------------------------------------------

    def _get(self, namespace: str, name: str) -> ResourceClaim | None:
        try:
            # The API boundary: the server's JSON is taken to be a ResourceClaim, unchecked.
            return cast(ResourceClaim, self._client.request("GET", claim_path(namespace, name)))
        except errors.NotFound:
            return None

    def _write(
        self, want: binding.Wanted, made: Mapping[str, str], failure: tuple[str, str] | None
    ) -> None:
        ours = binding.entries(
            want,
            driver=self._driver,
            pool=self._node,
            ready=self._ready,
            failed=self._failed,
            made=made,
            failure=failure,
            now=self._clock(),
        )
        ref = ClaimRef(uid=ClaimUID(want.uid), namespace=want.namespace, name=want.name)
        self._client.request(
            "PATCH",
            f"{claim_path(want.namespace, want.name)}/status",
            query={"fieldManager": self._field_manager, "force": "true"},
            body=apply_body(ref, ours),
            content_type=APPLY_PATCH,
        )
        if failure is None:
            log.info(
                "claim %s/%s: MIG devices %s created before binding; condition %s reported",
                want.namespace,
                want.name,
                ", ".join(f"{d} ({u})" for d, u in made.items()),
                self._ready,
            )


# In ``_changed``: the pods were listed again, every claim is read.
_EVERY: Final = ("", "")


def _pending(pod: Mapping[str, Any]) -> tuple[str, tuple[str, tuple[str, ...]]] | None:
    """(pod UID, (namespace, claim names)) of a pod nominated here and not bound yet."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return None  # bound (prepare handles it) or over
    names = binding.claim_names(pod)
    if not names:
        return None
    return str(meta.get("uid") or ""), (str(meta.get("namespace") or ""), tuple(names))
