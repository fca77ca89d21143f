"""The prepare/unprepare transaction of the kubelet plugin.

Prepare, per claim (claims of one call are independent: each gets its own result or error):

1. A claim already ``PrepareCompleted`` in the checkpoint gets the recorded answer again
   (idempotent, and no API call, so a repeated prepare works while the API server is down).
2. Fetch the claim (:class:`ClaimFetcher`), plan it (:func:`plan.plan_claim`: UID, allocation,
   driver, pool, devices, config) and build its CDI spec: all pure, nothing written yet.
3. Write the CDI spec; record ``PrepareCompleted`` durably (refused, and the spec removed, if a
   device is held by another claim and not shared); answer.

Unprepare: remove the CDI spec, then drop the record durably. An unknown claim is success.

Crash safety follows from that order, checked on :meth:`DeviceState.start`:
a spec file of ours without a record is garbage of an interrupted prepare (the kubelet never
got an answer and retries) or unprepare, and is removed, except after a corrupt checkpoint, when
nothing is known and nothing is deleted; a ``PrepareStarted`` record (earlier releases wrote one
before the spec) is such an interrupted prepare too, and is rolled back (spec removed, record
dropped); a completed claim whose spec is missing (or any completed claim after a reboot, i.e. a
new boot ID, since /var/run is gone) gets its spec rebuilt from the record. A corrupt checkpoint
is reported (log and the injected ``report``, which the process main turns into a Node event)
and the plugin keeps serving.

Concurrency: calls run on gRPC worker threads. The same claim is serialized by a per-claim lock;
different claims run in parallel; the checkpoint's group commit makes the check for conflicting
devices and the record atomic, also against another plugin instance (rolling update). During a
rolling update each call also holds the node-wide call lock (``call_lock``) around steps 1 and 3;
the claims are read from the API before it is taken (the GET is read-only and every check on the
claim runs under the lock), so another instance waits for our locked work only, not for our API
round trips.

Fault injection for crash tests is a collaborator: ``fault(step)`` is called after each step in
:data:`FAULT_STEPS`; the process main injects one that SIGKILLs itself (``faults.from_env``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Final, Protocol

from dra_gpu.config import ConfigError
from dra_gpu.devices.model import Device
from dra_gpu.plugin import cdi, cdi_host, records
from dra_gpu.plugin.checkpoint import (
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    Checkpoint,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointStore,
    ClaimRecord,
    read_boot_id,
)
from dra_gpu.plugin.ids import ClaimUID
from dra_gpu.plugin.plan import ClaimPlan, ClaimRef, PlanError, plan_claim
from dra_gpu.plugin.records import PreparedDevice

log = logging.getLogger(__name__)

FAULT_STEPS: Final = (
    "after-cdi-written",
    "after-checkpoint-completed",
    "unprepare-after-cdi-removed",
    "unprepare-after-checkpoint-removed",
)


class ClaimFetcher(Protocol):
    def get_claim(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The ResourceClaim as API JSON, None if it does not exist; raises on other errors."""
        ...


Inventory = Callable[[], Mapping[str, Device]]
Fault = Callable[[str], None]
Report = Callable[[str, str], None]  # (reason, message): a warning about this node
CallLock = Callable[[], AbstractContextManager[object]]  # held around each call's transaction


def _no_fault(step: str) -> None:
    return None


def _log_report(reason: str, message: str) -> None:
    log.warning("%s: %s", reason, message)


@dataclass(frozen=True)
class StateSettings:
    driver_name: str
    node_name: str  # also the pool name
    cdi_root: Path
    state_dir: Path
    simulated: bool
    driver_root: Path = Path("/")
    proc_root: Path = Path("/proc")
    # The driver root as the container runtime sees it, when the plugin sees it elsewhere.
    host_driver_root: PurePosixPath | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class _Fetched:
    """A claim as read before the call lock: ``read`` False when the checkpoint already answered
    it; ``claim`` None when the API server does not have it; ``error`` when reading failed (it
    fails the claim only if the claim turns out to need the read)."""

    read: bool
    claim: Mapping[str, Any] | None = None
    error: Exception | None = None


@dataclass(frozen=True)
class StartReport:
    rewritten: tuple[ClaimUID, ...] = ()
    rolled_back: tuple[ClaimUID, ...] = ()
    orphans_removed: tuple[ClaimUID, ...] = ()
    problems: tuple[str, ...] = ()
    corrupt: str | None = None


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
        fault: Fault = _no_fault,
        report: Report = _log_report,
        boot_id: Callable[[], str] = read_boot_id,
        store: CheckpointStore | None = None,
        call_lock: CallLock = contextlib.nullcontext,
    ) -> None:
        self.settings = settings
        self._call_lock = call_lock
        self._inventory = inventory
        self._claims = claims
        self._fault = fault
        self._report = report
        self._boot_id = boot_id
        self.store = store or CheckpointStore(settings.state_dir)
        self._locks = _KeyedLocks()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="prepare")
        self._real_base: cdi.RealNode | None = None

    # --- the kubelet's calls ------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, PrepareResult]:
        uids = [r.uid for r in refs]
        fetched = dict(zip(uids, self._each(self._fetch, refs), strict=True))
        with self._call_lock():
            results = self._each(lambda r: self._prepare_one(r, fetched[r.uid]), refs)
        return dict(zip(uids, results, strict=True))

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, str]:
        """Per claim UID an error message, "" on success."""
        with self._call_lock():
            return dict(
                zip([r.uid for r in refs], self._each(self._unprepare_one, refs), strict=True)
            )

    def _each(self, fn: Callable[[ClaimRef], Any], refs: Sequence[ClaimRef]) -> list[Any]:
        if len(refs) <= 1:
            return [fn(r) for r in refs]
        return list(self._pool.map(fn, refs))

    def _fetch(self, ref: ClaimRef) -> _Fetched:
        """Read the claim unless the checkpoint answers it; needs no lock (reads only)."""
        try:
            record = self.store.load().claims.get(ref.uid)
            if record is not None and record.state == PREPARE_COMPLETED:
                return _Fetched(read=False)
            return _Fetched(read=True, claim=self._get(ref))
        except Exception as exc:  # raised by _prepare_locked when it needs the claim
            return _Fetched(read=True, error=exc)

    def _get(self, ref: ClaimRef) -> Mapping[str, Any] | None:
        return self._claims.get_claim(namespace=ref.namespace, name=ref.name)

    def _prepare_one(self, ref: ClaimRef, fetched: _Fetched) -> PrepareResult:
        try:
            with self._locks.hold(ref.uid):
                return PrepareResult(devices=self._prepare_locked(ref, fetched))
        except (PlanError, cdi.CDIError, ConfigError) as exc:
            log.info("prepare %s (%s) failed: %s", ref, ref.uid, exc)
            return PrepareResult(error=str(exc))
        except Exception as exc:
            return PrepareResult(error=self._unexpected("prepare", ref, exc))

    def _prepare_locked(self, ref: ClaimRef, fetched: _Fetched) -> tuple[PreparedDevice, ...]:
        record = self.store.load().claims.get(ref.uid)
        if record is not None and record.state == PREPARE_COMPLETED:
            if not cdi.spec_path(self.settings.cdi_root, ref.uid).exists():
                # Someone removed it since: the answer is only useful with the spec in place.
                _, problems = self._restore_specs({ref.uid: record})
                if problems:
                    raise cdi.CDIError(problems[0])
            return records.prepared_devices(record)
        if fetched.error is not None:
            raise fetched.error
        # Not read when it was prepared; unprepared since (by the other instance): read it now.
        claim = fetched.claim if fetched.read else self._get(ref)
        if claim is None:
            raise PlanError(f"claim {ref} not found in the API server")
        plan = plan_claim(
            ref,
            claim,
            driver=self.settings.driver_name,
            pool=self.settings.node_name,
            inventory=self._inventory(),
        )
        devices = [d.cdi for d in plan.devices]
        spec = cdi.build_spec(
            claim_uid=ref.uid, claim_ref=str(ref), devices=devices, node=self._node(devices)
        )
        completed = records.claim_record(plan, state=PREPARE_COMPLETED)
        try:
            cdi.write_spec(self.settings.cdi_root, ref.uid, spec)
            self._fault("after-cdi-written")
            self.store.update(self._record_completed(plan, completed), durable=True)
        except Exception:
            self._roll_back(ref.uid)
            raise
        self._fault("after-checkpoint-completed")
        log.info("prepared %s (%s): %s", ref, ref.uid, ", ".join(d.cdi.name for d in plan.devices))
        return records.prepared_devices(completed)

    def _record_completed(
        self, plan: ClaimPlan, record: ClaimRecord
    ) -> Callable[[Checkpoint], Checkpoint]:
        """The record, refused if a device is held by another claim and not shared."""
        uid = plan.ref.uid

        def mutate(checkpoint: Checkpoint) -> Checkpoint:
            for other_uid, other in checkpoint.claims.items():
                if other_uid == uid:
                    continue
                for planned in plan.devices:
                    why = records.conflicts(planned, other_uid=other_uid, other=other)
                    if why is not None:
                        raise PlanError(f"claim {plan.ref}: {why}")
            return checkpoint.with_claim(uid, record)

        return mutate

    def _roll_back(self, uid: ClaimUID) -> None:
        try:
            cdi.remove_spec(self.settings.cdi_root, uid)
            self.store.update(lambda cp: cp.without_claim(uid), durable=False)
        except Exception:
            log.exception("rolling back claim %s failed; the next start cleans it up", uid)

    def _unprepare_one(self, ref: ClaimRef) -> str:
        try:
            with self._locks.hold(ref.uid):
                known = ref.uid in self.store.load().claims
                cdi.remove_spec(self.settings.cdi_root, ref.uid)
                if not known:
                    return ""  # never prepared here, or already unprepared
                self._fault("unprepare-after-cdi-removed")
                self.store.update(lambda cp: cp.without_claim(ref.uid), durable=True)
                self._fault("unprepare-after-checkpoint-removed")
                log.info("unprepared %s (%s)", ref, ref.uid)
                return ""
        except Exception as exc:
            return self._unexpected("unprepare", ref, exc)

    def _unexpected(self, what: str, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, CheckpointCorrupt):
            self._report("CheckpointCorrupt", str(exc))
            return f"{what} {ref}: {exc}; retry"
        if isinstance(exc, (CheckpointError, OSError)):
            log.error("%s %s (%s) failed: %s", what, ref, ref.uid, exc)
            return f"{what} {ref}: {exc}"
        log.exception("%s %s (%s) failed unexpectedly", what, ref, ref.uid)
        return f"{what} {ref}: internal error: {type(exc).__name__}: {exc}"

    # --- node facts ---------------------------------------------------------------------------

    def _node(self, devices: Sequence[cdi.ClaimDevice]) -> cdi.Node:
        if self.settings.simulated:
            return cdi.SimulatedNode()
        s = self.settings
        if self._real_base is None:
            # Driver files and the device root do not change while the plugin runs.
            self._real_base = cdi_host.read_real_node(
                driver_root=s.driver_root, host_driver_root=s.host_driver_root
            )
        migs = [(d.minor, d.gi_id or 0, d.ci_id or 0) for d in devices if d.type == "mig"]
        if not migs:
            return self._real_base
        return replace(self._real_base, mig_caps=cdi_host.mig_caps(s.proc_root, migs))

    def prepared_devices(self) -> set[str] | None:
        """This pool's devices in prepared claims; None when the checkpoint cannot be read."""
        try:
            checkpoint = self.store.load()
        except CheckpointError as exc:
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
        """Restore after a restart or reboot (see the module docstring); never raises on state."""
        corrupt: str | None = None
        try:
            checkpoint = self.store.load()
        except CheckpointCorrupt as exc:
            corrupt = str(exc)
            self._report("CheckpointCorrupt", corrupt)
            checkpoint = self.store.load()
        boot = self._boot_id()
        root = self.settings.cdi_root
        cdi.remove_temp_files(root)
        present = cdi.list_specs(root)
        started = [ClaimUID(u) for u, r in checkpoint.claims.items() if r.state == PREPARE_STARTED]
        for uid in started:
            cdi.remove_spec(root, uid)
        rebooted = checkpoint.boot_id not in ("", boot)
        missing = {
            ClaimUID(u): r
            for u, r in checkpoint.claims.items()
            if r.state == PREPARE_COMPLETED and (rebooted or u not in present)
        }
        rewritten, problems = self._restore_specs(missing)
        orphans = [] if corrupt else [u for u in present if u not in checkpoint.claims]
        for uid in orphans:
            cdi.remove_spec(root, uid)

        def settle(cp: Checkpoint) -> Checkpoint:
            for uid in started:
                cp = cp.without_claim(uid)
            return cp.with_boot_id(boot)

        self.store.update(settle, durable=True)
        report = StartReport(
            rewritten=tuple(rewritten),
            rolled_back=tuple(started),
            orphans_removed=tuple(orphans),
            problems=tuple(problems),
            corrupt=corrupt,
        )
        log.info("restored state: %s", report)
        return report

    def _restore_specs(
        self, claims: Mapping[ClaimUID, ClaimRecord]
    ) -> tuple[list[ClaimUID], list[str]]:
        rewritten, problems = [], []
        for uid, record in claims.items():
            ref = f"{record.namespace}/{record.name}"
            try:
                devices = records.claim_devices(record)
                node = self._node(devices)
                spec = cdi.build_spec(claim_uid=uid, claim_ref=ref, devices=devices, node=node)
                cdi.write_spec(self.settings.cdi_root, uid, spec)
                rewritten.append(uid)
            except (records.RecordIncomplete, ConfigError, cdi.CDIError, OSError) as exc:
                problem = f"cannot restore the CDI spec of claim {ref} ({uid}): {exc}"
                problems.append(problem)
                self._report("CDISpecRestoreFailed", problem)
        return rewritten, problems

    def close(self) -> None:
        self._pool.shutdown(wait=True)
