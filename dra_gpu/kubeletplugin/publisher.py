"""Keeps the node's ResourceSlices equal to the inventory, through API errors and outages.

Design:
- Two threads. The reconcile loop lists this node's slices, asks ``slice_plan.plan`` what to
  write, and writes it. The watch loop only wakes the reconcile loop: any event on our slices
  (someone deleted one; the kubelet wiped them at its start), and every (re)connection of the
  watch, which after an API server outage is the moment to look again.
- The echo of our own writes wakes nobody: each create and update records the resourceVersion
  the API server gave the slice, and the watch event carrying that version is dropped. Without
  this, every write cost one more list of the node's slices (a pool of five slices: six lists
  where one is enough, each one the whole pool). An echo that arrives before its write returned
  still wakes the loop, which then finds nothing to do; the record is cleared at the start of
  every pass, so it holds at most one pass's writes.
- The reconcile loop also runs after ``set_inventory`` (new devices) and every ``resync_s``.
- Failures never end a loop: temporary ones (no answer, 5xx) back off exponentially up to
  ``max_backoff_s``; a conflict or a missing object means "look again" after a short pause.
  Every pause is drawn at random below its ceiling (``draw``): when the API server fails all
  nodes at once (an overload, a restart), retries with the same deterministic delays would
  arrive together, in waves as large as the fleet, and overload it again. The cap is tens of
  seconds for the same reason: a fleet that keeps retrying every few seconds is itself the load.
  An outage is logged once when it starts and once when it ends, not on every attempt.
- ``synced`` turns true after the first successful reconcile and stays true, so a liveness
  probe on it does not restart the plugin while the API server is away; ``on_synced`` is
  called (on the reconcile thread) when it turns true.
- In a rolling update the older instance stands by while a newer one's slices exist (see
  ``slice_plan``): standing by is a successful reconcile that writes nothing.

The store (``SliceStore``) is the only I/O; it is bound to one node and driver.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from dra_gpu.kube import errors
from dra_gpu.kube.objects import ResourceSlice
from dra_gpu.kubeletplugin import slice_plan

log = logging.getLogger(__name__)

JSON = dict[str, Any]
# Node UID -> slice bodies owned by the Node (pool fields are filled in by the planner).
Renderer = Callable[[str], Sequence[JSON]]


class SliceStore(Protocol):
    """The API calls the publisher needs, for one node and driver. Raises ``kube.errors`` types."""

    def node_uid(self) -> str: ...

    def list_slices(self) -> list[ResourceSlice]: ...

    def create_slice(self, body: JSON) -> str:
        """Create; returns the resourceVersion of the stored slice."""
        ...

    def update_slice(self, body: JSON) -> str:
        """Replace; returns the resourceVersion of the stored slice."""
        ...

    def delete_slice(self, name: str, *, uid: str) -> None: ...

    def watch_slices(self, stop: threading.Event) -> Iterator[str]:
        """Yield, per event, the resourceVersion of the slice it carries, until the stream
        ends; returns at once when ``stop`` is set."""
        ...


BASE_BACKOFF_S = 0.2
MAX_BACKOFF_S = 30.0


def backoff_delay(
    failures: int, draw: float, *, base_s: float = BASE_BACKOFF_S, max_s: float = MAX_BACKOFF_S
) -> float:
    """Exponential backoff with full jitter: the ceiling doubles per failure (0.2, 0.4, 0.8 …
    seconds, capped at ``max_s``) and the delay is ``draw`` (0..1, at random) of the way from
    ``base_s`` to it, so that nodes failing together spread their retries over the ceiling."""
    ceiling = min(max_s, base_s * 2 ** max(0, failures - 1))
    low = min(base_s, ceiling)
    return float(low + min(max(draw, 0.0), 1.0) * (ceiling - low))


class Publisher:
    def __init__(
        self,
        *,
        store: SliceStore,
        node: str,
        driver: str,
        render: Renderer,
        resync_s: float = 60.0,
        max_backoff_s: float = MAX_BACKOFF_S,
        instance: slice_plan.Instance | None = None,
        alive: Callable[[slice_plan.Instance], bool],
        on_synced: Callable[[], None] = lambda: None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        """``draw``: the random source of the backoff's jitter (uniform in 0..1)."""
        self._store = store
        self._node = node
        self._driver = driver
        self._render = render
        self._resync_s = resync_s
        self._max_backoff_s = max_backoff_s
        self._draw = draw
        self._wake = threading.Event()
        self._lock = threading.Lock()  # guards _render and _own_writes
        self._own_writes: set[str] = set()  # resourceVersions of our writes not yet echoed
        self._generation = 0
        self._synced = threading.Event()
        self._outage = False
        self._instance = instance
        self._alive = alive
        self._on_synced = on_synced
        self._standby_for: slice_plan.Instance | None = None

    @property
    def synced(self) -> bool:
        """True once the slices were published at least once."""
        return self._synced.is_set()

    @property
    def api_outage(self) -> bool:
        """True while the API server has not answered since the last failure."""
        return self._outage

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def set_inventory(self, render: Renderer) -> None:
        """Publish slices from a new inventory (a new generation when the content changed)."""
        with self._lock:
            self._render = render
        self._wake.set()

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self.run, args=(stop,), name="publisher", daemon=True),
            threading.Thread(target=self.run_watch, args=(stop,), name="slice-watch", daemon=True),
        ]
        for thread in threads:
            thread.start()
        return threads

    def _backoff(self, failures: int, *, max_s: float | None = None) -> float:
        cap = self._max_backoff_s if max_s is None else min(max_s, self._max_backoff_s)
        return backoff_delay(failures, self._draw(), max_s=cap)

    def reconcile_once(self) -> slice_plan.Plan:
        """One pass: list, plan, write. Raises ``errors.ApiError`` on failure."""
        with self._lock:
            render = self._render
            # Echoes of an earlier pass still to come wake this loop once more: harmless, and
            # the record never holds more than one pass's writes.
            self._own_writes.clear()
        desired = render(self._store.node_uid())
        existing = self._store.list_slices()
        plan = slice_plan.plan(
            desired=desired,
            existing=existing,
            node=self._node,
            driver=self._driver,
            last_generation=self._generation,
            instance=self._instance,
            alive=self._alive,
        )
        if plan.standby_for != self._standby_for:
            if plan.standby_for is not None:
                log.info(
                    "pool %s is published by instance %s, started after this one; standing by",
                    self._node,
                    plan.standby_for,
                )
            else:
                log.info("pool %s: no newer instance publishes it; publishing", self._node)
            self._standby_for = plan.standby_for
        for body in plan.creates:
            self._note_own(self._store.create_slice(body))
        for body in plan.updates:
            self._note_own(self._store.update_slice(body))
        for gone in plan.deletes:
            with contextlib.suppress(errors.NotFound):  # already gone: what we wanted
                self._store.delete_slice(gone.name, uid=gone.uid)
        self._generation = plan.generation
        if not plan.is_empty:
            log.info(
                "published pool %s generation %d: %d created, %d updated, %d deleted",
                self._node,
                plan.generation,
                len(plan.creates),
                len(plan.updates),
                len(plan.deletes),
            )
        return plan

    def _note_own(self, resource_version: str) -> None:
        if resource_version:  # an event without a version must never pass for an echo
            with self._lock:
                self._own_writes.add(resource_version)

    def _is_echo(self, resource_version: str) -> bool:
        """Whether a watch event carries a write of ours (each is recognized once)."""
        with self._lock:
            if resource_version in self._own_writes:
                self._own_writes.discard(resource_version)
                return True
            return False

    def run(self, stop: threading.Event) -> None:
        """Reconcile loop; returns when ``stop`` is set."""
        failures = 0
        while not stop.is_set():
            self._wake.clear()
            try:
                self.reconcile_once()
            except (errors.Conflict, errors.NotFound) as err:
                # Someone else wrote in between, or the Node is not there yet: look again soon.
                failures += 1
                log.info("reconcile of pool %s must look again: %s", self._node, err)
                stop.wait(self._backoff(failures, max_s=1.0))
                continue
            except errors.ApiError as err:
                failures += 1
                self._note_failure(err, failures)
                stop.wait(self._backoff(failures))
                continue
            except Exception:
                # A bug or bad inventory data must not end publishing for good.
                failures += 1
                log.exception("reconcile of pool %s failed", self._node)
                stop.wait(self._backoff(failures))
                continue
            if self._outage:
                log.warning("API server reachable again; pool %s is up to date", self._node)
                self._outage = False
            failures = 0
            if not self._synced.is_set():
                self._synced.set()
                self._on_synced()
            self._wait_for_work(stop)

    def _wait_for_work(self, stop: threading.Event) -> None:
        # Wake on stop as well: poll stop in short slices while waiting for the wake event.
        waited = 0.0
        while not stop.is_set() and waited < self._resync_s:
            if self._wake.wait(0.5):
                stop.wait(0.05)  # coalesce a burst of watch events into one reconcile
                return
            waited += 0.5

    def _note_failure(self, err: errors.ApiError, failures: int) -> None:
        if isinstance(err, errors.ApiUnavailable):
            if not self._outage:
                log.warning("API server unavailable, publishing retries with backoff: %s", err)
                self._outage = True
            else:
                log.debug("API server still unavailable (attempt %d): %s", failures, err)
        else:
            log.error("publishing ResourceSlices of pool %s failed: %s", self._node, err)

    def run_watch(self, stop: threading.Event) -> None:
        """Watch loop: wake the reconcile loop on events and on every (re)connection."""
        failures = 0
        while not stop.is_set():
            try:
                for resource_version in self._store.watch_slices(stop):
                    failures = 0
                    if not self._is_echo(resource_version):
                        self._wake.set()
            except errors.ApiError as err:
                failures += 1
                log.debug("watch of ResourceSlices ended: %s", err)
            except Exception:
                failures += 1
                log.exception("watch of ResourceSlices failed")
            if stop.is_set():
                return
            self._wake.set()
            stop.wait(self._backoff(max(failures, 1)))
