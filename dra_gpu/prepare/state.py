"""The prepare/unprepare transaction of the kubelet plugin.

Prepare, per claim (claims of one call are independent: each gets its own result or error):

1. A claim already ``PrepareCompleted`` in the checkpoint gets the recorded answer again
   (idempotent, and no API call, so a repeated prepare works while the API server is down).
2. While the GPU driver is out (``driver_gate``: an upgrade unloaded it), fail at once naming
   it (:class:`DriverUnavailable`; the kubelet retries). Else fetch the claim
   (:class:`ClaimFetcher`), plan it (:func:`plan.plan_claim`: UID, allocation, driver, pool,
   devices, config) and build its CDI spec: all pure, nothing written yet.
3. Only when the prepare changes something outside the plugin's files (sharing switched on, or
   a dynamic MIG device to create): record ``PrepareStarted`` (refused if a device is held by
   another claim and not shared), create the MIG device, apply the sharing settings
   (``dra_gpu.prepare.sharing``: time-slice interval, MPS daemon).
4. Record ``PrepareCompleted`` durably (with the check against other claims' devices, if no
   ``PrepareStarted`` ran it); write the CDI spec; answer. A plain claim thus costs one
   checkpoint write, like the Go reference's.

Unprepare: remove the CDI spec, undo the sharing settings, then drop the record durably. An
unknown claim is success. Start-up makes the sharing settings match the completed claims.

Crash safety follows from that order, checked on :meth:`DeviceState.start` (which the process
runs before serving, under the node-wide call lock, so in a rolling update the other instance's
call in progress is never mistaken for a crash's leftovers):
a ``PrepareStarted`` record is a prepare the kubelet never got an answer for, so it is rolled
back (spec removed, settings undone, record dropped) and the kubelet's retry starts over; a
completed claim whose spec is missing (a crash before its spec was written, or any completed
claim after a reboot, i.e. a new boot ID, since /var/run is gone) gets its spec rebuilt from the
record; temp files of killed writers are removed.

A spec is removed only by its claim's unprepare or roll-back, never for lack of a record: a
spec of ours without one (the checkpoint was corrupt, or lost a record) is *adopted*, its record
rebuilt from the spec (``records.record_from_spec``), so the claim stays prepared, the conflict
check sees its devices and unprepare removes it; a repeated prepare of such a claim plans it
again and records the full facts. A corrupt checkpoint is salvaged record by record and
completed the same way (the store's ``rebuild``, also when found while serving), reported (log
and the injected ``report``, which the process main turns into a Node event), and the plugin
keeps serving. So does it when the state disk is full: start-up reports that it cannot write
the checkpoint, claims already prepared are answered, other calls fail naming the error until
there is space.

Concurrency: calls run on gRPC worker threads. The same claim is serialized by a per-claim lock;
different claims run in parallel; the checkpoint's group commit makes the check for conflicting
devices and the record atomic, also against another plugin instance (rolling update). During a
rolling update each call also holds the node-wide call lock (``call_lock``) around steps 1 and 3;
the claims are read from the API before it is taken (the GET is read-only and every check on the
claim runs under the lock), so another instance waits for our locked work only, not for our API
round trips. Every wait for a lock file is bounded: a call that cannot get one in time fails its
claims with ``atomicfile.LockTimeout``'s message (the file and its holder), and the kubelet
retries.

Crash tests observe the steps through a collaborator: ``fault(step)`` is called after each step
in :data:`FAULT_STEPS` (the plugin passes none; ``tests/cluster/crash_plugin.py`` starts it with
one that SIGKILLs the process).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeGuard

from dra_gpu.config import ConfigError
from dra_gpu.devices.model import Device
from dra_gpu.errors import UserError
from dra_gpu.kube.objects import ResourceClaim
from dra_gpu.kubeletplugin.atomicfile import LockTimeout
from dra_gpu.kubeletplugin.driver import ClaimRef

# The kit's result type; named here too because prepare's callers have always found it here.
from dra_gpu.kubeletplugin.driver import PrepareResult as PrepareResult
from dra_gpu.kubeletplugin.ids import ClaimUID
from dra_gpu.mig.instances import InstanceError
from dra_gpu.prepare import cdi, device_metadata, records, shares
from dra_gpu.prepare.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointStore,
    ClaimRecord,
    read_boot_id,
)
from dra_gpu.prepare.node_facts import NodeFacts
from dra_gpu.prepare.plan import ClaimPlan, PlanError, plan_claim
from dra_gpu.prepare.sharing.applied import Sharing, SharingError

if TYPE_CHECKING:
    from dra_gpu.mig.dynamic import DynamicMig

log = logging.getLogger(__name__)

FAULT_STEPS: Final = (
    "after-checkpoint-completed",
    "after-cdi-written",
    "unprepare-after-cdi-removed",
    "unprepare-after-checkpoint-removed",
)

# Reached only by prepares that change something outside the plugin's files: with time-slicing
# or MPS switched on, or on a node with --mig-mode=dynamic (the last one only when a MIG device
# is created).
SIDE_EFFECT_FAULT_STEPS: Final = ("after-checkpoint-started", "after-sharing-applied")
MIG_FAULT_STEPS: Final = ("after-mig-created",)


class ClaimFetcher(Protocol):
    def get_claim(self, *, namespace: str, name: str) -> ResourceClaim | None:
        """The ResourceClaim as API JSON, None if it does not exist; raises on other errors."""
        ...


Inventory = Callable[[], Mapping[str, Device]]
Fault = Callable[[str], None]
Report = Callable[[str, str], None]  # (reason, message): a warning about this node
DriverGate = Callable[[], str | None]  # why new claims wait for the GPU driver now, or None
CallLock = Callable[[], AbstractContextManager[object]]  # held around each call's transaction


def _no_fault(step: str) -> None:
    return None


def _driver_loaded() -> str | None:
    return None


class DriverUnavailable(UserError, RuntimeError):
    """The GPU driver is out (an upgrade in progress): a new claim waits; the kubelet retries."""


def _log_report(reason: str, message: str) -> None:
    log.warning("%s: %s", reason, message)


@dataclass(frozen=True)
class StateSettings:
    driver_name: str
    node_name: str  # also the pool name
    cdi_root: Path
    state_dir: Path


@dataclass(frozen=True)
class _Fetched:
    """A claim as read before the call lock: ``read`` False when the checkpoint already answered
    it; ``claim`` None when the API server does not have it; ``error`` when reading failed (it
    fails the claim only if the claim turns out to need the read)."""

    read: bool
    claim: ResourceClaim | None = None
    error: Exception | None = None


def _answers(record: ClaimRecord | None) -> TypeGuard[ClaimRecord]:
    """Whether the record answers a repeated prepare (no API read): completed with the full
    facts, not adopted from a spec (that one is planned again to record them)."""
    return record is not None and record.state == PREPARE_COMPLETED and not record.from_spec


@dataclass(frozen=True)
class StartReport:
    rewritten: tuple[ClaimUID, ...] = ()
    rolled_back: tuple[ClaimUID, ...] = ()
    adopted: tuple[ClaimUID, ...] = ()
    temp_files_removed: int = 0
    problems: tuple[str, ...] = ()
    corrupt: str | None = None
    mig_destroyed: tuple[str, ...] = ()  # dynamic MIG instances no completed claim owned


@dataclass
class _KeyedLocks:
    """One lock per claim UID, dropped when nobody holds or waits for it."""

    _guard: threading.Lock = field(default_factory=threading.Lock)
    _locks: dict[str, tuple[threading.Lock, int]] = field(default_factory=dict)

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class DeviceState:
    """The handler behind the DRA gRPC services (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: StateSettings,
        inventory: Inventory,
        claims: ClaimFetcher,
        node_facts: NodeFacts,
        fault: Fault = _no_fault,
        report: Report = _log_report,
        boot_id: Callable[[], str] = read_boot_id,
        store: CheckpointStore | None = None,
        call_lock: CallLock = contextlib.nullcontext,
        sharing: Sharing | None = None,
        mig: DynamicMig | None = None,
        driver_gate: DriverGate = _driver_loaded,
    ) -> None:
        self.settings = settings
        # The health monitor's ``refusal``: while the driver is out, new claims fail at once
        # naming it (claims already prepared are answered from their records).
        self._driver_gate = driver_gate
        # Time-slicing and MPS applied to the GPUs (prepare.sharing); off unless switched on.
        self._sharing = sharing or Sharing.off(settings.state_dir)
        self._mig = mig  # dynamic MIG: instances created by prepare (docs/concepts/dynamic-mig.md)
        self._call_lock = call_lock
        self._inventory = inventory
        self._claims = claims
        self._node = node_facts
        self._fault = fault
        self._report = report
        self._boot_id = boot_id
        self.store = store or CheckpointStore(settings.state_dir, rebuild=self._adopt_specs)
        self._locks = _KeyedLocks()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="prepare")

    # --- the kubelet's calls ------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, PrepareResult]:
        uids = [r.uid for r in refs]
        fetched = dict(zip(uids, self._each(self._fetch, refs), strict=True))
        try:
            with self._call_lock():
                if len(refs) == 1:  # the usual call: no hop through the pool
                    results = [self._prepare_claim(refs[0], fetched[uids[0]])]
                else:
                    results = list(self._pool.map(self._prepare_claim, refs, fetched.values()))
        except LockTimeout as exc:  # the other instance holds it too long: each claim fails
            log.error("prepare of %d claim(s) failed: %s", len(refs), exc)
            return {uid: PrepareResult(error=f"prepare: {exc}", kind="LockTimeout") for uid in uids}
        return dict(zip(uids, results, strict=True))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, str]:
        """Per claim UID an error message, "" on success."""
        uids = [r.uid for r in refs]
        try:
            with self._call_lock():
                return dict(zip(uids, self._each(self._unprepare_one, refs), strict=True))
        except LockTimeout as exc:
            log.error("unprepare of %d claim(s) failed: %s", len(refs), exc)
            return {uid: f"unprepare: {exc}" for uid in uids}

    def _each(self, fn: Callable[[ClaimRef], Any], refs: Sequence[ClaimRef]) -> list[Any]:
        if len(refs) <= 1:
            return [fn(r) for r in refs]
        return list(self._pool.map(fn, refs))

    def _fetch(self, ref: ClaimRef) -> _Fetched:
        """Read the claim unless the checkpoint answers it; needs no lock (reads only).

        The checkpoint is peeked at, not loaded: loading waits for a commit in progress (its
        fsyncs), which held up every GET of a burst of prepares. A stale guess costs a needless
        GET or a GET under the lock (``_prepare_claim``), never a wrong answer.
        """
        try:
            record = self.store.peek().claims.get(ref.uid)
        except (CheckpointError, OSError):  # met again, and handled, under the lock
            record = None
        if _answers(record):
            return _Fetched(read=False)
        try:
            return _Fetched(read=True, claim=self._get(ref))
        except Exception as exc:  # raised by _prepare_claim when it needs the claim
            return _Fetched(read=True, error=exc)

    def _get(self, ref: ClaimRef) -> ResourceClaim | None:
        return self._claims.get_claim(namespace=ref.namespace, name=ref.name)

    def _prepare_claim(self, ref: ClaimRef, fetched: _Fetched) -> PrepareResult:
        """One claim's prepare (steps 1, 3 and 4 of the module docstring), under its lock; its
        failure is its result's error."""
        try:
            with self._locks.hold(ref.uid):
                record = self.store.load().claims.get(ref.uid)
                if _answers(record):
                    if not cdi.spec_path(
                        self.settings.cdi_root, ref.uid
                    ).exists() or self._lacks_metadata(ref.uid, record):
                        # Someone removed it since: the answer is only useful with the spec
                        # in place.
                        _, problems = self._restore_specs({ref.uid: record})
                        if problems:
                            raise cdi.CDIError(problems[0])
                    return PrepareResult(devices=records.prepared_devices(record))
                refused = self._driver_gate()
                if refused is not None:
                    raise DriverUnavailable(f"claim {ref}: {refused}")
                if fetched.error is not None:
                    raise fetched.error
                # Not read when it was prepared; unprepared since (by the other instance):
                # read it now.
                claim = fetched.claim if fetched.read else self._get(ref)
                if claim is None:
                    raise PlanError(f"claim {ref} not found in the API server")
                inventory = self._inventory()
                plan = plan_claim(
                    ref,
                    claim,
                    driver=self.settings.driver_name,
                    pool=self.settings.node_name,
                    inventory=inventory,
                )
                pod_claim = device_metadata.pod_claim_name(claim["metadata"].get("annotations"))
                if self._sharing.limits_shares:  # each consumable share gets its caps
                    plan = shares.enforced(plan)
                devices = [d.cdi for d in plan.devices]
                spec = self._spec(ref.uid, str(ref), devices, self._metadata(plan, pod_claim))
                if record is not None and record.from_spec:
                    # Prepared before the checkpoint lost the record: the claim stays prepared
                    # whatever happens here, so no roll-back. Full facts first, then the spec is
                    # replaced atomically (on failure the old one, naming the same devices, stays).
                    made = self._with_mig_devices(
                        plan, inventory, pod_claim
                    )  # those it has (ledger)
                    if made is not None:
                        plan, spec = made
                    rebuilt = records.claim_record(plan, state=PREPARE_COMPLETED)
                    self.store.update(self._recorded(plan, rebuilt), durable=True)
                    self._write_metadata(self._metadata(plan, pod_claim), inventory)
                    cdi.write_spec(self.settings.cdi_root, ref.uid, spec)
                    log.info(
                        "prepared %s (%s) again, record rebuilt from its spec completed",
                        ref,
                        ref.uid,
                    )
                    return PrepareResult(devices=records.prepared_devices(rebuilt))
                started: ClaimRecord | None = None
                if self._sharing.active or (self._mig is not None and _partitions(plan, inventory)):
                    # A change outside the plugin's own files (a MIG device created, a GPU's
                    # sharing set) is recorded before it is made, so that a crash before the
                    # answer undoes it.
                    started = records.claim_record(plan, state=PREPARE_STARTED)
                    # Not fsynced: a power loss that undoes it also resets what it is about (the
                    # GPU's MIG devices and sharing settings); the kubelet was never answered.
                    self.store.update(self._recorded(plan, started), durable=False)
                    self._fault("after-checkpoint-started")
                recorded = started is not None
                try:
                    if started is not None:
                        made = self._with_mig_devices(plan, inventory, pod_claim)
                        if made is not None:
                            plan, spec = made
                            devices = [d.cdi for d in plan.devices]
                            self._fault("after-mig-created")
                        self._sharing.apply(ref.uid, devices)
                        self._fault("after-sharing-applied")
                    data = cdi.encode_spec(spec)  # refused before anything is recorded
                    # The record first, then the spec: a crash in between leaves a completed
                    # record whose spec start rebuilds, never a spec without a record (which start
                    # would adopt as prepared although no check against other claims' devices
                    # ever passed).
                    if started is None:
                        # The check against other claims' devices runs in this write.
                        completed = records.claim_record(plan, state=PREPARE_COMPLETED)
                        self.store.update(self._recorded(plan, completed), durable=True)
                        recorded = True
                    else:
                        # The started record, completed, with what prepare made since (a created
                        # MIG device's UUID and IDs): its devices were validated when it was built.
                        completed = records.claim_record(plan, state=PREPARE_COMPLETED)
                        self.store.update(
                            lambda cp: cp.with_claim(ref.uid, completed), durable=True
                        )
                    self._fault("after-checkpoint-completed")
                    # Beside the spec, after the record (never a file without one), before the spec
                    # that mounts it.
                    self._write_metadata(self._metadata(plan, pod_claim), inventory)
                    cdi.write_encoded(self.settings.cdi_root, ref.uid, data)
                except Exception:
                    self._roll_back(ref.uid, devices, recorded=recorded)
                    raise
                self._fault("after-cdi-written")
                log.info(
                    "prepared %s (%s): %s",
                    ref,
                    ref.uid,
                    ", ".join(d.cdi.name for d in plan.devices),
                )
                return PrepareResult(devices=records.prepared_devices(completed))
        except (UserError, InstanceError) as exc:  # PlanError, CDIError, ConfigError, SharingError
            # Someone must act (fix the claim, the node): the pod waits until then. A warning,
            # without a traceback: the message says all there is to say.
            log.warning("prepare %s (%s) failed: %s", ref, ref.uid, exc)
            return PrepareResult(error=str(exc), kind=type(exc).__name__)
        except Exception as exc:
            kind = "LockTimeout" if isinstance(exc, LockTimeout) else "Unexpected"
            return PrepareResult(error=self._unexpected("prepare", ref, exc), kind=kind)

    def _with_mig_devices(
        self, plan: ClaimPlan, inventory: Mapping[str, Device], pod_claim: str | None
    ) -> tuple[ClaimPlan, dict[str, Any]] | None:
        """Dynamic MIG: the plan with its MIG devices created (or found) and its CDI spec; None
        when it has none to create."""
        if self._mig is None or not _partitions(plan, inventory):
            return None
        plan = _with_instances(plan, inventory, self._mig)
        devices = [d.cdi for d in plan.devices]
        ref = plan.ref
        return plan, self._spec(ref.uid, str(ref), devices, self._metadata(plan, pod_claim))

    def _recorded(self, plan: ClaimPlan, record: ClaimRecord) -> Callable[[Checkpoint], Checkpoint]:
        """Records ``record`` for the planned claim unless another claim holds its devices."""
        uid = plan.ref.uid

        def mutate(checkpoint: Checkpoint) -> Checkpoint:
            for other_uid, other in checkpoint.claims.items():
                if other_uid == uid:
                    continue
                for planned in plan.devices:
                    why = records.conflicts(planned, other_uid=other_uid, other=other)
                    why = why or self._sharing.conflict(
                        [planned.cdi], other_uid=other_uid, other=other
                    )
                    if why is not None:
                        raise PlanError(f"claim {plan.ref}: {why}")
            others = [(u, r) for u, r in checkpoint.claims.items() if u != uid]
            for planned in plan.devices:  # a shared device: the shares' amounts must fit
                device = self._inventory().get(planned.cdi.name)
                why = shares.capacity_problem(planned, others, device.capacity if device else {})
                if why is not None:
                    raise PlanError(f"claim {plan.ref}: {why}")
            return checkpoint.with_claim(uid, record)

        return mutate

    def _roll_back(
        self, uid: ClaimUID, devices: Sequence[cdi.ClaimDevice], *, recorded: bool
    ) -> None:
        """Undo a prepare that failed; ``recorded``: whether a record of it may be in the
        checkpoint."""
        try:
            cdi.remove_spec(self.settings.cdi_root, uid)
            device_metadata.remove(self.settings.state_dir, uid)
            try:
                self._sharing.undo(uid, devices, lambda: self._other_claims(uid))
            except SharingError as exc:  # the record goes anyway: the next start repairs
                log.error("rolling back claim %s: %s", uid, exc)
            if self._mig is not None:
                self._mig.release(uid)
            if recorded:
                # Not fsynced: undone by a power loss, the PrepareStarted record comes back and
                # the next start rolls it back again.
                self.store.update(lambda cp: cp.without_claim(uid), durable=False)
        except Exception:
            log.exception("rolling back claim %s failed; the next start cleans it up", uid)

    def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            with self._locks.hold(ref.uid):
                # The copy in memory answers for a claim this process prepared (the usual case)
                # without the file lock and a stat; only "not known" is checked on disk, since
                # another instance may have recorded it since.
                record = self.store.peek().claims.get(ref.uid) or self.store.load().claims.get(
                    ref.uid
                )
                known = record is not None
                cdi.remove_spec(self.settings.cdi_root, ref.uid)
                # Its files by name, from the record's requests (a record rebuilt from a CDI
                # spec names none: then they are looked for).
                named = [r for d in record.devices for r in d.request_names] if record else []
                device_metadata.remove(self.settings.state_dir, ref.uid, named or None)
                if self._mig is not None:
                    self._mig.release(ref.uid)  # before the record: a crash destroys again
                if not known:
                    return ""  # never prepared here, or already unprepared
                self._fault("unprepare-after-cdi-removed")
                self._undo_sharing(ref.uid)
                self.store.update(lambda cp: cp.without_claim(ref.uid), durable=True)
                self._fault("unprepare-after-checkpoint-removed")
                log.info("unprepared %s (%s)", ref, ref.uid)
                return ""
        except (SharingError, InstanceError) as exc:
            # The claim stays recorded, so the kubelet's retry undoes (destroys) it again.
            log.warning("unprepare %s (%s) failed: %s", ref, ref.uid, exc)
            return f"unprepare {ref}: {exc}"
        except Exception as exc:
            return self._unexpected("unprepare", ref, exc)

    def _undo_sharing(self, uid: ClaimUID) -> None:
        """Undo the claim's sharing settings; raises SharingError (the kubelet retries)."""
        if not self._sharing.active:
            return  # nothing was applied: no second checkpoint read (file lock) per unprepare
        record = self.store.load().claims.get(uid)
        if record is None:
            return  # unprepared by the other instance meanwhile (a rolling update)
        try:
            devices = records.claim_devices(record)
        except (records.RecordIncomplete, ConfigError):
            return  # an older plugin's (or a rebuilt) record: no settings were applied
        self._sharing.undo(uid, devices, lambda: self._other_claims(uid))

    def _other_claims(self, uid: ClaimUID) -> list[ClaimRecord]:
        return [r for u, r in self.store.load().claims.items() if u != uid]

    def _repair_sharing(self, checkpoint: Checkpoint) -> list[str]:
        """Make the GPUs and MPS daemons match the completed claims (``Sharing.repair``)."""
        if not self._sharing.active:
            return []
        completed = {}
        for uid, record in checkpoint.claims.items():
            if record.state != PREPARE_COMPLETED:
                continue
            try:
                completed[uid] = (record, records.claim_devices(record))
            except (records.RecordIncomplete, ConfigError):
                continue  # older or rebuilt-from-spec records carry no settings to keep
        gpus = [d.uuid for d in self._inventory().values() if d.type == "gpu" and d.uuid]
        return self._sharing.repair(completed, gpus)

    def _spec(
        self,
        uid: ClaimUID,
        ref: str,
        devices: Sequence[cdi.ClaimDevice],
        metadata: device_metadata.ClaimMetadata | None = None,
    ) -> dict[str, Any]:
        mounts = (
            {}
            if metadata is None
            else device_metadata.cdi_edits(
                metadata, driver=self.settings.driver_name, state_dir=self.settings.state_dir
            )
        )
        return cdi.build_spec(
            claim_uid=uid,
            claim_ref=ref,
            devices=devices,
            node=self._node(devices),
            device_edits=device_metadata.merge_edits(self._sharing.cdi_edits(uid, devices), mounts),
        )

    # --- device metadata (device_metadata: the files the claim's CDI spec mounts) ---------------

    @staticmethod
    def _metadata(plan: ClaimPlan, pod_claim: str | None) -> device_metadata.ClaimMetadata:
        return device_metadata.from_plan(plan, pod_claim=pod_claim)

    def _write_metadata(
        self, metadata: device_metadata.ClaimMetadata, inventory: Mapping[str, Device]
    ) -> None:
        device_metadata.write(
            metadata,
            driver=self.settings.driver_name,
            state_dir=self.settings.state_dir,
            inventory=inventory,
        )

    def _lacks_metadata(self, uid: ClaimUID, record: ClaimRecord) -> bool:
        meta = device_metadata.from_record(uid, record, pod_claim=None)
        return device_metadata.missing(meta, state_dir=self.settings.state_dir)

    def _recorded_metadata(
        self, uid: ClaimUID, record: ClaimRecord
    ) -> device_metadata.ClaimMetadata:
        """A recorded claim's metadata; the pod's name for the claim (its files' path) read from
        a file written earlier, else from the claim (a file lost before it reached the disk)."""
        found, pod_claim = device_metadata.recorded_pod_claim_name(self.settings.state_dir, uid)
        if not found and any(d.request_names for d in record.devices):
            try:
                claim = self._claims.get_claim(namespace=record.namespace, name=record.name)
            except Exception as exc:  # the API server down at start: the claims' path is used
                log.warning(
                    "device metadata of %s/%s (%s): claim not readable (%s); files rebuilt "
                    "under resourceclaims/",
                    record.namespace,
                    record.name,
                    uid,
                    exc,
                )
                claim = None
            if claim is not None and claim["metadata"].get("uid") == uid:
                pod_claim = device_metadata.pod_claim_name(claim["metadata"].get("annotations"))
        return device_metadata.from_record(uid, record, pod_claim=pod_claim)

    def _unexpected(self, what: str, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, CheckpointCorrupt):
            self._report("CheckpointCorrupt", str(exc))
            return f"{what} {ref}: {exc}; retry"
        if isinstance(exc, (CheckpointError, OSError)):
            log.error("%s %s (%s) failed: %s", what, ref, ref.uid, exc)
            return f"{what} {ref}: {exc}"
        log.exception("%s %s (%s) failed unexpectedly", what, ref, ref.uid)
        return f"{what} {ref}: internal error: {type(exc).__name__}: {exc}"

    @contextmanager
    def holding(self, uid: str) -> Iterator[None]:
        """The claim's lock, as its prepare and unprepare take it: the dynamic-MIG binder
        creates and destroys a claim's MIG devices under it (``plugin.mig_binding``)."""
        with self._locks.hold(uid):
            yield

    def completed(self) -> set[str]:
        """The UIDs of the claims prepared here (raises CheckpointError, OSError)."""
        claims = self.store.load().claims
        return {uid for uid, record in claims.items() if record.state == PREPARE_COMPLETED}

    def prepared_devices(self) -> set[str] | None:
        """This pool's devices in prepared claims; None when the checkpoint cannot be read."""
        try:
            checkpoint = self.store.load()
        except (CheckpointError, OSError) as exc:  # OSError: its lock not taken in time, too
            log.error("cannot tell which devices are in use: %s", exc)
            return None
        return {
            device.device
            for record in checkpoint.claims.values()
            for device in record.devices
            if device.pool == self.settings.node_name
        }

    # --- start --------------------------------------------------------------------------------

    def start(self) -> StartReport:
        """Restore after a restart or reboot (see the module docstring); never raises on state.

        The caller holds the node-wide call lock (a rolling update's other instance must not be
        in a call meanwhile). Raises CheckpointTooNew (a downgrade: touch nothing).
        """
        corrupt: str | None = None
        try:
            try:
                checkpoint = self.store.load()
            except CheckpointCorrupt as exc:
                corrupt = str(exc)
                self._report("CheckpointCorrupt", corrupt)
                checkpoint = self.store.load()
        except OSError as exc:
            # E.g. no space to save a corrupt file's records: recover nothing, touch nothing,
            # serve (each call reads again); the next start recovers.
            problem = (
                f"cannot read the checkpoint {self.store.path}: {exc}; serving without recovery"
            )
            self._report("CheckpointUnavailable", problem)
            return StartReport(problems=(problem,))
        uuids = self._created_uuids(checkpoint)
        checkpoint = _with_uuids(checkpoint, uuids)
        boot = self._boot_id()
        root = self.settings.cdi_root
        temp_files = (
            cdi.remove_temp_files(root)
            + self.store.remove_temp_files()
            + device_metadata.remove_temp_files(self.settings.state_dir)
        )
        started = [ClaimUID(u) for u, r in checkpoint.claims.items() if r.state == PREPARE_STARTED]
        for uid in started:
            cdi.remove_spec(root, uid)
        present = cdi.list_specs(root)
        rebooted = checkpoint.boot_id not in ("", boot)
        completed = {u for u, r in checkpoint.claims.items() if r.state == PREPARE_COMPLETED}
        for uid in device_metadata.claims_with_files(self.settings.state_dir) - completed:
            device_metadata.remove(self.settings.state_dir, uid)  # rolled back, or unprepared
        missing = {
            ClaimUID(u): r
            for u, r in checkpoint.claims.items()
            if r.state == PREPARE_COMPLETED
            and not r.from_spec  # its spec comes back with the kubelet's next prepare
            and (rebooted or u not in present or self._lacks_metadata(ClaimUID(u), r))
        }
        rewritten, problems = self._restore_specs(missing)
        found = self._adopt_specs(checkpoint).claims
        adopted = {u: r for u, r in found.items() if u not in checkpoint.claims}

        def settle(cp: Checkpoint) -> Checkpoint:
            cp = _with_uuids(cp, uuids)
            for uid in started:
                cp = cp.without_claim(uid)
            for u, record in adopted.items():
                if u not in cp.claims:
                    cp = cp.with_claim(u, record)
            return cp.with_boot_id(boot)

        settled = settle(checkpoint)
        try:
            settled = self.store.update(settle, durable=True)
        except OSError as exc:
            # A full state disk must not keep the plugin from serving (it would crash-loop):
            # claims already prepared are answered from the checkpoint as it is; calls that
            # write fail naming the error; the next start settles what this one could not.
            problem = (
                f"cannot write the checkpoint {self.store.path}: {exc}; serving on: prepared "
                "claims are answered, other prepares and unprepares fail until it can be written"
            )
            problems.append(problem)
            self._report("CheckpointWriteFailed", problem)
        problems += self._repair_sharing(settled)
        destroyed = self._destroy_unowned(settled, problems)
        report = StartReport(
            mig_destroyed=tuple(destroyed),
            rewritten=tuple(rewritten),
            rolled_back=tuple(started),
            adopted=tuple(ClaimUID(u) for u in adopted),
            temp_files_removed=temp_files,
            problems=tuple(problems),
            corrupt=corrupt,
        )
        log.info("restored state: %s", report)
        return report

    def _created_uuids(self, checkpoint: Checkpoint) -> dict[tuple[str, str], str]:
        """(claim UID, device) -> UUID of the MIG devices completed records lack: release 0.2.0
        recorded a created device's UUID as "" (its spec had it), so start fills it in."""
        if self._mig is None:
            return {}
        found: dict[tuple[str, str], str] = {}
        for uid, record in checkpoint.claims.items():
            for d in record.devices:
                if record.state == PREPARE_COMPLETED and d.uuid == "":
                    try:
                        uuid = self._mig.created_uuid(uid, d.device)
                    except InstanceError as exc:
                        log.warning("cannot read the MIG device of claim %s: %s", uid, exc)
                        continue
                    if uuid:
                        found[(uid, d.device)] = uuid
        return found

    def _destroy_unowned(self, checkpoint: Checkpoint, problems: list[str]) -> list[str]:
        """Dynamic MIG: destroy the driver's instances no completed claim owns (reported)."""
        if self._mig is None:
            return []
        completed = [u for u, r in checkpoint.claims.items() if r.state == PREPARE_COMPLETED]
        try:
            destroyed = self._mig.reconcile(completed)
        except InstanceError as exc:
            problem = f"cannot destroy MIG devices no claim owns: {exc}; tried again next start"
            self._report("MigDeviceCleanupFailed", problem)
            problems.append(problem)
            return []
        for message in destroyed:
            self._report("MigDeviceDestroyed", message)
        return destroyed

    def _adopt_specs(self, checkpoint: Checkpoint) -> Checkpoint:
        """``checkpoint`` plus a record rebuilt from each spec of ours it has none for.

        The store's ``rebuild`` for a corrupt checkpoint, and part of start-up recovery; a spec
        that cannot be read back is reported and left in place (its claim may be prepared).
        """
        for uid, path in cdi.list_specs(self.settings.cdi_root).items():
            if uid in checkpoint.claims:
                continue
            try:
                spec = json.loads(path.read_bytes())
                if not isinstance(spec, dict):
                    raise ValueError("not a JSON object")
                record = records.record_from_spec(uid, spec, pool=self.settings.node_name)
            except (OSError, ValueError) as exc:
                self._report(
                    "CDISpecUnreadable",
                    f"CDI spec {path} has no checkpoint record and cannot be read back ({exc}); "
                    "left in place",
                )
                continue
            log.warning(
                "claim %s/%s (%s) has a CDI spec but no checkpoint record: record rebuilt from %s",
                record.namespace,
                record.name,
                uid,
                path,
            )
            checkpoint = checkpoint.with_claim(uid, record)
        return checkpoint

    def _restore_specs(
        self, claims: Mapping[ClaimUID, ClaimRecord]
    ) -> tuple[list[ClaimUID], list[str]]:
        rewritten, problems = [], []
        for uid, record in claims.items():
            ref = f"{record.namespace}/{record.name}"
            try:
                devices = records.claim_devices(record)
                metadata = self._recorded_metadata(uid, record)
                spec = self._spec(uid, ref, devices, metadata)
                if device_metadata.missing(metadata, state_dir=self.settings.state_dir):
                    self._write_metadata(metadata, self._inventory())
                cdi.write_spec(self.settings.cdi_root, uid, spec)
                rewritten.append(uid)
            except (records.RecordIncomplete, ConfigError, cdi.CDIError, OSError) as exc:
                problem = f"cannot restore the CDI spec of claim {ref} ({uid}): {exc}"
                problems.append(problem)
                self._report("CDISpecRestoreFailed", problem)
        return rewritten, problems

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _partitions(plan: ClaimPlan, inventory: Mapping[str, Device]) -> bool:
    return any(
        (found := inventory.get(d.cdi.name)) is not None and found.partition is not None
        for d in plan.devices
    )


def _with_uuids(checkpoint: Checkpoint, uuids: Mapping[tuple[str, str], str]) -> Checkpoint:
    """``checkpoint`` with the devices of ``uuids`` given their UUID."""
    for uid in {u for u, _ in uuids}:
        record = checkpoint.claims.get(uid)
        if record is None:
            continue
        devices = tuple(
            d.model_copy(update={"uuid": uuids[(uid, d.device)]})
            if (uid, d.device) in uuids and d.uuid == ""
            else d
            for d in record.devices
        )
        checkpoint = checkpoint.with_claim(uid, record.model_copy(update={"devices": devices}))
    return checkpoint


def _with_instances(plan: ClaimPlan, inventory: Mapping[str, Device], mig: DynamicMig) -> ClaimPlan:
    """``plan`` with each dynamic MIG device created and its CDI facts filled in."""
    devices = []
    for planned in plan.devices:
        device = inventory[planned.cdi.name]
        if device.partition is not None:
            made = mig.ensure(plan.ref.uid, device)
            cdi_device = replace(planned.cdi, uuid=made.uuid, gi_id=made.gi_id, ci_id=made.ci_id)
            planned = replace(planned, cdi=cdi_device)
        devices.append(planned)
    return replace(plan, devices=tuple(devices))
